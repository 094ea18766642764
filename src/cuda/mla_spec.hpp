// MLA sparse decode kernel specializations: the small value type the JIT compiles, caches and
// names. One key per kernel of a run (scheduler, decode, combine) and the generic combine op.
#pragma once

#include <string>

#include "deca/mla.hpp"
#include "jit/spec.hpp"

namespace deca::cuda {

enum class MlaKernelRole { kSchedule, kDecode, kCombine, kGenericCombine };

// The sm90 warp-specialized decode kernel (kernels/mla/sm90/, written alongside this backend).
// Flip to true once kernels/mla/sm90/entry.cuh and traits.cuh are in the tree: every sm_90 plan
// then runs it unless DECA_MLA_KERNEL=portable.
inline constexpr bool kMlaSm90KernelEnabled = true;
// The sm90 decode kernel's tuning knobs: one Cfg field each (kernels/mla/sm90/knobs.cuh says
// what each does; docs/perf-notes-mla.md has their timings), the defaults a plan compiles, and
// the DECA_MLA_* environment variable that overrides each (a tuning aid; the name shows it).
struct MlaSm90Knobs {
  int cluster = 1;   // Cfg::kCluster, DECA_MLA_CLUSTER: 2 pairs the two head blocks of 65..128 heads
  int pipe = 2;      // Cfg::kPipe, DECA_MLA_PIPE 0..4: the producer's pipelining (a plan's: mla_sm90_defaults)
  int dequant = 0;   // Cfg::kDequant, DECA_MLA_DEQUANT: 1 integer e4m3 placement (pipe 3), 2 f16 -> f32 on mma
  int sync = 1;      // Cfg::kSync, DECA_MLA_SYNC: 1 light cluster hand-overs (240 vs 258 us, b128 h128)
  int prefetch = 0;  // Cfg::kPrefetch, DECA_MLA_PREFETCH 0..3: lines, bulk record, none, sectors
  int ahead = 2;     // Cfg::kAhead, DECA_MLA_AHEAD 1..8: blocks between prefetch and gather (mla_sm90_defaults)
  int map = 0;       // Cfg::kMap, DECA_MLA_MAP: 1 a token per four producer lanes (slower), 2 the unit
                     // split with lane pairs completing 32-byte sectors (the peer's st.async)
  int l1 = 0;        // Cfg::kL1, DECA_MLA_L1: 1 the gather loads L1::evict_last (mla_sm90_defaults
                     // without a cluster)
  int rescale = 2;   // Cfg::kRescale, DECA_MLA_RESCALE 0..2: O rescaled every block / skipped at 1 / lazy maxima
                     // (2e5d498, H200: b128 h64 134.1 -> 131.1 us, b128 h16 126.4 -> 123.2, b128 h128 225.2 -> 225.8)
  int phand = 0;     // Cfg::kPHand, DECA_MLA_PHAND: 1 consumer 1 takes P into registers (no proxy fence;
                     // mla_sm90_defaults in a cluster),
                     // 2 consumer 0 hands P over after issuing its own P V (mla_sm90_defaults),
                     // 3 consumer 0 issues the next block's QK^T right behind its P V (P V from shared memory)
  int producers = 1; // Cfg::kProducers, DECA_MLA_PRODUCERS: 2 producer warpgroups (512 threads)
  int peer_copy = 0; // Cfg::kPeerCopy, DECA_MLA_PEERCOPY: 1 the peer's rows by the bulk-copy unit (cluster)
  int seesaw = 0;    // Cfg::kSeesaw, DECA_MLA_SEESAW 0..2: the consumers take alternate blocks (QK^T and
                     // softmax each; two producers in a cluster, pipes 1 and 2), 1 S first, 2 the
                     // other's block first (both slower with two K tiles)
  int stage = 0;     // Cfg::kStage, DECA_MLA_STAGE: 1 the records staged in the Q tile by bulk copies (<= 16 heads,
                     // two producers' whole shares in rows, no cluster)
  int narrow = 0;    // Cfg::kNarrow, DECA_MLA_NARROW: 1 S^T = K Q^T with the heads on N = 16 (<= 16 heads, no cluster)
  int direct = 0;    // Cfg::kDirect, DECA_MLA_DIRECT 0..3: no bf16 tile, the records multiplied from registers out of
                     // a ring of four slots (<= 16 heads, no cluster; direct.cuh): 1 bulk copies, lockstep
                     // consumers; 2 16-byte copies, lockstep; 3 16-byte copies, alternating consumers (the plan's)
  int stamp = 0;     // Cfg::kStamp, DECA_MLA_STAMP: 1 cycle stamps per phase printed by the first CTAs, 2 the launch timeline (timing aids)
};

// The knobs a key may hold: what was asked, made consistent for `num_heads` (a pure function,
// table-tested): a cluster only for 65..128 heads, the light hand-overs and the pair exchange
// (map 2) only in a cluster, the whole-row pieces (map 3) not with the mma conversion (asked
// for, it keeps the unit split) and, without a cluster, not with one producer's pipes 2 and 3,
// the integer dequantization only with one producer's pipe 3 or two producers' pipe 2, the
// peer's rows by bulk copies only in a cluster with pipes 1-3, the mma one with pipes 2-4, the unit split and a
// cluster, the base producer (pipe 0) with its fixed prefetch distance and the unit split, the
// round stream (pipe 4) with the unit split, P in consumer 1's registers with pipes 0-2, the
// hand-over after P V with any producer but pipe 2 without a cluster, the next block's QK^T
// behind P V with any producer but pipes 2 and 3 without a cluster; two producer warpgroups
// with pipes 1-4, the unit split or the rows, not the mma conversion, and P from shared memory
// in consumer 1 (asked with pipe 0, they take pipe 1); the seesaw consumers with two producers
// in a cluster, pipes 1 and 2 (kPHand then left at its neutral value).
MlaSm90Knobs mla_sm90_consistent(MlaSm90Knobs k, int num_heads);

// The knobs a plan compiles by default for a cluster size (a pure function, table-tested), from
// side-by-side rounds on the H200 (whole op, cold L2, median of 20, us):
// - without a cluster (1..64 heads, the producer bounds the block): two producer warpgroups with
//   the ids a block ahead (pipe 1) and the L2 prefetch one block ahead (a529452: b128 h64 128.9 ->
//   125.0, b64 h64 80.8 -> 77.6, b128 h16 119.6 -> 114.9 against one producer's round stream; two
//   blocks ahead 128.0 / 79.2 / 118.1, three 128.8 / 79.5 / 119.5), P handed over after consumer
//   0's own P V (phand 2; 294d750: 130.8 -> 128.3, 82.6 -> 80.7, 123.4 -> 120.4);
// - in a cluster of 2 (65..128 heads): pipe 2 (the round stream is slower there:
//   b128 h128 230.0 -> 235.9 at d7f19e0; two producers 222.0 -> 231.6 at a529452) and the L2
//   prefetch one block ahead (294d750: b128 h128 227.5 -> 222.4, b64 h128 118.9 -> 117.0; phand 2
//   gains nothing there, 227.9), and the whole-row pieces (map 3: the stores into the peer's
//   tile as whole 128-byte rows; 93952a7: b128 h128 222.7 -> 186.3, b64 h128 117.4 -> 98.8, the
//   pair exchange 197.0 / 104.8), with two producer warpgroups (47a14c6: 186.6 -> 184.4, 99.0 ->
//   97.5; q_len 2 361.6 -> 357.0, topk 16384 1430.7 -> 1413.7);
// - the whole-row pieces without a cluster too (half the unit split's shared-store wavefronts;
//   5d7c91b: b128 h64 125.0 -> 116.4, b64 h64 77.5 -> 72.3, b128 h16 116.6 -> 108.1, q_len 2
//   b128 h64 234.4 -> 220.5);
// - without a cluster, each producer's whole share in one round (pipe 2, 80 registers each;
//   4b6fde9: b128 h64 117.1 -> 110.6, b64 h64 72.5 -> 69.2, b128 h16 107.7 -> 100.7; pipe 3, the
//   loads before the tile is free, 131.4 / 79.8, and 122.3 at b128 h16 two blocks ahead) and the
//   gather's loads allocating in L1 (159427c: 110.9 -> 107.9, 69.6 -> 68.1, 101.0 -> 98.2; in a
//   cluster no change, 185.0 / 185.3).
// - at 16 heads or fewer (one head block, no cluster): the consumers with the heads on N (S^T =
//   K Q^T and, since 3d7c2ea, O^T = V^T P^T, N = 16) and the records staged in the Q tile's free
//   rows by bulk copies (884a2a3, S^T alone on N: b128 h16 91.7 -> 86.2 us with the first, 80.5
//   with both; the staging alone 93.0, 283de43; 3d7c2ea with P V on N too: 77.1).
// - since 9fd4818 at 16 heads or fewer the kernel without the bf16 tile (direct.cuh, kDirect 3:
//   16-byte copies into a ring of four record slots, alternating consumers; e52207b: b128 h16
//   77.1 -> 58.6 us; bulk copies and lockstep consumers 92.7, 16-byte copies in lockstep 70.7;
//   15f1f30 with S^T on the f16 tensor cores for the LSE's precision: 59.9); every other knob
//   neutral there.
// Every other field keeps MlaSm90Knobs' default; `cluster` is as given.
MlaSm90Knobs mla_sm90_defaults(int cluster, int num_heads = 64);

// The defaults for `num_heads` (traits' kClusterX) with every DECA_MLA_* variable that holds a
// value in its range applied, made consistent.
MlaSm90Knobs mla_sm90_knobs_from_env(int num_heads);

struct MlaKernelKey {
  int arch = 90;                       // compute capability, 90 = sm_90a
  MlaKernelRole role = MlaKernelRole::kDecode;
  std::string variant = "portable";    // decode only: "portable" (sm_80+) or "sm90"
  int page_size = 0;                   // sm90 decode only: compiled in (Cfg::kPageSize)
  MlaSm90Knobs sm90;                   // sm90 decode only: the tuning knobs (Cfg fields)
  bool checked = false;                // portable decode only: MlaConfig::checked, "_chk"
  // Decode only: dense decode (the block table as token source, "mla_dense_decode_...") and the
  // cache's records (MlaKvFormat, kernels/mla/params.cuh; named for dense: "_bf16", "_fp8_e4m3",
  // "_fp8_sparse"). Sparse decode reads kMlaKvFP8Sparse.
  bool dense = false;
  int kv_format = 2;  // kMlaKvFP8Sparse

  // e.g. "mla_sparse_decode_portable_sm90", "mla_dense_decode_portable_bf16_chk_sm80",
  // "mla_sparse_combine_sm90", "combine_sm80"
  std::string name() const;
  // "// <name>" + the prologue (the sm90 kernel's Cfg; the portable dense kernel's Cfg::kChecked
  // and kKvFormat) + #include of the role's entry header.
  jit::JitSpec spec() const;
};

// The decode variant a plan runs on a device of compute capability `arch`: "sm90" when the
// sm90 kernel is enabled, arch == 90 and DECA_MLA_KERNEL is not "portable"; else "portable".
std::string mla_decode_variant(int arch);

// Launch shape of a decode kernel.
struct MlaDecodeShape {
  int threads = 0;
  int smem_bytes = 0;
  int cluster_x = 1;  // CTAs of a cluster along x (1: no cluster attribute)
};
// The decode key's: the sm90 kernel's threads from its producer warpgroups and its cluster from
// its knobs, the portable kernel's fixed.
MlaDecodeShape mla_decode_shape(const MlaKernelKey& key);

// The MlaKvFormat (kernels/mla/params.cuh) a plan of `config` reads: config.kv_format, with
// kDefault read as bf16 for dense decode and the 656-byte FP8 token for sparse decode.
int mla_kv_format(const MlaConfig& config);

// Whether the sm90 kernel decodes a dense cache of format `kv_format` (MlaKvFormat). False for
// every format until its dense device code is in: dense plans then run the portable kernel on
// every architecture. The one switch that sends them to the sm90 kernel on sm_90.
bool mla_dense_sm90_supported(int kv_format);

// The decode variant of a plan: a checked plan runs the portable kernel (the sm90 one has no
// checked variant yet), so does a dense plan whose format the sm90 kernel does not decode
// (mla_dense_sm90_supported); others mla_decode_variant(arch).
std::string mla_plan_variant(int arch, const MlaConfig& config);

// The decode key a plan of `config` runs with `variant` on compute capability `arch`: its token
// source and format (dense, mla_kv_format); the sm90 kernel compiles the page size in and
// mla_sm90_knobs_from_env(config.num_heads).
MlaKernelKey mla_decode_key(int arch, const std::string& variant, const MlaConfig& config);

}  // namespace deca::cuda
