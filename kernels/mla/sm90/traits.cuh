// Launch facts and the shared-memory plan of the sm90a MLA sparse FP8 decode kernels (decode.cuh,
// direct.cuh), and which of them a head count runs (kernel_class). Host and device code read the
// same constexpr lines: the backend launches threads_of(direct) threads with kSmemBytes of dynamic
// shared memory and clusters of kClusterX(num_heads) CTAs along x.
#pragma once

#ifndef DECA_HD
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_HD __host__ __device__
#else
#define DECA_HD
#endif
#endif

namespace deca::mla::sm90 {

// The wide kernel (decode.cuh): four warpgroups, consumers 0 and 1 and two producers; the
// direct kernel (direct.cuh): three, its consumers and one producer warpgroup.
constexpr int kThreadsWide = 512;
constexpr int kThreadsDirect = 384;
DECA_HD constexpr int threads_of(int direct) { return direct ? kThreadsDirect : kThreadsWide; }
// Registers per thread at launch (one CTA per SM, 65536 in all; setmaxnreg takes multiples of 8).
DECA_HD constexpr int launch_regs(int threads) { return 65536 / threads / 8 * 8; }
constexpr int kHeadsPerCta = 64;  // the M of every wgmma; num_heads is padded to it inside
constexpr int kTokens = 64;       // tokens per pipeline block (= kTopkBlock of kernels/mla/schedule/work.cuh)
constexpr int kDimQK = 576;
constexpr int kDimV = 512;
constexpr int kDimNope = 512;
constexpr int kTokenBytes = 656;  // 512 e4m3, 4 fp32 scales, 64 bf16 RoPE
constexpr int kStages = 2;        // K/V tiles in flight between the producers and the consumers

// The wide kernel's register budgets after setmaxnreg (multiples of 8; they sum to at most what
// 512 threads get at launch, 4 x 128). Consumer 0 holds S (32), P (16) and half of O (128);
// consumer 1 half of O, and in a cluster P's 16 A-fragment registers too (config.cuh kPInRegs:
// at 160 and 168 ptxas spills there and serializes the wgmma, C7512); each producer one
// warpgroup's whole share of a block's pieces in flight (without a cluster 8 per thread at 80
// registers: at 72 they spill; in a cluster 4 at 56).
struct RegBudget {
  int consumer0, consumer1, producer;
};
DECA_HD constexpr RegBudget reg_budget(int cluster) {
  return cluster == 2 ? RegBudget{224, 176, 56} : RegBudget{192, 160, 80};
}
static_assert(reg_budget(1).consumer0 + reg_budget(1).consumer1 + 2 * reg_budget(1).producer <=
                  4 * launch_regs(kThreadsWide),
              "register file, without a cluster");
static_assert(reg_budget(2).consumer0 + reg_budget(2).consumer1 + 2 * reg_budget(2).producer <=
                  4 * launch_regs(kThreadsWide),
              "register file, in a cluster");

// One bf16 tile of 64 rows x 576 columns as the wgmma wants it: 9 column chunks of 64 bf16
// (128 B), each chunk 64 rows x 128 B with the 128 B swizzle (16-byte unit u of row r stored at
// unit u ^ (r % 8)), chunks 8192 B apart. Q (rows = heads) and K/V (rows = tokens) share it.
constexpr int kChunkBytes = 64 * 128;
constexpr int kTileBytes = (kDimQK / 64) * kChunkBytes;  // 73728

// Id slots in shared memory: block it uses slot it % kIdSlots. Two would do (the producers write
// block it's ids after waiting for its tile, which the consumers of block it - 2 release after
// their masks); the slots are cheap and their count is in the kernel's addressing.
constexpr int kIdSlots = 4;

// Byte offsets from the 1024-aligned base of dynamic shared memory.
struct SmemPlan {
  static constexpr int kQ = 0;                                 // Q tile of this (request, token)
  static constexpr int kK = kQ + kTileBytes;                   // kStages K/V tiles
  static constexpr int kP = kK + kStages * kTileBytes;         // P (bf16 64 x 64) for consumer 1
  static constexpr int kRowScale = kP + kChunkBytes;           // float[64]: O rescale per block
  static constexpr int kOutScale = kRowScale + 64 * 4;         // float[64]: final O factor
  static constexpr int kIdx = kOutScale + 64 * 4;          // int[kIdSlots][64]: id, -1 invalid
  static constexpr int kBarFull = kIdx + kIdSlots * 64 * 4;    // u64[kStages]
  static constexpr int kBarEmpty = kBarFull + kStages * 8;     // u64[kStages]
  static constexpr int kBarRemote = kBarEmpty + kStages * 8;   // u64[kStages], cluster of 2 only
  static constexpr int kBarPReady = kBarRemote + kStages * 8;  // u64: P of a block is in smem
  static constexpr int kBarPFree = kBarPReady + 8;             // u64: consumer 1 is done with it
  static constexpr int kBarOutReady = kBarPFree + 8;           // u64: a request's out factors
  static constexpr int kBarOutFree = kBarOutReady + 8;         // u64: consumer 1 read them
  // u64: initialised by the set-up, read by no role; removing its init changes the wide kernels'
  // machine code, which issue 29's clean-up kept identical to the measured kernels.
  static constexpr int kBarQLoaded = kBarOutFree + 8;
  static constexpr int kEnd = kBarQLoaded + 8;
};

// The dynamic size asked at launch: the plan plus 1 KiB to align its base to the 1024 B the
// 128 B-swizzle atoms need (the runtime guarantees only 16 B).
constexpr int kSmemBytes = SmemPlan::kEnd + 1024;

static_assert(SmemPlan::kK % 1024 == 0 && SmemPlan::kP % 1024 == 0, "swizzle atoms 1024-aligned");
static_assert(SmemPlan::kBarFull % 8 == 0, "mbarrier alignment");
static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA on sm_90");

// CTAs per cluster along x for the wide kernel. 65..128 heads (exactly two head blocks) pair the
// two CTAs of a query token: each dequantizes 32 of a block's 64 tokens and writes them into both
// tiles through distributed shared memory (measured faster than unpaired blocks gathering all 64
// each: docs/perf-notes-mla.md).
DECA_HD constexpr int kClusterX(int num_heads) { return num_heads > 64 && num_heads <= 128 ? 2 : 1; }

// The kernel a plan of `num_heads` (1..128) runs on sm_90, one per shape class: at most 16 heads
// (one head block) the direct kernel, 17..64 the wide kernel on one CTA per 64-head block, 65..128
// the wide kernel in clusters of 2. src/cuda/mla_spec.cpp renders it into the JIT prologue
// (Cfg::kDirect, Cfg::kCluster) and the kernel's name.
constexpr int kDirectMaxHeads = 16;
struct KernelClass {
  int direct;   // 1: direct.cuh
  int cluster;  // 1 or 2 (the wide kernel only)
};
// `tile_only`: the cache is neither the 656-byte token nor MODEL1's (dense bf16 / e4m3 rows),
// which only the wide kernel's producers read.
DECA_HD constexpr KernelClass kernel_class(int num_heads, bool tile_only = false) {
  return num_heads <= kDirectMaxHeads && !tile_only ? KernelClass{1, 1} : KernelClass{0, kClusterX(num_heads)};
}

// Bytes one CTA of a 2-CTA cluster receives from its peer per block: 32 tokens x 576 bf16.
constexpr int kPeerBytes = (kTokens / 2) * kDimQK * 2;

// The token pool (num_blocks x page_size) as checked_id takes it: at most 2^31, since every id
// of an int32 index is below that.
DECA_HD constexpr unsigned pool_bound(long long pool) {
  return pool > 0x80000000ll ? 0x80000000u : static_cast<unsigned>(pool);
}
// An index as the producers use it: -1 when skipped (below zero, or at or above the pool: read
// out of bounds otherwise), else the id; one unsigned compare does both (negative ids are 2^31
// and up as unsigned, and pool <= 2^31).
DECA_HD constexpr int checked_id(int id, unsigned pool) {
  return static_cast<unsigned>(id) >= pool ? -1 : id;
}

// Head blocks (grid x) for num_heads.
DECA_HD constexpr int head_blocks(int num_heads) {
  return (num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
}

}  // namespace deca::mla::sm90
