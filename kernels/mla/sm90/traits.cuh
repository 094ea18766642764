// Launch facts and the shared-memory plan of the sm90a warp-specialized MLA sparse FP8 decode
// kernel (kernels/mla/sm90/decode.cuh). Host and device code read the same constexpr lines: the
// backend launches kThreads threads with kSmemBytes of dynamic shared memory and clusters of
// kClusterX(num_heads) CTAs along x.
#pragma once

#ifndef DECA_HD
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_HD __host__ __device__
#else
#define DECA_HD
#endif
#endif

namespace deca::mla::sm90 {

constexpr int kThreads = 384;     // three warpgroups: consumer 0, consumer 1, producer
// With Cfg::kProducers = 2 a fourth warpgroup, a second producer (knobs.cuh, ProducersOf).
DECA_HD constexpr int threads_of(int producers) { return 128 * (2 + producers); }
// Registers per thread at launch (one CTA per SM, 65536 in all; setmaxnreg takes multiples of 8).
DECA_HD constexpr int launch_regs(int producers) { return 65536 / threads_of(producers) / 8 * 8; }
constexpr int kHeadsPerCta = 64;  // the M of every wgmma; num_heads is padded to it inside
constexpr int kTokens = 64;       // tokens per pipeline block (= kTopkBlock of kernels/mla/schedule/work.cuh)
constexpr int kDimQK = 576;
constexpr int kDimV = 512;
constexpr int kDimNope = 512;
constexpr int kTokenBytes = 656;  // 512 e4m3, 4 fp32 scales, 64 bf16 RoPE
constexpr int kStages = 2;        // K/V tiles in flight between the producer and the consumers

// Register budgets after setmaxnreg (multiples of 8; the three sum to 3 x 168, what one CTA of
// 384 threads gets at launch): consumer 0 holds S (32), P (16) and half of O (128); consumer 1
// half of O; the producer 8 x (16-byte load + scale) in flight per round plus the RoPE loads
// (96 spills 64 bytes there, 104 spills 12).
constexpr int kRegsConsumer0 = 224;
constexpr int kRegsConsumer1 = 168;
constexpr int kRegsProducer = 112;
static_assert(kRegsConsumer0 + kRegsConsumer1 + kRegsProducer <= 3 * 168, "register file");

// Producer pipeline variants (Cfg::kPipe, default kPipeBase; producer.cuh says what each does).
// kPipeWhole and kPipeEarly hold a CTA's whole share of a block's records in registers at once
// (16 tokens x (16 B + scale) + 4 RoPE units per thread without a cluster), so the producer
// gets more registers from consumer 0 (S 32, P 16, O 128) and consumer 1 (160: at 152 ptxas
// ignores the setmaxnreg, C7507, and serializes the wgmma, C7512): kPipeEarly 208/160/136
// (ptxas issues 13 of the 20 16-byte loads before the first conversion; consumer 0 at 200
// spills), kPipeWhole 216/160/128 (7 of 20; at 136 NVRTC spills 4 B there).
// kPipeStream keeps two rounds in registers (the one converted, the next one's loads in flight:
// 2 x (8 x (16 B + scale) + 2 RoPE units) = 96), at kPipeEarly's budget.
enum Pipe : int { kPipeBase = 0, kPipeAhead = 1, kPipeWhole = 2, kPipeEarly = 3, kPipeStream = 4 };
struct RegBudget {
  int consumer0, consumer1, producer;
};
DECA_HD constexpr RegBudget reg_budget_of_pipe(int pipe) {
  return pipe == kPipeStream ? RegBudget{200, 160, 144}
         : pipe == kPipeEarly ? RegBudget{208, 160, 136}
         : pipe == kPipeWhole ? RegBudget{216, 160, 128}
                              : RegBudget{kRegsConsumer0, kRegsConsumer1, kRegsProducer};
}
// Cfg::kPHand = 1 holds P's 16 A-fragment registers in consumer 1 beside O (128): at 160 and 168
// ptxas spills and serializes the wgmma (C7512); at 176 (16 from consumer 0) it compiles clean
// with pipes 0-2 (pipes 3 and 4 leave consumer 0 too few: 192 / 184).
// Two producer warpgroups (512 threads, 128 registers each at launch): consumer 0 and 1 keep
// what pipe 4 gives them (S, P, O: 200; O: 160) and each producer gets 72 (4 units of 16 bytes
// and their scales per round, 2 RoPE units).
// Without a cluster, two producers' whole shares in one round (pipes 2 and 3: 8 pieces per
// thread) take 80 registers each, 8 from consumer 0 (at 72 they spill 28 / 52 B).
// In a cluster, with P in consumer 1's registers (kPHand 1, pipes 1 and 2): consumer 1 176 (O
// and P's 16), each producer 56 (their 16 tokens per warpgroup: no spill, NVRTC), consumer 0
// the rest, 224.
// The seesaw consumers (Cfg::kSeesaw, two producers in a cluster) each hold S, their own P and
// their half of O: 200 each, the producers 56.
DECA_HD constexpr RegBudget reg_budget(int pipe, int phand = 0, int producers = 1, int cluster = 1,
                                       int seesaw = 0) {
  if (seesaw != 0) return RegBudget{200, 200, 56};
  if (producers == 2 && cluster == 2 && phand == 1) return RegBudget{224, 176, 56};
  if (producers == 2) {
    return cluster == 1 && (pipe == kPipeWhole || pipe == kPipeEarly) ? RegBudget{192, 160, 80}
                                                                       : RegBudget{200, 160, 72};
  }
  const RegBudget b = reg_budget_of_pipe(pipe);
  return phand != 1 ? b : RegBudget{b.consumer0 - 16, b.consumer1 + 16, b.producer};
}
static_assert(reg_budget(2, 0, 2).consumer0 + reg_budget(2, 0, 2).consumer1 +
                      2 * reg_budget(2, 0, 2).producer <= 4 * launch_regs(2),
              "register file, two producers' whole shares");
static_assert(reg_budget(1, 0, 2).consumer0 + reg_budget(1, 0, 2).consumer1 +
                      2 * reg_budget(1, 0, 2).producer <= 4 * launch_regs(2),
              "register file, two producers");
static_assert(reg_budget(2, 1, 2, 2).consumer0 + reg_budget(2, 1, 2, 2).consumer1 +
                      2 * reg_budget(2, 1, 2, 2).producer <= 4 * launch_regs(2),
              "register file, two producers in a cluster with P in consumer 1's registers");
static_assert(reg_budget(2, 0, 2, 2, 1).consumer0 + reg_budget(2, 0, 2, 2, 1).consumer1 +
                      2 * reg_budget(2, 0, 2, 2, 1).producer <= 4 * launch_regs(2),
              "register file, the seesaw consumers");
static_assert(reg_budget(kPipeWhole).consumer0 + reg_budget(kPipeWhole).consumer1 +
                      reg_budget(kPipeWhole).producer <= 3 * 168 &&
                  reg_budget(kPipeEarly).consumer0 + reg_budget(kPipeEarly).consumer1 +
                      reg_budget(kPipeEarly).producer <= 3 * 168,
              "register file");

// One bf16 tile of 64 rows x 576 columns as the wgmma wants it: 9 column chunks of 64 bf16
// (128 B), each chunk 64 rows x 128 B with the 128 B swizzle (16-byte unit u of row r stored at
// unit u ^ (r % 8)), chunks 8192 B apart. Q (rows = heads) and K/V (rows = tokens) share it.
constexpr int kChunkBytes = 64 * 128;
constexpr int kTileBytes = (kDimQK / 64) * kChunkBytes;  // 73728

// Id slots in shared memory: block it uses slot it % kIdSlots. Two would do for kStages = 2;
// Cfg::kPipe = kPipeEarly writes block it's ids before waiting for its tile to be free (while the
// consumers may still mask block it - 2 with theirs), so it needs more than kStages slots.
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
  static constexpr int kBarQLoaded = kBarOutFree + 8;          // u64: Q landed (Cfg::kSeesaw)
  static constexpr int kBarStage = kBarQLoaded + 8;  // u64[8 warps][2 halves]: staged records (Cfg::kStage)
  static constexpr int kEnd = kBarStage + 16 * 8;
};

// The dynamic size asked at launch: the plan plus 1 KiB to align its base to the 1024 B the
// 128 B-swizzle atoms need (the runtime guarantees only 16 B).
constexpr int kSmemBytes = SmemPlan::kEnd + 1024;

static_assert(SmemPlan::kK % 1024 == 0 && SmemPlan::kP % 1024 == 0, "swizzle atoms 1024-aligned");
static_assert(SmemPlan::kBarFull % 8 == 0, "mbarrier alignment");
static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA on sm_90");

// CTAs per cluster along x, the default the backend should launch (and put in Cfg::kCluster).
// Cfg::kCluster = 2 (num_heads 65..128: exactly two head blocks) makes the two CTAs of a cluster
// dequantize 32 tokens each and write them into both tiles through distributed shared memory.
// Measured on the H200 (b128 h128 topk 2048, decode kernel alone): 289 us paired against 324 us
// unpaired, and the GPU suite passes paired; so 65..128 heads pair by default.
DECA_HD constexpr int kClusterX(int num_heads) { return num_heads > 64 && num_heads <= 128 ? 2 : 1; }

// The cycle stamps' record (Cfg::kStamp, stamps.cuh) as the backend reads it: for the first
// kStampCtas CTAs and each warpgroup, kStampSlots numbers: the block count, then the sums of up to
// kStampSlots - 1 phases.
constexpr int kStampCtas = 2;
constexpr int kStampWarpgroups = 4;
constexpr int kStampSlots = 8;

// The launch timeline (Cfg::kStamp = 2, stamps.cuh): per CTA, the %globaltimer of each event.
enum TimelineEvent : int {
  kEventEntry = 0,        // thread 0 at the kernel's first instruction
  kEventStart = 1,        // thread 0 with the partition and the stamp checked
  kEventQ = 2,            // consumer 0: the first request's Q in shared memory
  kEventFirstFull = 3,    // producer thread 0: the first tile published
  kEventFirstTile = 4,    // consumer 0: the first tile acquired
  kEventLastRelease = 5,  // consumer 0: a request's last block released (the last request's)
  kEventOut0 = 6,         // consumer 0: a request's outputs stored (the last request's)
  kEventOut1 = 7,         // consumer 1: the same
  kEventExit = 8,         // thread 0 past the final barrier
  kTimelineEvents = 10
};
constexpr int kTimelineCtas = 1024;

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
