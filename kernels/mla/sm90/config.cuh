// The compile-time configuration of the sm90a MLA sparse decode kernels, read from the Cfg struct
// the JIT prologue defines (src/cuda/mla_spec.cpp renders it from mla::sm90::kernel_class):
//   struct Cfg {
//     static constexpr int kPageSize = 64;  // tokens per cache block: id / kPageSize, id % kPageSize
//     static constexpr int kDirect = 0;     // 1: at most 16 heads, the kernel without the bf16 tile
//     static constexpr int kCluster = 1;    // the wide kernel: 2 for 65..128 heads (two head blocks)
//     static constexpr int kDense = 0;      // optional: 1 reads the tokens through the block table
//     static constexpr int kKvFormat = 2;   // optional (MlaKvFormat): dense caches may be bf16 or e4m3,
//                                           // sparse ones MODEL1's 584-byte token (kMlaKvModel1)
//     static constexpr int kExtraPageSize = 64;  // MODEL1 only: the extra cache's page size
//     static constexpr bool kChecked = true;     // optional: checked mode (checked.cuh)
//     static constexpr int kTma = 1;             // optional: dense bf16 rows by TMA (rows.cuh)
//   };
// Everything else the kernels do is fixed per class (below, with why); tests may add kAblate.
// Host code reads it too (the Ablate values).
#pragma once

#include "kernels/common/cfg_field.cuh"
#include "kernels/mla/params.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::mla::sm90 {

// CTAs per cluster (traits.cuh kClusterX): 2 pairs the two head blocks of 65..128 heads.
DECA_CFG_FIELD(ClusterOf, kCluster, 1)
// 1: the kernel without the bf16 tile (direct.cuh), one head block of at most 16 heads.
DECA_CFG_FIELD(DirectOf, kDirect, 0)
template <class Cfg>
inline constexpr bool kDirect = DirectOf<Cfg>::value == 1;

// Dense decode (kernels/mla/schedule/work.cuh, DenseSource): token j of a request is slot
// j % kPageSize of block block_table[r][j / kPageSize], visible to query token i iff
// j < len - (q_len - 1 - i). The cache's format: the 656-byte token (the sparse one, read by the
// records' producer) or whole rows of bf16 / e4m3 (rows.cuh; the wide kernel only).
DECA_CFG_FIELD(DenseOf, kDense, 0)
DECA_CFG_FIELD(KvFormatOf, kKvFormat, static_cast<int>(kMlaKvFP8Sparse))
template <class Cfg>
inline constexpr bool kDense = DenseOf<Cfg>::value == 1;
template <class Cfg>
inline constexpr bool kRowFormat =
    KvFormatOf<Cfg>::value == kMlaKvBF16 || KvFormatOf<Cfg>::value == kMlaKvFP8E4M3;

// Dense bf16 rows by TMA (rows.cuh issue_rows_tma, zero_invalid_rows): in a cluster of 2 each
// CTA's copy unit multicasts half of a block's nine 64-dim chunks into both CTAs' tiles, so that
// no producer thread moves a row through its registers. Set by the plan (src/cuda/mla_tma.hpp
// says for which shapes); the kernels without it keep the register producers, source and
// machine code.
DECA_CFG_FIELD(TmaOf, kTma, 0)
template <class Cfg>
inline constexpr bool kTmaRows = TmaOf<Cfg>::value == 1;

// MODEL1 (kMlaKvModel1, sparse): the 584-byte token of two caches, the first cache's blocks of a
// request then the extra cache's (walk.cuh). The wide kernel's MODEL1 producer (model1.cuh)
// dequantizes it into the tile's chunks 0..7 (448 NoPE + 64 RoPE: the 512 dims of K and V), QK^T
// runs over those 8 chunks, P V as for V3.2; the direct kernel (Cfg::kDirect) copies the records
// into its ring and multiplies them as stored (direct_model1.cuh). The extra cache's page size
// is compiled in as the first cache's is.
template <class Cfg>
inline constexpr bool kModel1 = KvFormatOf<Cfg>::value == kMlaKvModel1;
DECA_CFG_FIELD(ExtraPageOf, kExtraPageSize, 1)

// Checked mode (checked.cuh): the ids, lengths and schedule the kernel reads are range-tested and
// the first offender recorded (kernels/common/check_record.cuh), as the portable checked kernel
// does. Written into the prologue only for checked plans, so the other kernels' source and
// machine code stay what they were.
DECA_CFG_FIELD(CheckedOf, kChecked, false)
template <class Cfg>
inline constexpr bool kChecked = CheckedOf<Cfg>::value;

// Timing only (tests/gpu/mla_sm90_timing_test.cpp sets it; no plan does, and the numbers are
// wrong): builds that leave one stage out, so that a GPU round says what bounds the kernel.
// Without the tensor-core products (their operands are still loaded); without the gather's
// memory traffic (each record load returns finite bytes made from its address, the L2 prefetch
// and the ring copies are left out; ids, Q and the outputs still go to memory); the consumers
// alone (the wide kernel: the producers gather nothing, the consumers never wait for a tile and
// compute on zeroed tiles and ids); the producers alone (the consumers release every tile or
// slot as soon as it is full, and write nothing).
enum Ablate : int {
  kAblateNone = 0,
  kAblateNoMma = 1,
  kAblateNoGather = 2,
  kAblateConsumersOnly = 3,
  kAblateProducersOnly = 4,
};
DECA_CFG_FIELD(AblateOf, kAblate, static_cast<int>(kAblateNone))
template <class Cfg>
inline constexpr bool kNoMma = AblateOf<Cfg>::value == kAblateNoMma;
template <class Cfg>
inline constexpr bool kNoGather = AblateOf<Cfg>::value == kAblateNoGather;
template <class Cfg>
inline constexpr bool kNoProduce = AblateOf<Cfg>::value == kAblateConsumersOnly;
template <class Cfg>
inline constexpr bool kNoConsume = AblateOf<Cfg>::value == kAblateProducersOnly;


// ---- The wide kernel's fixed choices that differ with the cluster ------------------------------
// (docs/perf-notes-mla.md has the rounds that chose them and the variants they beat.)

// The gather's L1 policy: L1::evict_last without a cluster (the whole-row pieces read each record
// line, and its scales, in several instructions: measured faster), L1::no_allocate in one (no
// change there, and each CTA reads a token once).
template <class Cfg>
inline constexpr bool kL1EvictLast = ClusterOf<Cfg>::value == 1;

// How consumer 1 takes P. In a cluster (its producers fit in 56 registers, so consumer 1 can hold
// P's 16 A-fragment registers beside O): it loads P with ld.shared from where consumer 0 stored it
// (the same fragment layout) and runs P V from registers, so the hand-over is an mbarrier release
// / acquire without a proxy fence, and P's slot is free as soon as the loads complete. Without a
// cluster (producers at 80 registers: consumer 1 has no room): P V reads P from shared memory
// through the async proxy, so consumer 0 fences (fence.proxy.async) before handing it over, and
// issues its own P V (A from registers) first, so that the hand-over runs while it executes.
template <class Cfg>
inline constexpr bool kPInRegs = ClusterOf<Cfg>::value == 2;

}  // namespace deca::mla::sm90
