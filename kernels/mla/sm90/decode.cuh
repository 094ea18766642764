// MLA sparse FP8 decode, Hopper (sm_90a), warp-specialized: wgmma tensor cores fed by a producer
// warpgroup that gathers and dequantizes the selected tokens.
//
// Unit of work: one CTA = (block of 64 heads = grid x, query token = grid y, SM partition = grid
// z). The partition's SparsePart (kernels/mla/sparse_work.cuh) lists the requests and blocks of
// 64 top-k indices it owns; the CTA walks them in order and, per request piece, writes either the
// final bf16 output + LSE (unsplit request, sink applied) or the normalised fp32 partial + LSE of
// its slot (split request; the combine kernel merges the slots).
//
// Warp roles (384 threads, registers rebalanced with setmaxnreg after the setup):
//   WG0 (consumer 0): loads Q [64 heads x 576] of the request into shared memory (cp.async,
//       rows past num_heads zero-filled), S = Q K^T (36 x wgmma m64n64k16, both operands in
//       shared memory), masking of invalid ids, online softmax in base 2 with the scale folded
//       in, P (bf16) to registers and to shared memory, O[:, 0:256] += P V (4 x m64n256k16,
//       A = P from registers), and the softmax state for the epilogue.
//   WG1 (consumer 1): O[:, 256:512] += P V with P read from shared memory, after rescaling its
//       O by WG0's per-row factors.
//   WG2 (producer): per block, reads the 64 ids, gathers each token's 656-byte record with
//       non-coherent loads, dequantizes e4m3 x fp32 scale -> bf16 (exactly the reference's
//       rounding) and copies the bf16 RoPE part into a 128 B-swizzled K tile; V is the same tile
//       read MN-major (no second copy). Invalid ids leave zero rows. How lanes split a record
//       (Cfg::kMap) decides the stores' shape: the plan's default, whole 128-byte rows per eight
//       lanes, is what the peer's st.async needs (docs/perf-notes-mla.md, 2026-12-02). With
//       Cfg::kProducers = 2 a fourth warpgroup (512 threads) shares each block's tokens.
//
// Cluster of 2 (Cfg::kCluster = 2, two head blocks of 65..128 heads): the two CTAs of a request
// token need the same tiles, so each producer gathers and dequantizes 32 of the 64 tokens and
// writes them into its own tile (st.shared) and the peer's (st.async, completing on the peer's
// `remote` barrier with kPeerBytes per block); the empty barriers count both CTAs' consumers.
//
// Pipeline: kStages = 2 K tiles. Per tile two mbarriers: full (128 producer arrivals, after
// fence.proxy.async so wgmma's async proxy sees the generic stores) and empty (one arrival per
// consumer warp once its wgmmas reading the tile completed). Two more mbarriers hand P and the
// row rescale factors from consumer 0 to consumer 1 (p_ready: 128 arrivals of consumer 0) and
// back (p_free: 128 arrivals of consumer 1 once its wgmmas reading P completed); out_ready /
// out_free do the same for a request's final output factors. They were named barriers
// (bar.arrive / bar.sync of 256 of the 384 threads) until compute-sanitizer racecheck, which
// orders nothing by a named barrier of part of the CTA (tools/racecheck_probe.cu), reported
// every hand-over as a race; an mbarrier arrive / wait is release / acquire for each thread,
// which it follows. Named barriers (NamedBarrier below) remain for the Q and id staging, inside
// one warpgroup.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sparse_work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = __builtin_bit_cast(float, 0xff800000u);

// Hardware barrier ids (0 is __syncthreads). Counts are threads; arrive/sync pairs are one-way
// signals, sync/sync pairs rendezvous.
enum NamedBarrier : int {
  kBarQReady = 1,    // WG0 x 128, sync: Q tile landed and fenced, wgmma may read it
  kBarVote = 2,      // WG0 x 128, sync + AND: whether the next tile is full (kPHandOverlap)
  kBarIds = 5,       // WG2 x 128, sync: the block's ids are in smem
  kBarPeerCopy = 6,  // a producer warpgroup x 128 (6, 7): its rows are stored and fenced (kPeerCopy)
};

// One request's share of this partition.
struct Piece {
  int blk_begin;
  int blk_end;
  int slot;    // partial slot when split
  bool split;
};

__device__ __forceinline__ int request_len(const MlaSparseParams& p, int r) {
  if (p.topk_length == nullptr) return p.topk;
  int l = p.topk_length[r];
  l = l < 0 ? 0 : l;
  return l > p.topk ? p.topk : l;
}

__device__ __forceinline__ Piece piece_of(const SparseKernelParams& kp, const SparsePart& part,
                                          int r) {
  const int n = (request_len(kp.p, r) + kTokens - 1) / kTokens;
  Piece pc;
  pc.blk_begin = r == part.begin_req ? part.begin_block : 0;
  pc.blk_end = r == part.end_req ? part.end_block : n;
  const int count = r == part.begin_req ? part.begin_split_count
                                        : (r == part.end_req ? part.end_split_count : 1);
  pc.split = count > 1;
  pc.slot = r == part.begin_req ? part.begin_split : kp.run.split_offsets[r];
  return pc;
}

// O *= the rescale factor of its row: a warp's m64n256 accumulator holds rows r0 (a0) and
// r0 + 8 (a1) in alternating pairs.
__device__ __forceinline__ void scale_rows(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= a0;
    o[4 * i + 1] *= a0;
    o[4 * i + 2] *= a1;
    o[4 * i + 3] *= a1;
  }
}
// scale_rows, left out (Cfg::kRescale >= 1) when every factor of the warp's 16 rows is 1. The
// rows of a warp are the same in both consumers, so both skip the same blocks.
template <int kRescale>
__device__ __forceinline__ void rescale(float (&o)[128], float a0, float a1) {
  if (kRescale == 0 || !__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) scale_rows(o, a0, a1);
}


// Four e4m3 (one word) times `scale`, rounded to bf16 once: bf16(float(e4m3) * scale) as the
// reference computes it (e4m3 -> f16 -> f32 are exact; the product rounds in f32, then to bf16).
__device__ __forceinline__ uint2 dequant4(unsigned w, float scale) {
  const float2 a = f16x2_to_f32x2(e4m3x2_to_f16x2(static_cast<unsigned short>(w & 0xFFFF)));
  const float2 b = f16x2_to_f32x2(e4m3x2_to_f16x2(static_cast<unsigned short>(w >> 16)));
  return make_uint2(f32x2_to_bf16x2(a.x * scale, a.y * scale), f32x2_to_bf16x2(b.x * scale, b.y * scale));
}

// The same four values without the e4m3 and f16 -> f32 conversions (Cfg::kDequant = 1): byte
// s eeee mmm placed at bits 31 and 26..20 of an f32 (the byte at the top, an arithmetic shift
// by 4, one AND) is the e4m3 value times 2^-120 exactly, subnormals included (they become f32
// denormals, hence mul.rn.f32 without .ftz); times `scale_hi` = scale * 2^120 (exact while
// scale < 2^8, which the caller checks) the real product is the reference's, so its rounding to
// f32 and then bf16 is too. Integer ops on the ALU pipe replace two conversions per value on
// the conversion pipe. The e4m3 NaN byte (0x7F / 0xFF) would read 480 (x scale): the cache
// never holds it (448 is the largest finite e4m3).
__device__ __forceinline__ float e4m3_placed(unsigned top_byte_word) {
  return __int_as_float((static_cast<int>(top_byte_word) >> 4) & static_cast<int>(0x87F00000u));
}
__device__ __forceinline__ float mul_rn_noftz(float a, float b) {
  float d;
  asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ uint2 dequant4_int(unsigned w, float scale_hi) {
  const float v0 = mul_rn_noftz(e4m3_placed(w << 24), scale_hi);
  const float v1 = mul_rn_noftz(e4m3_placed(w << 16), scale_hi);
  const float v2 = mul_rn_noftz(e4m3_placed(w << 8), scale_hi);
  const float v3 = mul_rn_noftz(e4m3_placed(w), scale_hi);
  return make_uint2(f32x2_to_bf16x2(v0, v1), f32x2_to_bf16x2(v2, v3));
}

// The same sixteen values through the tensor cores (Cfg::kDequant = 2): e4m3 pairs -> f16 pairs
// (exact), then f16 -> f32 by four mma.sync m16n8k8 whose B is the 8 x 8 identity. A lane's
// f16x2 registers (values 4i .. 4i + 3 as two pairs) are A {a0 = row g (lane / 4), k 2c, 2c + 1
// (c = lane % 4); a1 = row g + 8}; D = A I holds A[r, n] at (r, n), and a lane's accumulator
// elements (rows g, g + 8, columns 2c, 2c + 1) are its own a0 and a1. Each element is one product
// by 1.0 plus products by 0, exact in f32 (-0 comes back +0, the zeros added: no output can tell).
// `sel` is the lane's part of I (layout.cuh, mma_select_b). The product by the scale and the bf16 rounding
// are dequant4's, so the tile's values are. Per 16 values 16 HADD2.F32 and 4 shifts become 4 HMMA
// (m16n8k8 takes B in one register: m16n8k16 with [I; 0] and [0; I] made ptxas rebuild the two
// B pairs with three moves per unit). A NaN byte would spread along its A row (the four lanes of a
// quad, one token with the unit split): the cache never holds one.
__device__ __forceinline__ void dequant16_mma(uint4 raw, float scale, unsigned sel, uint4& lo, uint4& hi) {
  const uint2 h[4] = {e4m3x4_to_f16x4(raw.x), e4m3x4_to_f16x4(raw.y), e4m3x4_to_f16x4(raw.z),
                      e4m3x4_to_f16x4(raw.w)};
  unsigned w[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v[4];
    mma_f16_1688_zero(v, h[i].x, h[i].y, sel);  // values 4i .. 4i + 3
    w[2 * i] = f32x2_to_bf16x2(v[0] * scale, v[1] * scale);
    w[2 * i + 1] = f32x2_to_bf16x2(v[2] * scale, v[3] * scale);
  }
  lo = make_uint4(w[0], w[1], w[2], w[3]);
  hi = make_uint4(w[4], w[5], w[6], w[7]);
}

// Cfg knobs: Cfg::member when the prologue defines it, else the fallback.
#define DECA_MLA_SM90_KNOB(Trait, member, fallback)           \
  template <class C, class = void>                            \
  struct Trait {                                              \
    static constexpr int value = fallback;                    \
  };                                                          \
  template <class C>                                          \
  struct Trait<C, decltype(void(C::member))> {                \
    static constexpr int value = C::member;                   \
  };

// CTAs per cluster (traits.cuh kClusterX).
DECA_MLA_SM90_KNOB(ClusterOf, kCluster, 1)

// Variants that leave one stage out, for timing only (their numbers are wrong): what the kernel
// costs without the e4m3 -> bf16 conversion (the raw bytes are stored instead), without the
// tensor cores, without the gather's memory traffic (each record load returns finite bytes made
// from its address, the L2 prefetch is left out; ids, Q and the outputs still go to memory), or
// without both of the last two (the pipeline's skeleton: hand-overs, conversion, softmax), and in
// a cluster of 2 without the dequantized NoPE sent to the peer (only the RoPE units cross), with
// and without the rest of the skeleton's ablations. The last three take one side away to time
// the other alone: consumers only (the producers gather nothing, the consumers never wait for a
// tile and compute on zeroed tiles and ids), producers only (the consumers release every tile
// as soon as it is full, and write nothing), and producers only without the gather's memory.
enum Ablate : int {
  kAblateNone = 0,
  kAblateNoDequant = 1,
  kAblateNoMma = 2,
  kAblateNoGather = 3,
  kAblateNoGatherNoMma = 4,
  kAblateNoPeer = 5,
  kAblateSkeletonNoPeer = 6,
  kAblateConsumersOnly = 7,
  kAblateProducersOnly = 8,
  kAblateProducersOnlyNoGather = 9
};
DECA_MLA_SM90_KNOB(AblateOf, kAblate, kAblateNone)
template <class Cfg>
inline constexpr bool kNoMma = AblateOf<Cfg>::value == kAblateNoMma ||
                               AblateOf<Cfg>::value == kAblateNoGatherNoMma ||
                               AblateOf<Cfg>::value == kAblateSkeletonNoPeer;
template <class Cfg>
inline constexpr bool kNoGather = AblateOf<Cfg>::value == kAblateNoGather ||
                                  AblateOf<Cfg>::value == kAblateNoGatherNoMma ||
                                  AblateOf<Cfg>::value == kAblateSkeletonNoPeer ||
                                  AblateOf<Cfg>::value == kAblateProducersOnlyNoGather;
template <class Cfg>
inline constexpr bool kNoProduce = AblateOf<Cfg>::value == kAblateConsumersOnly;
template <class Cfg>
inline constexpr bool kNoConsume = AblateOf<Cfg>::value == kAblateProducersOnly ||
                                   AblateOf<Cfg>::value == kAblateProducersOnlyNoGather;
template <class Cfg>
inline constexpr bool kNoPeer =
    AblateOf<Cfg>::value == kAblateNoPeer || AblateOf<Cfg>::value == kAblateSkeletonNoPeer;

// How the producer orders its global loads against the tile handshake (traits.cuh Pipe; see
// producer_ahead).
DECA_MLA_SM90_KNOB(PipeOf, kPipe, kPipeBase)

// 0 the hardware conversions (dequant4), 1 the integer placement (dequant4_int) for every scale
// below 2^8, dequant4 for the others, 2 the f16 -> f32 step on the tensor cores (dequant16_mma).
DECA_MLA_SM90_KNOB(DequantOf, kDequant, 0)

// The cluster's tile hand-overs (cluster of 2 only). 0: release / acquire at cluster scope;
// every consumer warp's arrival on the peer's empty barrier then costs a MEMBAR.ALL.GPU and
// every cluster-scope wait a CCTL.IVALL (L1 invalidation), ~12 % of the warp-state samples at
// b128 h128 (ncu, 2026-12-01). 1: the remote arrival relaxed (the tile's reads completed at
// wgmma.wait_group, before it issues), the waits at CTA scope (the peer's st.async bytes are
// made visible by the barrier's transaction count, not by the wait's scope).
enum ClusterSync : int { kSyncCluster = 0, kSyncLight = 1 };
DECA_MLA_SM90_KNOB(SyncOf, kSync, kSyncCluster)

// The L2 prefetch of the records kAhead blocks ahead. 0: prefetch.global.L2 at every 128 bytes
// of a record (seven, shared by the token's threads); 1: one cp.async.bulk.prefetch.L2 of the
// whole 656-byte record per token; 2: none (the loads' L2::256B hint alone); 3: prefetch.global.L2
// at every 32 bytes (22 per record), in case a prefetch fetches one sector rather than a line.
// Measured at b128 h64 (c811419, whole op): lines 166 us, bulk 182, none 183.
enum Prefetch : int { kPrefetchLines = 0, kPrefetchBulk = 1, kPrefetchNone = 2, kPrefetchSectors = 3 };
DECA_MLA_SM90_KNOB(PrefetchOf, kPrefetch, kPrefetchLines)
// How many blocks ahead of the one it gathers the producer prefetches (pipe >= kPipeAhead).
DECA_MLA_SM90_KNOB(AheadOf, kAhead, 2)

// How the producer's threads split a block's records. 0: thread t takes 16-byte unit t % 32 of
// every fourth token (16 tokens per thread without a cluster: a record address, a scale load and
// two swizzled store addresses per token and unit); 1: four lanes take one token (lane % 8 picks
// the token of the warp's eight, lane / 8 a quarter of each 64-byte group), eight 16-byte units
// of it each (one address and one 16-byte scale load per token, store addresses one XOR apart):
// ncu at b128 h64 counted ~1600 producer instructions per block and thread with map 0, 48 %
// of them the conversion, most of the rest the per-token addressing. Map 1 executes 29 % fewer
// and is still slower (172 vs 165 us at b128 h64, 7409a3c): its loads wait longer (eight
// records' 64-byte pieces per warp load) and its stores crowd the MIO queue of consumer 0.
// 2: the unit split, with the two lanes of a pair (j, j ^ 1: units U, U + 1 and U + 2, U + 3 of
// one chunk row) swapping raw halves first, so that each of the two 16-byte stores of the pair
// completes a 32-byte sector (units U and U + 1, then U + 2 and U + 3; the swizzle keeps such
// pairs together). The unit split's stores leave every sector half written per instruction; for
// the peer's tile (st.async, a cluster of 2) the tuning guide asks for 32-byte segments, as for
// global memory.
// 3: lane l of the warp on token n takes the 8-byte NoPE pieces of units l % 8 of chunks cA and
// cA + 2, cA = o % 2 + 4 (o / 2) for its octet o = l / 8 (two 8-byte loads, and one of the two
// 128-value groups' scales, which both chunks share), so that each of its two stores is one
// eighth of a whole 128-byte row of the tile: a warp's store writes four rows, each a contiguous
// 128 bytes (the swizzle permutes units within a row), for the peer's st.async as well.
enum Map : int { kMapUnits = 0, kMapTokens = 1, kMapPairs = 2, kMapRows = 3 };
DECA_MLA_SM90_KNOB(MapOf, kMap, kMapUnits)

// The gather's L1 policy: 0 L1::no_allocate (each CTA reads a token once), 1 L1::evict_last
// (FlashMLA's). With the unit split no faster (d676a5a); with the whole-row pieces, whose lanes
// read each record line (and its scales) in several instructions, 2.5 % faster without a
// cluster and even in one (159427c): the plan's default without a cluster.
DECA_MLA_SM90_KNOB(L1Of, kL1, 0)

// When the consumers rescale O (128 FMUL per thread and block in each). 0: every block;
// 1: a warp skips it when every factor of its 16 rows is 1 (the running maxima unchanged: the
// same bytes as 0); 2: also keeps a row's running maximum until a block's exceeds it by more
// than 8 (log2 units), so P <= 2^8 and the rescale is rare after the first blocks (the sums and
// O carry the same reference, so the output is the same up to f32 rounding).
enum Rescale : int { kRescaleEvery = 0, kRescaleSkipOnes = 1, kRescaleLazy = 2 };
DECA_MLA_SM90_KNOB(RescaleOf, kRescale, kRescaleEvery)

// How consumer 1 takes P. 0: its P V reads P from shared memory through the async proxy, so
// consumer 0 fences (fence.proxy.async: MEMBAR + FENCE.VIEW.ASYNC, ~4 % of its samples at b128
// h128) before handing it over; 1: consumer 1 loads its A fragments with ld.shared (the same
// addresses consumer 0 stored them to, the fragment layouts being the same) and runs P V from
// registers; the hand-over is then an mbarrier release / acquire, and P's slot is free as soon as
// the loads complete.
// 2: as 0, but consumer 0 issues its own P V (A from registers) before the hand-over, which then
// runs while that P V executes.
// 3: as 0, with consumer 0's own P V reading P from shared memory too, and the next block's
// S = Q K^T issued right behind it when that tile is already full, so that the tensor cores run
// P V and the next QK^T back to back while consumer 0 waits for P V alone (O 128 and S 32 in
// flight at once: with P's 16 A registers too, ptxas serializes every wgmma, C7511). Measured
// slower (42d7715, H200: b128 h128 222.7 -> 228.1 us, b128 h64 124.2 -> 128.1): the producers,
// not consumer 0's chain, bound the block (docs/perf-notes-mla.md, 2026-12-02).
enum PHand : int { kPHandSmem = 0, kPHandRegs = 1, kPHandAfterPv = 2, kPHandOverlap = 3 };
DECA_MLA_SM90_KNOB(PHandOf, kPHand, kPHandSmem)

// Producer warpgroups (1 or 2; 2 with kPipe 1..4 and the unit split). One producer warpgroup is
// one warp per SM sub-partition for the whole gather and conversion: ncu at b128 h64 had it
// issuing in 19 % of its samples, the rest its own latencies (loads, fixed-latency dependencies,
// dispatch) that no other warp of the sub-partition covers. Two warpgroups split the block's
// tokens between them (512 threads, 128 registers each at launch; traits.cuh reg_budget gives
// consumer 0 200, consumer 1 160 and each producer 72): two warps per sub-partition, each with
// half the work. Measured -3 to -4 % without a cluster, +4 % in one (docs/perf-notes-mla.md):
// the producers then wait on their loads rather than on issue.
DECA_MLA_SM90_KNOB(ProducersOf, kProducers, 1)

// How a producer in a cluster of 2 writes its tokens into the peer's tile. 0: every thread
// st.async's each 16-byte unit it stores locally (the peer's barrier counts the bytes); 1: the
// threads store locally only, and once a warpgroup's rows are all stored (fence.proxy.async, a
// named barrier) one thread hands them to the bulk-copy unit, one copy per 128-byte-column
// chunk (kTokens / kWays rows of 128 bytes, contiguous in each chunk), completing on the same
// barrier with the same bytes. Without a cluster nothing crosses: no effect.
DECA_MLA_SM90_KNOB(PeerCopyOf, kPeerCopy, 0)
template <class Cfg>
inline constexpr bool kBulkPeer = ClusterOf<Cfg>::value == 2 && PeerCopyOf<Cfg>::value == 1;

#undef DECA_MLA_SM90_KNOB

// A 16-byte / 4-byte load of a cache record with the L1 policy of L1Of<Cfg>.
// The no-gather ablations return bytes made from the address instead (from addr_bits): e4m3 and
// bf16 in [0.5, 1), a scale near 2^-7, all finite, and dependent on the id as a load's result
// would be.
__device__ __forceinline__ unsigned addr_bits(const unsigned char* p) {  // the low 32 bits
  return static_cast<unsigned>(reinterpret_cast<unsigned long long>(p));
}
template <class Cfg>
__device__ __forceinline__ uint4 load_rec16(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) {
    const unsigned v = (addr_bits(p) & 0x07070707u) | 0x30303030u;
    return make_uint4(v, v ^ 0x01010101u, v ^ 0x02020202u, v ^ 0x04040404u);
  }
  if constexpr (L1Of<Cfg>::value == 1) return ldg_nc_el_v4(p);
  return ldg_nc_na_v4(p);
}
template <class Cfg>
__device__ __forceinline__ uint2 load_rec8(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) {
    const uint4 v = load_rec16<Cfg>(p);
    return make_uint2(v.x, v.y);
  }
  if constexpr (L1Of<Cfg>::value == 1) return ldg_nc_el_v2(p);
  return ldg_nc_na_v2(p);
}
template <class Cfg>
__device__ __forceinline__ float load_rec4(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) return __uint_as_float(0x3C000000u | (addr_bits(p) & 0xFFu));
  if constexpr (L1Of<Cfg>::value == 1) return ldg_nc_el_f32(p);
  return ldg_nc_na_f32(p);
}

struct Smem {
  unsigned base;  // shared-window address of the 1024-aligned plan
  unsigned char* ptr;
  unsigned peer_delta;  // cluster of 2: the peer CTA's address of X is X + peer_delta
  __device__ __forceinline__ unsigned q() const { return base + SmemPlan::kQ; }
  __device__ __forceinline__ unsigned k(int stage) const {
    return base + SmemPlan::kK + stage * kTileBytes;
  }
  __device__ __forceinline__ unsigned p() const { return base + SmemPlan::kP; }
  __device__ __forceinline__ float* row_scale() const {
    return reinterpret_cast<float*>(ptr + SmemPlan::kRowScale);
  }
  __device__ __forceinline__ float* out_scale() const {
    return reinterpret_cast<float*>(ptr + SmemPlan::kOutScale);
  }
  // The ids of the block with running index `it` (slot it % kIdSlots).
  __device__ __forceinline__ int* ids(int it) const {
    return reinterpret_cast<int*>(ptr + SmemPlan::kIdx) + (it & (kIdSlots - 1)) * 64;
  }
  __device__ __forceinline__ mbar_t* full(int stage) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarFull) + stage;
  }
  __device__ __forceinline__ mbar_t* empty(int stage) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarEmpty) + stage;
  }
  // Completed by the peer's st.async bytes (cluster of 2).
  __device__ __forceinline__ mbar_t* remote(int stage) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarRemote) + stage;
  }
  __device__ __forceinline__ mbar_t* p_ready() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarPReady);
  }
  __device__ __forceinline__ mbar_t* p_free() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarPFree);
  }
  __device__ __forceinline__ mbar_t* out_ready() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarOutReady);
  }
  __device__ __forceinline__ mbar_t* out_free() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarOutFree);
  }
  __device__ __forceinline__ unsigned peer(unsigned smem_addr) const { return smem_addr + peer_delta; }
};

// Writes 16 bytes of the tile here and, in a cluster of 2, at the same place in the peer's tile
// (completing on the peer's remote barrier of that stage).
template <int kCl>
__device__ __forceinline__ void store_tile(const Smem& sm, unsigned addr, uint4 v, unsigned peer_bar) {
  sts128(addr, v);
  if constexpr (kCl == 2) st_async_v4(sm.peer(addr), v, peer_bar);
}

// A NoPE unit of the tile: store_tile, or only here for the no-peer ablations.
template <class Cfg, int kCl>
__device__ __forceinline__ void store_nope(const Smem& sm, unsigned addr, uint4 v, unsigned peer_bar) {
  if constexpr (kNoPeer<Cfg> || kBulkPeer<Cfg>) {
    sts128(addr, v);
  } else {
    store_tile<kCl>(sm, addr, v, peer_bar);
  }
}

// The 656-byte record of token `id` (>= 0, inside the pool).
template <class Cfg>
__device__ __forceinline__ const unsigned char* record_of(const MlaSparseParams& p, int id) {
  return p.kv + static_cast<long long>(id / Cfg::kPageSize) * p.kv_stride_block +
         static_cast<long long>(id % Cfg::kPageSize) * p.kv_stride_slot;
}

// Sixteen e4m3 of `raw` times `scale` as two 16-byte bf16 units (dequant4's rounding).
template <class Cfg>
__device__ __forceinline__ void dequant16(uint4 raw, float scale, uint4& lo, uint4& hi) {
  if constexpr (DequantOf<Cfg>::value == 2) {
    dequant16_mma(raw, scale, mma_select_b(static_cast<int>(threadIdx.x & 31)), lo, hi);
    return;
  }
  uint2 a, b, c, d;
  if (DequantOf<Cfg>::value == 1 && scale < 256.f) {
    const float sh = mul_rn_noftz(scale, 0x1p120f);  // exact: no overflow below 2^8
    a = dequant4_int(raw.x, sh);
    b = dequant4_int(raw.y, sh);
    c = dequant4_int(raw.z, sh);
    d = dequant4_int(raw.w, sh);
  } else {
    a = dequant4(raw.x, scale);
    b = dequant4(raw.y, scale);
    c = dequant4(raw.z, scale);
    d = dequant4(raw.w, scale);
  }
  lo = make_uint4(a.x, a.y, b.x, b.y);
  hi = make_uint4(c.x, c.y, d.x, d.y);
}

// The cluster's hand-overs at the scope SyncOf<Cfg> picks (kCl == 1: local barriers only).
template <class Cfg, int kCl>
__device__ __forceinline__ void wait_empty(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kCl == 2 && SyncOf<Cfg>::value == kSyncCluster) {
    mbar_wait_cluster(sm.empty(stage), parity);
  } else {
    mbar_wait(sm.empty(stage), parity);
  }
}
template <class Cfg>
__device__ __forceinline__ void expect_peer_bytes(const Smem& sm, int stage) {
  // The no-peer ablations send the RoPE units alone: 32 tokens x 128 bytes.
  constexpr unsigned kBytes = kNoPeer<Cfg> ? (kTokens / 2) * 128 : kPeerBytes;
  if constexpr (SyncOf<Cfg>::value == kSyncCluster) {
    mbar_arrive_expect_tx(sm.remote(stage), kBytes);
  } else {
    mbar_arrive_expect_tx_cta(sm.remote(stage), kBytes);
  }
}

// Unit j (0..31) of token `id`'s NoPE bytes and the scale of its 128-value group, or zeros for
// an invalid id (-1): a zero row, so that P V never meets a NaN.
template <class Cfg>
__device__ __forceinline__ void load_unit(const MlaSparseParams& p, int id, int j, uint4& raw, float& scale) {
  if (id >= 0) {
    const unsigned char* rec = record_of<Cfg>(p, id);
    raw = load_rec16<Cfg>(rec + 16 * j);
    scale = load_rec4<Cfg>(rec + kDimNope + 4 * (j >> 3));
  } else {
    raw = make_uint4(0, 0, 0, 0);
    scale = 0.f;
  }
}
// One token's NoPE bytes as a producer lane takes them, by Cfg::kMap (layout.cuh): a 16-byte
// unit and its group's scale (the unit split and its pairs), or (kMapRows) two 8-byte pieces,
// units l % 8 of chunks rows_chunk(l) and + 2, and their two groups' scales (adjacent: one
// 8-byte load). load_piece fills one, zeros for an invalid id; store_piece converts it into the
// tile (and the peer's) at row n, from lane l's chunk in the tile (piece_chunk, computed once).
struct UnitPiece {
  uint4 raw;
  float scale;
};
struct RowPieces {
  uint2 a, b;
  float sa, sb;
};
template <bool kRows>
struct PieceOf {
  using type = UnitPiece;
};
template <>
struct PieceOf<true> {
  using type = RowPieces;
};
template <class Cfg>
__device__ __forceinline__ unsigned piece_chunk(unsigned tile, int l) {
  return tile + (MapOf<Cfg>::value == kMapRows ? rows_chunk(l) : l >> 2) * kChunkBytes;
}
template <class Cfg>
__device__ __forceinline__ void load_piece(const MlaSparseParams& p, int id, int l, UnitPiece& u) {
  load_unit<Cfg>(p, id, l, u.raw, u.scale);
}
template <class Cfg>
__device__ __forceinline__ void load_piece(const MlaSparseParams& p, int id, int l, RowPieces& r) {
  if (id >= 0) {
    const unsigned char* rec = record_of<Cfg>(p, id);
    const unsigned char* a = rec + rows_nope_byte(l);
    r.a = load_rec8<Cfg>(a);
    r.b = load_rec8<Cfg>(a + 128);
    const uint2 s = load_rec8<Cfg>(rec + rows_scale_byte(l));
    r.sa = __uint_as_float(s.x);
    r.sb = __uint_as_float(s.y);
  } else {
    r.a = r.b = make_uint2(0, 0);
    r.sa = r.sb = 0.f;
  }
}
// Eight e4m3 (two words) times `scale` as one 16-byte bf16 unit (dequant4's rounding), through
// the integer placement (Cfg::kDequant = 1) while the scale allows it, as dequant16.
template <class Cfg>
__device__ __forceinline__ uint4 dequant8(uint2 raw, float scale) {
  uint2 a, b;
  if (DequantOf<Cfg>::value == 1 && scale < 256.f) {
    const float sh = mul_rn_noftz(scale, 0x1p120f);  // exact: no overflow below 2^8
    a = dequant4_int(raw.x, sh);
    b = dequant4_int(raw.y, sh);
  } else {
    a = dequant4(raw.x, scale);
    b = dequant4(raw.y, scale);
  }
  return make_uint4(a.x, a.y, b.x, b.y);
}
template <class Cfg, int kCl>
__device__ __forceinline__ void store_piece(const Smem& sm, unsigned chunk, int n, int l, const UnitPiece& u,
                                            unsigned peer_bar) {
  int u_lo = (l & 3) * 2, u_hi = u_lo + 1;
  uint4 raw = u.raw;
  if constexpr (MapOf<Cfg>::value == kMapPairs) {
    // layout.cuh pair_stores: the even lane swaps its second half (it keeps unit U, gets U + 2),
    // the odd lane its first (it keeps U + 3, gets U + 1). Same token, same 128-value group:
    // same scale.
    const PairStores ps = pair_stores(l);
    const unsigned g0 = __shfl_xor_sync(0xffffffffu, ps.swapped ? raw.z : raw.x, 1);
    const unsigned g1 = __shfl_xor_sync(0xffffffffu, ps.swapped ? raw.w : raw.y, 1);
    raw = ps.swapped ? make_uint4(raw.x, raw.y, g0, g1) : make_uint4(g0, g1, raw.z, raw.w);
    u_lo = ps.lo;
    u_hi = ps.hi;
  }
  uint4 lo, hi;
  if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
    lo = hi = raw;
  } else {
    dequant16<Cfg>(raw, u.scale, lo, hi);
  }
  store_nope<Cfg, kCl>(sm, chunk + swz(n, u_lo), lo, peer_bar);
  store_nope<Cfg, kCl>(sm, chunk + swz(n, u_hi), hi, peer_bar);
}
template <class Cfg, int kCl>
__device__ __forceinline__ void store_piece(const Smem& sm, unsigned rows, int n, int l, const RowPieces& r,
                                            unsigned peer_bar) {
  uint4 lo, hi;
  if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
    lo = make_uint4(r.a.x, r.a.y, r.a.x, r.a.y);
    hi = make_uint4(r.b.x, r.b.y, r.b.x, r.b.y);
  } else {
    lo = dequant8<Cfg>(r.a, r.sa);
    hi = dequant8<Cfg>(r.b, r.sb);
  }
  store_nope<Cfg, kCl>(sm, rows + swz(n, l & 7), lo, peer_bar);
  store_nope<Cfg, kCl>(sm, rows + 2 * kChunkBytes + swz(n, l & 7), hi, peer_bar);
}

// RoPE unit `unit` (0..7, bf16) of token `id`, or zeros.
template <class Cfg>
__device__ __forceinline__ uint4 load_rope(const MlaSparseParams& p, int id, int unit) {
  return id >= 0 ? load_rec16<Cfg>(record_of<Cfg>(p, id) + kDimNope + 16 + 16 * unit) : make_uint4(0, 0, 0, 0);
}

// ---- Producer (WG2) -------------------------------------------------------------------------------
// The CTA's tokens: all 64, or in a cluster of 2 the 32 of its rank (32 rank ..). Thread t
// gathers, for tokens t / 32 + 4 i of them, the 16 NoPE bytes 16 (t % 32) .. + 15 (one warp
// reads one token's 512 contiguous bytes per load), and kRope of the 16-byte RoPE units. Loads
// go out kPerRound tokens at a time (16 KB per CTA in flight), converted when they land: two
// rounds per block, so two memory latencies (L2 hits after the prefetch) per block.
// kPerRound = 16 / kCl (Cfg::kPipe >= kPipeWhole) gathers the CTA's whole share in one round:
// one latency per block, at 128 producer registers. `before_store` runs after the first round's
// loads are issued and before the first store into the tile (kPipeEarly waits there for the
// tile to be free, so that the loads' latency overlaps the consumers still reading it).
template <class Cfg, int kCl, int kWays, int kPerRound, class BeforeStore>
__device__ __forceinline__ void produce_block(const MlaSparseParams& p, const Smem& sm, int stage,
                                              const int* block_ids, int t, int first_token,
                                              BeforeStore before_store) {
  constexpr int kRounds = 16 / kWays / kPerRound;
  constexpr int kRope = 4 / kWays;  // (tokens x 8 units) / 128 threads
  static_assert(kRounds * kPerRound * 4 * kWays == kTokens, "every token of the block, once");
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  const int* ids = block_ids + first_token;
  const int j = t & 31;
  const int g = t >> 5;
  // RoPE first: its loads are in flight while the first NoPE round converts.
  uint4 rope[kRope];
#pragma unroll
  for (int i = 0; i < kRope; ++i) {
    const int job = t + 128 * i;
    rope[i] = load_rope<Cfg>(p, ids[job >> 3], job & 7);
  }
  using Piece = typename PieceOf<MapOf<Cfg>::value == kMapRows>::type;
  const unsigned chunk = piece_chunk<Cfg>(tile, j);
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    Piece pc[kPerRound];
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) load_piece<Cfg>(p, ids[g + 4 * (round * kPerRound + u)], j, pc[u]);
    if (round == 0) {
      before_store();
#pragma unroll
      for (int i = 0; i < kRope; ++i) {
        const int job = t + 128 * i;
        store_tile<kBulkPeer<Cfg> ? 1 : kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7),
                                             rope[i], peer_bar);
      }
    }
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      store_piece<Cfg, kCl>(sm, chunk, first_token + g + 4 * (round * kPerRound + u), j, pc[u], peer_bar);
    }
  }
  if constexpr (kBulkPeer<Cfg>) {
    // This warpgroup's rows first_token .. + kRows of each chunk, to the same place in the peer's
    // tile, by the bulk-copy unit once every thread's stores are fenced for the async proxy.
    constexpr int kRows = kTokens / kWays;
    const int pw = (first_token / kRows) % ProducersOf<Cfg>::value;
    fence_proxy_async_smem();
    named_bar_sync(kBarPeerCopy + pw, 128);
    if (t == 0) {
#pragma unroll
      for (int c = 0; c < kDimQK / 64; ++c) {
        const unsigned src = tile + c * kChunkBytes + static_cast<unsigned>(first_token) * 128u;
        bulk_copy_to_peer(sm.peer(src), src, kRows * 128u, peer_bar);
      }
    }
  }
}

// Cfg::kMap = kMapTokens: lane l of warp w takes token w * 8 + l % 8 + 32 i of the CTA's share
// (i < kPer: 2 without a cluster, 1 with) and, of its record, the 16 bytes at 16 (l / 8) + 64 k
// for k < 8 (chunk k of the tile, units 2 (l / 8) and + 1), the 16-byte scale group and RoPE
// units 2 (l / 8), + 1. A warp's load covers eight 64-byte pieces; a quarter warp's stores hit
// eight distinct 16-byte bank groups (row n, unit u ^ (n % 8) with n % 8 = l % 8). kPerRound
// tokens per thread are loaded before the first is converted.
template <class Cfg, int kCl, int kPerRound, class BeforeStore>
__device__ __forceinline__ void produce_block_tokens(const MlaSparseParams& p, const Smem& sm, int stage,
                                                     const int* block_ids, int t, int first_token,
                                                     BeforeStore before_store) {
  constexpr int kPer = kTokens / kCl / 32;  // tokens per thread
  constexpr int kRounds = kPer / kPerRound;
  static_assert(kRounds * kPerRound == kPer, "every token of the share, once");
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  const int lane = t & 31;
  const int q = lane >> 3;
  const int local0 = (t >> 5) * 8 + (lane & 7);  // + 32 i
  // Units 2q and 2q + 1 of a 128-byte row, swizzled by the row's n % 8 = lane % 8.
  const unsigned u0 = static_cast<unsigned>(((2 * q) ^ (lane & 7)) << 4);
  const unsigned u1 = static_cast<unsigned>(((2 * q + 1) ^ (lane & 7)) << 4);
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    uint4 raw[kPerRound][8];
    uint4 sc[kPerRound];
    uint4 rope[kPerRound][2];
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      const int id = block_ids[first_token + local0 + 32 * (round * kPerRound + u)];
      if (id >= 0) {
        const unsigned char* rec = record_of<Cfg>(p, id);
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[u][k] = load_rec16<Cfg>(rec + 16 * q + 64 * k);
        sc[u] = load_rec16<Cfg>(rec + kDimNope);
        rope[u][0] = load_rec16<Cfg>(rec + kDimNope + 16 + 32 * q);
        rope[u][1] = load_rec16<Cfg>(rec + kDimNope + 32 + 32 * q);
      } else {
        // A zero row: P V must never meet a NaN.
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[u][k] = make_uint4(0, 0, 0, 0);
        sc[u] = make_uint4(0, 0, 0, 0);
        rope[u][0] = rope[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
    if (round == 0) before_store();
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      const unsigned row = tile + static_cast<unsigned>(first_token + local0 + 32 * (round * kPerRound + u)) * 128u;
      const float scale[4] = {__uint_as_float(sc[u].x), __uint_as_float(sc[u].y), __uint_as_float(sc[u].z),
                              __uint_as_float(sc[u].w)};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        uint4 lo, hi;
        if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
          lo = hi = raw[u][k];
        } else {
          dequant16<Cfg>(raw[u][k], scale[k >> 1], lo, hi);
        }
        store_nope<Cfg, kCl>(sm, row + k * kChunkBytes + u0, lo, peer_bar);
        store_nope<Cfg, kCl>(sm, row + k * kChunkBytes + u1, hi, peer_bar);
      }
      store_tile<kCl>(sm, row + 8 * kChunkBytes + u0, rope[u][0], peer_bar);
      store_tile<kCl>(sm, row + 8 * kChunkBytes + u1, rope[u][1], peer_bar);
    }
  }
}

// The seven 128-byte lines of record `id` (>= 0, inside the pool), shared by kThreadsPerToken
// consecutive threads.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_record(const MlaSparseParams& p, int id, int t) {
  const unsigned char* rec = record_of<Cfg>(p, id);
  if constexpr (kNoGather<Cfg>) {
    return;
  } else if constexpr (PrefetchOf<Cfg>::value == kPrefetchBulk) {
    // Records are 16-byte aligned and 41 x 16 bytes (the gather's 16-byte loads need it too).
    if (t % kThreadsPerToken == 0) prefetch_l2_bulk(rec, kTokenBytes);
  } else if constexpr (PrefetchOf<Cfg>::value == kPrefetchLines) {
#pragma unroll
    for (int k = t % kThreadsPerToken; k < 7; k += kThreadsPerToken) {
      prefetch_l2(rec + (k < 6 ? 128 * k : kTokenBytes - 1));
    }
  } else if constexpr (PrefetchOf<Cfg>::value == kPrefetchSectors) {
#pragma unroll
    for (int k = t % kThreadsPerToken; k < 22; k += kThreadsPerToken) {
      prefetch_l2(rec + (k < 21 ? 32 * k : kTokenBytes - 1));
    }
  }
}

// 128 / kThreadsPerToken tokens from `first_token` of block `blk`: the 656-byte record spans six
// or seven 128-byte lines, so seven prefetches (every 128 bytes and the last byte) shared by the
// token's threads.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_block(const MlaSparseParams& p, const int* row, int len,
                                               unsigned pool, int blk, int first_token, int t) {
  if (blk < 0) return;
  const int pos = blk * kTokens + first_token + t / kThreadsPerToken;
  if (pos >= len) return;
  const int id = checked_id(ldg_nc_s32(row + pos), pool);
  if (id < 0) return;
  prefetch_record<Cfg, kThreadsPerToken>(p, id, t);
}

// Prefetches the block two places after (r, blk) in the partition's order, crossing into the
// next requests of the partition when this one ends (their first blocks would otherwise start
// from cold HBM).
template <class Cfg, int kCl>
__device__ __forceinline__ void prefetch_ahead(const SparseKernelParams& kp, const SparsePart& part,
                                               int tok, int r, int blk, int blk_end, int steps,
                                               unsigned pool, int first_token, int t) {
  for (int step = 0; step < steps; ++step) {
    ++blk;
    while (blk >= blk_end) {
      if (++r > part.end_req) return;
      const Piece next = piece_of(kp, part, r);
      blk = next.blk_begin;
      blk_end = next.blk_end;
    }
  }
  const MlaSparseParams& p = kp.p;
  const int* row = p.indices + r * p.indices_stride_batch + tok * p.indices_stride_token;
  prefetch_block<Cfg, 2 * kCl>(p, row, request_len(p, r), pool, blk, first_token, t);
}

template <class Cfg, int kCl>
__device__ __forceinline__ void producer(const SparseKernelParams& kp, const SparsePart& part,
                                         int tok, const Smem& sm, int rank) {
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x - 256;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = rank * (kTokens / kCl);
  int it = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r) {
    const Piece pc = piece_of(kp, part, r);
    const int len = request_len(p, r);
    const int* row = p.indices + r * p.indices_stride_batch + tok * p.indices_stride_token;
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
      // cluster the barrier also counts the peer's consumers: this producer writes their tile.
      wait_empty<Cfg, kCl>(sm, stage, ((it >> 1) & 1) ^ 1);
      // The peer's bytes for this stage may land before this; the phase still cannot complete
      // until this arrival, and the tx count may dip below zero meanwhile (PTX allows it).
      if (kCl == 2 && t == 0) expect_peer_bytes<Cfg>(sm, stage);
      // Every CTA keeps all 64 ids: the consumers mask with them.
      if (t < kTokens) {
        const int pos = blk * kTokens + t;
        // Ids outside the pool are skipped like -1 rather than read out of bounds.
        sm.ids(it)[t] = checked_id(pos < len ? ldg_nc_s32(row + pos) : -1, pool);
      }
      named_bar_sync(kBarIds, 128);
      // The gather's loads wait a full memory latency per round; records of the block after
      // next are pulled into L2 now so that those rounds hit L2 (a block of work is ~2000 clk,
      // about one loaded HBM latency).
      prefetch_ahead<Cfg, kCl>(kp, part, tok, r, blk, pc.blk_end, 2, pool, first_token, t);
      if (it == 0) prefetch_ahead<Cfg, kCl>(kp, part, tok, r, blk, pc.blk_end, 1, pool, first_token, t);
      produce_block<Cfg, kCl, kCl, 8>(p, sm, stage, sm.ids(it), t, first_token, [] {});
      fence_proxy_async_smem();
      mbar_arrive(sm.full(stage));
    }
  }
}

// ---- Producer, Cfg::kPipe >= kPipeAhead ---------------------------------------------------------
// The base producer's block is a chain of dependent memory round trips: the block's ids (global
// -> shared -> barrier), then the id of the block two ahead for its L2 prefetch (a cold index
// line: the prefetch instruction waits for it, and nothing after it is issued meanwhile), then
// the two gather rounds. kPipeAhead loads both ids a block before they are used (registers
// carried across the loop), so that only the gather rounds remain on the block's path;
// kPipeWhole also gathers the share in one round; kPipeEarly also issues that round's loads
// before waiting for the tile to be free (its ids go to a slot of their own, kIdSlots).
//
// A position in the partition's order of blocks, as the consumers walk it.
struct BlockPos {
  int r, blk, blk_end, len;
};

__device__ __forceinline__ void settle(const SparseKernelParams& kp, const SparsePart& part,
                                       BlockPos& c) {
  while (c.r <= part.end_req && c.blk >= c.blk_end) {
    if (++c.r > part.end_req) break;
    const Piece pc = piece_of(kp, part, c.r);
    c.blk = pc.blk_begin;
    c.blk_end = pc.blk_end;
    c.len = request_len(kp.p, c.r);
  }
}

__device__ __forceinline__ BlockPos first_block(const SparseKernelParams& kp, const SparsePart& part) {
  BlockPos c{part.begin_req, 0, 0, 0};
  if (c.r <= part.end_req) {
    const Piece pc = piece_of(kp, part, c.r);
    c.blk = pc.blk_begin;
    c.blk_end = pc.blk_end;
    c.len = request_len(kp.p, c.r);
  }
  settle(kp, part, c);
  return c;
}

__device__ __forceinline__ void next_block(const SparseKernelParams& kp, const SparsePart& part,
                                           BlockPos& c) {
  if (c.r > part.end_req) return;
  ++c.blk;
  settle(kp, part, c);
}

// Id `k` of the block at `c` as stored (-1 past the partition or past the request's length),
// not yet checked: the check reads the loaded value, so it is done where the id is used, a block
// later (checked_id), or the load's latency is waited for here (ptxas puts the compare right
// after the load).
__device__ __forceinline__ int raw_id_at(const SparseKernelParams& kp, const SparsePart& part,
                                         int tok, const BlockPos& c, int k) {
  const MlaSparseParams& p = kp.p;
  const int pos = c.blk * kTokens + k;
  if (c.r > part.end_req || pos >= c.len) return -1;
  return ldg_nc_s32(p.indices + c.r * p.indices_stride_batch + tok * p.indices_stride_token + pos);
}

// The L2 prefetch's warm-up, `far` at block 1: blocks 1 .. A - 1 prefetched now (the block loop
// prefetches block i + A at block i), `far` left at block A + 1; returns block A's prefetch id
// (this thread's token pf_k), not yet checked, for the prefetch issued at block 0.
template <class Cfg, int kWays>
__device__ __forceinline__ int prefetch_warm_up(const SparseKernelParams& kp, const SparsePart& part,
                                                int tok, BlockPos& far, int pf_k, unsigned pool, int t) {
  constexpr int kAhead = AheadOf<Cfg>::value;
  static_assert(kAhead >= 1, "prefetch at least the next block");
  for (int a = 1; a < kAhead; ++a) {
    const int b = checked_id(raw_id_at(kp, part, tok, far, pf_k), pool);
    if (b >= 0) prefetch_record<Cfg, 2 * kWays>(kp.p, b, t);
    next_block(kp, part, far);
  }
  const int pf_id = raw_id_at(kp, part, tok, far, pf_k);
  next_block(kp, part, far);
  return pf_id;
}


template <class Cfg, int kCl>
__device__ __forceinline__ void producer_ahead(const SparseKernelParams& kp, const SparsePart& part,
                                               int tok, const Smem& sm, int rank) {
  constexpr int kPipe = PipeOf<Cfg>::value;
  constexpr int kProducers = ProducersOf<Cfg>::value;
  // The block's tokens split kWays ways: between the CTAs of a cluster, then between this CTA's
  // producer warpgroups (each a whole share: its own loads, conversions, stores and prefetches).
  constexpr int kWays = kCl * kProducers;
  // Two producer warpgroups hold 4 units per round (their 72 registers), one holds 8.
  constexpr int kPerRound = kPipe >= kPipeWhole ? 16 / kWays : (kProducers == 2 ? 4 : 8);
  constexpr int kTpt = 2 * kWays;  // prefetching threads per token (prefetch_record)
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;  // among all producer threads: the id staging, the peer's bytes
  // In this warpgroup: its share of the block (one producer: tg itself, as ptxas cannot tell).
  const int t = kProducers == 1 ? tg : (tg & 127);
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token =
      rank * (kTokens / kCl) + (kProducers == 1 ? 0 : (tg >> 7) * (kTokens / kWays));
  const int pf_k = first_token + t / kTpt;  // the token this thread prefetches in a block

  // Cursors at blocks i (produced now), i + 1 (whose ids are loaded now) and i + A + 1 (A =
  // kAhead; whose prefetch id is loaded now, for the prefetch issued at block i + 1).
  BlockPos cur = first_block(kp, part);
  BlockPos nxt = cur;
  next_block(kp, part, nxt);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kWays>(kp, part, tok, far, pf_k, pool, t);  // block A
  int my_id = tg < kTokens ? raw_id_at(kp, part, tok, cur, tg) : -1;

  for (int it = 0; cur.r <= part.end_req; ++it) {
    const int stage = it & 1;
    // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
    // cluster the barrier also counts the peer's consumers: this producer writes their tile.
    auto wait_free = [&] {
      wait_empty<Cfg, kCl>(sm, stage, ((it >> 1) & 1) ^ 1);
      // The peer's bytes may land before this arrival; the phase cannot complete without it.
      if (kCl == 2 && tg == 0) expect_peer_bytes<Cfg>(sm, stage);
    };
    if constexpr (kPipe != kPipeEarly) wait_free();
    // Every CTA keeps all 64 ids: the consumers mask with them. The slot of block it was last
    // read by the consumers of block it - kIdSlots, done before the wait for block it - 2.
    if (tg < kTokens) sm.ids(it)[tg] = checked_id(my_id, pool);
    pf_id = checked_id(pf_id, pool);
    named_bar_sync(kBarIds, 128 * kProducers);
    // A block ahead: the next block's ids, and the id of the block three ahead.
    if (tg < kTokens) my_id = raw_id_at(kp, part, tok, nxt, tg);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(kp, part, tok, far, pf_k);
    if constexpr (MapOf<Cfg>::value == kMapTokens) {
      // The whole share in one round for kPipeWhole and later, else a token per round.
      constexpr int kTokRound = kPipe >= kPipeWhole ? kTokens / kCl / 32 : 1;
      if constexpr (kPipe == kPipeEarly) {
        produce_block_tokens<Cfg, kCl, kTokRound>(p, sm, stage, sm.ids(it), t, first_token, wait_free);
      } else {
        produce_block_tokens<Cfg, kCl, kTokRound>(p, sm, stage, sm.ids(it), t, first_token, [] {});
      }
    } else if constexpr (kPipe == kPipeEarly) {
      produce_block<Cfg, kCl, kWays, kPerRound>(p, sm, stage, sm.ids(it), t, first_token, wait_free);
    } else {
      produce_block<Cfg, kCl, kWays, kPerRound>(p, sm, stage, sm.ids(it), t, first_token, [] {});
    }
    fence_proxy_async_smem();
    mbar_arrive(sm.full(stage));
    cur = nxt;
    next_block(kp, part, nxt);
    next_block(kp, part, far);
  }
}

// ---- Producer, Cfg::kPipe = kPipeStream ---------------------------------------------------------
// The gather as a stream of rounds, the loads of round k + 1 issued before round k is converted,
// so that one round's memory latency runs under the previous round's conversion (kPipeWhole
// waits for a block's loads, then converts: latency + conversion per block). A round is 8 tokens'
// 16-byte NoPE units with their scales and 2 RoPE units per thread (kRoundsPerBlock of them per
// block: one in a cluster of 2, two without), 48 registers; two are live.
//
// When round k + 1 opens block b + 1, that block's ids are staged (slot (b + 1) % kIdSlots)
// before round k is converted; the slot was last read by the consumers of block b - 3, done
// before the producer's wait for the tile of block b - 1.
struct Round {
  uint4 raw[8];
  float scale[8];
  uint4 rope[2];
};

// Loads round kH of a block (ids in shared memory) into `rd`; units as in produce_block.
template <class Cfg, int kH>
__device__ __forceinline__ void load_round(const MlaSparseParams& p, const int* block_ids, int t,
                                           int first_token, Round& rd) {
  const int* ids = block_ids + first_token;
  const int j = t & 31;
  const int g = t >> 5;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int job = t + 128 * (2 * kH + i);
    rd.rope[i] = load_rope<Cfg>(p, ids[job >> 3], job & 7);
  }
#pragma unroll
  for (int u = 0; u < 8; ++u) load_unit<Cfg>(p, ids[g + 4 * (8 * kH + u)], j, rd.raw[u], rd.scale[u]);
}

// Converts round kH of the block in tile `stage` and stores it (and, in a cluster, the peer's copy).
template <class Cfg, int kCl, int kH>
__device__ __forceinline__ void store_round(const Smem& sm, int stage, int t, int first_token,
                                            const Round& rd) {
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int job = t + 128 * (2 * kH + i);
    store_tile<kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7), rd.rope[i],
                    peer_bar);
  }
  // Two swizzled bases and immediates, not one register per store (layout.cuh, stream_stores).
  const StreamStores at = stream_stores(t, first_token);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    uint4 lo, hi;
    if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
      lo = hi = rd.raw[u];
    } else {
      dequant16<Cfg>(rd.raw[u], rd.scale[u], lo, hi);
    }
    const unsigned a = tile + at.at[u & 1] + 512u * (8 * kH + u);
    store_nope<Cfg, kCl>(sm, a, lo, peer_bar);
    store_nope<Cfg, kCl>(sm, a + at.second, hi, peer_bar);
  }
}


template <class Cfg, int kCl>
__device__ __forceinline__ void producer_stream(const SparseKernelParams& kp, const SparsePart& part,
                                                int tok, const Smem& sm, int rank) {
  constexpr int kRoundsPerBlock = 2 / kCl;
  constexpr int kTpt = 2 * kCl;  // prefetching threads per token (prefetch_record)
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x - 256;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = rank * (kTokens / kCl);
  const int pf_k = first_token + t / kTpt;

  BlockPos nxt = first_block(kp, part);
  if (nxt.r > part.end_req) return;  // no block: the consumers wait for none either
  // Block 0's ids staged, its loads issued; cursors at block 1 (ids) and block A + 1 (prefetch).
  if (t < kTokens) sm.ids(0)[t] = checked_id(raw_id_at(kp, part, tok, nxt, t), pool);
  next_block(kp, part, nxt);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kCl>(kp, part, tok, far, pf_k, pool, t);  // block A
  int my_id = t < kTokens ? raw_id_at(kp, part, tok, nxt, t) : -1;  // block 1
  named_bar_sync(kBarIds, 128);
  Round ra, rb;
  load_round<Cfg, 0>(p, sm.ids(0), t, first_token, ra);

  // Per block: the L2 prefetch of block it + A, then (stage_next) block it + 1's ids; false when
  // block it is the partition's last.
  auto prefetch_step = [&] {
    pf_id = checked_id(pf_id, pool);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(kp, part, tok, far, pf_k);
    next_block(kp, part, far);
  };
  auto stage_next = [&](int it) {
    const bool more = nxt.r <= part.end_req;  // the same for every producer thread
    if (more) {
      if (t < kTokens) sm.ids(it + 1)[t] = checked_id(my_id, pool);
      named_bar_sync(kBarIds, 128);
      next_block(kp, part, nxt);
      my_id = t < kTokens ? raw_id_at(kp, part, tok, nxt, t) : -1;
    }
    return more;
  };
  // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
  // cluster the barrier also counts the peer's consumers: this producer writes their tile.
  auto wait_free = [&](int it) {
    wait_empty<Cfg, kCl>(sm, it & 1, ((it >> 1) & 1) ^ 1);
    // The peer's bytes may land before this arrival; the phase cannot complete without it.
    if (kCl == 2 && t == 0) expect_peer_bytes<Cfg>(sm, it & 1);
  };
  auto publish = [&](int it) {
    fence_proxy_async_smem();
    mbar_arrive(sm.full(it & 1));
  };

  if constexpr (kRoundsPerBlock == 1) {
    // rb takes the next block's loads while ra converts, then moves into ra (a copy; two blocks
    // per trip with the roles swapped spill at 136 registers).
    for (int it = 0;; ++it) {
      prefetch_step();
      const bool more = stage_next(it);
      if (more) load_round<Cfg, 0>(p, sm.ids(it + 1), t, first_token, rb);
      wait_free(it);
      store_round<Cfg, kCl, 0>(sm, it & 1, t, first_token, ra);
      publish(it);
      if (!more) break;
      ra = rb;
    }
  } else {
    // ra holds a block's first round, rb its second.
    for (int it = 0;; ++it) {
      prefetch_step();
      load_round<Cfg, 1>(p, sm.ids(it), t, first_token, rb);
      wait_free(it);
      store_round<Cfg, kCl, 0>(sm, it & 1, t, first_token, ra);
      const bool more = stage_next(it);
      if (more) load_round<Cfg, 0>(p, sm.ids(it + 1), t, first_token, ra);
      store_round<Cfg, kCl, 1>(sm, it & 1, t, first_token, rb);
      publish(it);
      if (!more) break;
    }
  }
}

// ---- Producers, Cfg::kProducers = 2 with Cfg::kPipe = kPipeStream -------------------------------
// The round stream in small rounds, for the two producer warpgroups' 72 registers: a round is
// kSmallUnits 16-byte NoPE units (and their scales) per thread, the loads of round k + 1 issued
// before round k is converted, across blocks too; kRounds rounds per block (4 without a cluster,
// 2 in one). The RoPE units of a block (2 or 1 per thread) are loaded with its round 1 (or, with one
// round left, its round 0's successor), before the wait for the tile, and stored after it.
// ncu at cf8c111 (b128 h64) had the two producers of pipe 1 waiting on each round's loads, two
// full L2 latencies per block and warpgroup.
constexpr int kSmallUnits = 2;
struct SmallRound {
  uint4 raw[kSmallUnits];
  float scale[kSmallUnits];
};

// `ids`: the shared-window address of the share's first id (32-bit: a register fewer than a
// generic pointer, which at page size 1 is the difference between spilling and not).
template <class Cfg>
__device__ __forceinline__ void load_small(const MlaSparseParams& p, unsigned ids, int t, int k,
                                           SmallRound& rd) {
  const int j = t & 31;
  const int g = t >> 5;
#pragma unroll
  for (int u = 0; u < kSmallUnits; ++u) {
    const int id = static_cast<int>(ptx::lds32(ids + 4u * static_cast<unsigned>(g + 4 * (kSmallUnits * k + u))));
    load_unit<Cfg>(p, id, j, rd.raw[u], rd.scale[u]);
  }
}

template <class Cfg, int kCl>
__device__ __forceinline__ void store_small(const Smem& sm, unsigned tile, unsigned peer_bar,
                                            const StreamStores& at, int k, const SmallRound& rd) {
#pragma unroll
  for (int u = 0; u < kSmallUnits; ++u) {
    uint4 lo, hi;
    if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
      lo = hi = rd.raw[u];
    } else {
      dequant16<Cfg>(rd.raw[u], rd.scale[u], lo, hi);
    }
    // kSmallUnits is even: unit u's parity is its token's row parity in the stream's stores.
    const unsigned a = tile + at.at[u & 1] + 512u * static_cast<unsigned>(kSmallUnits * k + u);
    store_nope<Cfg, kCl>(sm, a, lo, peer_bar);
    store_nope<Cfg, kCl>(sm, a + at.second, hi, peer_bar);
  }
}

template <class Cfg, int kCl>
__device__ __forceinline__ void producer_stream_small(const SparseKernelParams& kp,
                                                      const SparsePart& part, int tok,
                                                      const Smem& sm, int rank) {
  constexpr int kWays = 2 * kCl;                       // two producer warpgroups per CTA
  constexpr int kUnits = 16 / kWays;                   // NoPE units per thread and block
  constexpr int kRounds = kUnits / kSmallUnits;        // 4, or 2 in a cluster
  constexpr int kRope = 4 / kWays;                     // RoPE units per thread and block
  constexpr int kTpt = 2 * kWays;                      // prefetching threads per token
  static_assert(kRounds % 2 == 0, "rounds alternate between two buffers within a block");
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;
  const int t = tg & 127;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = rank * (kTokens / kCl) + (tg >> 7) * (kTokens / kWays);
  const int pf_k = first_token + t / kTpt;
  const StreamStores at = stream_stores(t, first_token);

  BlockPos nxt = first_block(kp, part);
  if (nxt.r > part.end_req) return;  // no block: the consumers wait for none either
  if (tg < kTokens) sm.ids(0)[tg] = checked_id(raw_id_at(kp, part, tok, nxt, tg), pool);
  next_block(kp, part, nxt);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kWays>(kp, part, tok, far, pf_k, pool, t);
  int my_id = tg < kTokens ? raw_id_at(kp, part, tok, nxt, tg) : -1;
  named_bar_sync(kBarIds, 256);
  SmallRound ra, rb;
  load_small<Cfg>(p, ptx::smem_addr(sm.ids(0) + first_token), t, 0, ra);

  for (int it = 0;; ++it) {
    const int stage = it & 1;
    const unsigned tile = sm.k(stage);
    const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
    const unsigned ids = ptx::smem_addr(sm.ids(it) + first_token);
    pf_id = checked_id(pf_id, pool);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(kp, part, tok, far, pf_k);
    next_block(kp, part, far);
    uint4 rope[kRope];
    bool more = false;
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      SmallRound& cur = (k & 1) ? rb : ra;
      SmallRound& other = (k & 1) ? ra : rb;
      if (k == 0) {
#pragma unroll
        for (int i = 0; i < kRope; ++i) {
          const int job = t + 128 * i;
          rope[i] = load_rope<Cfg>(p, static_cast<int>(ptx::lds32(ids + 4u * static_cast<unsigned>(job >> 3))),
                                   job & 7);
        }
      }
      if (k + 1 < kRounds) {
        load_small<Cfg>(p, ids, t, k + 1, other);
      } else {
        // The next block's ids (slot it + 1, last read by the consumers of block it - 3, done
        // before this producer's wait for the tile of block it - 1), then its round 0.
        more = nxt.r <= part.end_req;  // the same for every producer thread
        if (more) {
          if (tg < kTokens) sm.ids(it + 1)[tg] = checked_id(my_id, pool);
          named_bar_sync(kBarIds, 256);
          next_block(kp, part, nxt);
          my_id = tg < kTokens ? raw_id_at(kp, part, tok, nxt, tg) : -1;
          load_small<Cfg>(p, ptx::smem_addr(sm.ids(it + 1) + first_token), t, 0, other);
        }
      }
      if (k == 0) {
        // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
        // cluster the barrier also counts the peer's consumers: this producer writes their tile.
        wait_empty<Cfg, kCl>(sm, stage, ((it >> 1) & 1) ^ 1);
        if (kCl == 2 && tg == 0) expect_peer_bytes<Cfg>(sm, stage);
      }
      store_small<Cfg, kCl>(sm, tile, peer_bar, at, k, cur);
      if (k == 0) {
#pragma unroll
        for (int i = 0; i < kRope; ++i) {
          const int job = t + 128 * i;
          store_tile<kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7), rope[i],
                          peer_bar);
        }
      }
    }
    fence_proxy_async_smem();
    mbar_arrive(sm.full(stage));
    if (!more) break;
  }
}

// ---- Consumers ------------------------------------------------------------------------------------
// A tile is ready when the local producer's 128 arrivals (and, in a cluster, the peer's bytes)
// completed its phase; it is released to both producers of a cluster (each writes it).
template <class Cfg, int kCl>
__device__ __forceinline__ void wait_tile(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kNoProduce<Cfg>) return;
  mbar_wait(sm.full(stage), parity);
  if constexpr (kCl == 2) {
    if constexpr (SyncOf<Cfg>::value == kSyncLight) {
      mbar_wait(sm.remote(stage), parity);
    } else {
      mbar_wait_cluster(sm.remote(stage), parity);
    }
  }
}
// Whether wait_tile would return at once (and, if so, the same acquire).
template <class Cfg, int kCl>
__device__ __forceinline__ bool tile_ready(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kNoProduce<Cfg>) return true;
  bool ready = mbar_test(sm.full(stage), parity);
  if constexpr (kCl == 2) {
    if constexpr (SyncOf<Cfg>::value == kSyncLight) {
      ready = ready && mbar_test(sm.remote(stage), parity);
    } else {
      ready = ready && mbar_test_cluster(sm.remote(stage), parity);
    }
  }
  return ready;
}
template <class Cfg, int kCl>
__device__ __forceinline__ void release_tile(const Smem& sm, int stage) {
  mbar_arrive(sm.empty(stage));
  if constexpr (kCl == 2) {
    const unsigned peer_empty = sm.peer(ptx::smem_addr(sm.empty(stage)));
    if constexpr (SyncOf<Cfg>::value == kSyncLight) {
      mbar_arrive_cluster_relaxed(peer_empty);
    } else {
      mbar_arrive_cluster(peer_empty);
    }
  }
}

// Accumulator fragment of wgmma m64nN (PTX ISA "wgmma .m64nNk16 register fragment layout for
// accumulator D"): thread (warp w, lane l) holds rows r0 = 16 w + l / 4 and r0 + 8; for each n8
// block i, d[4i + 0, 1] = row r0, columns 8i + 2 (l % 4) + {0, 1}; d[4i + 2, 3] = row r0 + 8.

// Writes this warpgroup's half of O (columns col0 .. col0 + 255) scaled per row, for rows that
// are real heads.
__device__ __forceinline__ void store_o(const SparseKernelParams& kp, const Piece& pc, int r,
                                        int tok, int head0, int r0, int c, int col0,
                                        const float (&o)[128], float f0, float f1) {
  const MlaSparseParams& p = kp.p;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int head = head0 + r0 + 8 * half;
    if (head >= p.num_heads) continue;
    const float f = half == 0 ? f0 : f1;
    if (pc.split) {
      float* dst = kp.run.partial_o +
                   ((static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head) * kDimV +
                   col0 + 2 * c;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        *reinterpret_cast<float2*>(dst + 8 * i) =
            make_float2(o[4 * i + 2 * half] * f, o[4 * i + 2 * half + 1] * f);
      }
    } else {
      unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch +
                            tok * p.out_stride_token + head * p.out_stride_head + col0 + 2 * c;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        *reinterpret_cast<unsigned*>(dst + 8 * i) =
            f32x2_to_bf16x2(o[4 * i + 2 * half] * f, o[4 * i + 2 * half + 1] * f);
      }
    }
  }
}

// Pulls the next request's Q rows (64 x 1152 B = 576 lines of 128 B) into L2 while this one
// runs: load_q then waits for L2, not HBM.
__device__ __forceinline__ void prefetch_q(const MlaSparseParams& p, int r, int tok, int head0, int t) {
  const char* q = static_cast<const char*>(p.q);
  for (int line = t; line < kHeadsPerCta * 9; line += 128) {
    const int head = head0 + line / 9;
    if (head >= p.num_heads) break;
    prefetch_l2(q + 2 * (r * p.q_stride_batch + tok * p.q_stride_token + head * p.q_stride_head) +
                128 * (line % 9));
  }
}

__device__ __forceinline__ void load_q(const MlaSparseParams& p, const Smem& sm, int r, int tok,
                                       int head0, int t) {
  const char* q = static_cast<const char*>(p.q);
  // 64 rows x 72 units of 16 B; rows past num_heads are zero-filled, their q never read.
#pragma unroll 4
  for (int i = 0; i < 36; ++i) {
    const int job = t + 128 * i;
    const int row = job / 72;
    const int u = job % 72;
    const int head = head0 + row;
    const bool valid = head < p.num_heads;
    const char* src = valid ? q + 2 * (r * p.q_stride_batch + tok * p.q_stride_token +
                                       head * p.q_stride_head) + 16 * u
                            : q;
    ptx::cp_async_16(sm.q() + (u >> 3) * kChunkBytes + swz(row, u & 7), src, valid);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  fence_proxy_async_smem();
  named_bar_sync(kBarQReady, 128);
}

// S = Q K^T into s, issued and committed (not waited for): A = Q (K-major, rows = heads), B = K
// (K-major, rows = tokens); k step kk reads 16 columns = 32 B at byte 32 (kk % 4) of chunk kk / 4.
__device__ __forceinline__ void issue_qk(float (&s)[32], unsigned long long dq, unsigned tile) {
  wgmma_fence();
  const unsigned long long dk = smem_desc_sw128(tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < kDimQK / 16; ++kk) {
    const unsigned off = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
    wgmma_m64n64k16_ss<0>(s, desc_advance(dq, off), desc_advance(dk, off), kk > 0);
  }
  wgmma_commit();
}

// O[:, 0:256] += P V, issued and committed: A = P from registers, B = V (MN-major: rows =
// tokens, 64 columns per chunk), k step kk is tokens 16 kk .. 16 kk + 15 = two 8-row groups
// (SBO 1024 B) at byte 2048 kk; the 256 columns are chunks 0..3 (LBO 8192 B). Descriptors from
// the address per k step (4 here, not QK^T's 36): with desc_advance ptxas allocated the kernel
// so that pipe 2's producer spilled 88 B without a cluster.
// kFromSmem: A = P from shared memory instead (where consumer 1 reads it: K-major 64 x 64, k step
// kk at byte 32 kk), so that P's registers are free once it is stored.
template <int kProducers, bool kFromSmem>
__device__ __forceinline__ void issue_pv_left(float (&o)[128], const unsigned (&pa)[4][4], unsigned tile,
                                              unsigned p_tile) {
  wgmma_fence();
  [[maybe_unused]] const unsigned long long dp = smem_desc_sw128(p_tile, 16, 1024);
  [[maybe_unused]] const unsigned long long dv = smem_desc_sw128(tile, kChunkBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (kFromSmem && kProducers == 2) {
      wgmma_m64n128k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
      wgmma_m64n128k16_ss<1>(o + 64, desc_advance(dp, 32 * kk), desc_advance(dv, 2 * kChunkBytes + 2048 * kk),
                             true);
    } else if constexpr (kFromSmem) {
      wgmma_m64n256k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
    } else if constexpr (kProducers == 2) {
      // Columns 0..127 (chunks 0, 1) and 128..255 (chunks 2, 3): sm90_ptx.cuh says why.
      wgmma_m64n128k16_rs<1>(o, pa[kk], smem_desc_sw128(tile + 2048 * kk, kChunkBytes, 1024), true);
      wgmma_m64n128k16_rs<1>(o + 64, pa[kk],
                             smem_desc_sw128(tile + 2 * kChunkBytes + 2048 * kk, kChunkBytes, 1024), true);
    } else {
      wgmma_m64n256k16_rs<1>(o, pa[kk], smem_desc_sw128(tile + 2048 * kk, kChunkBytes, 1024), true);
    }
  }
  wgmma_commit();
}

// Producers-only ablations: a consumer warpgroup releases each tile of the partition as soon as
// it is full, and does nothing else.
template <class Cfg>
__device__ __forceinline__ void release_only(const SparseKernelParams& kp, const SparsePart& part,
                                             const Smem& sm, int lane) {
  int it = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r) {
    const Piece pc = piece_of(kp, part, r);
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      wait_tile<Cfg, ClusterOf<Cfg>::value>(sm, it & 1, (it >> 1) & 1);
      if (lane == 0) release_tile<Cfg, ClusterOf<Cfg>::value>(sm, it & 1);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void consumer0(const SparseKernelParams& kp, const SparsePart& part,
                                          int tok, int head0, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  constexpr int kRescale = RescaleOf<Cfg>::value;
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const int c = lane & 3;
  if constexpr (kNoConsume<Cfg>) {
    release_only<Cfg>(kp, part, sm, lane);
    return;
  }
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale : 0.041666666666666664f;  // 1/sqrt(576)
  const float sl2 = scale * kLog2e;

  constexpr bool kOverlap = PHandOf<Cfg>::value == kPHandOverlap;
  float o[128];
  float s[32];
  int it = 0;
  int nreq = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of(kp, part, r);
    if (pc.blk_begin < pc.blk_end) load_q(p, sm, r, tok, head0, t);
    if (r < part.end_req) prefetch_q(p, r + 1, tok, head0, t);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
    const unsigned long long dq = smem_desc_sw128(sm.q(), 16, 1024);
    // One block from its S (waited for here) to its P V issued: the mask, the online softmax,
    // P to registers and (per kPHand) to consumer 1, O rescaled; the caller waits for P V.
    const auto softmax_and_pv = [&](unsigned tile) {
      if constexpr (kNoMma<Cfg>) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
      } else {
        wgmma_wait<0>();
        fence_regs(s);
      }
      // Invalid ids (-1, past topk_length, outside the pool) never count: -inf before the max.
      const int* ids = sm.ids(it);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int2 v = *reinterpret_cast<const int2*>(ids + 8 * i + 2 * c);
        if (v.x < 0) s[4 * i] = s[4 * i + 2] = kNegInf;
        if (v.y < 0) s[4 * i + 1] = s[4 * i + 3] = kNegInf;
      }
      float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // kRescaleLazy keeps the running maximum while the block's stays within 2^8 of it.
      constexpr float kSlack = kRescale == kRescaleLazy ? 8.f : 0.f;
      const float mn0 = mx0 * sl2 > m0 + kSlack ? fmaxf(m0, mx0 * sl2) : m0;
      const float mn1 = mx1 * sl2 > m1 + kSlack ? fmaxf(m1, mx1 * sl2) : m1;
      // A row with no valid key yet keeps max -inf; 0 as reference avoids -inf - -inf = NaN and
      // still gives exp2(-inf) = 0 for the masked entries and the (empty) old state.
      const float ref0 = mn0 == kNegInf ? 0.f : mn0;
      const float ref1 = mn1 == kNegInf ? 0.f : mn1;
      const float a0 = ptx::ex2(m0 - ref0);
      const float a1 = ptx::ex2(m1 - ref1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        s[4 * i] = ptx::ex2(fmaf(s[4 * i], sl2, -ref0));
        s[4 * i + 1] = ptx::ex2(fmaf(s[4 * i + 1], sl2, -ref0));
        s[4 * i + 2] = ptx::ex2(fmaf(s[4 * i + 2], sl2, -ref1));
        s[4 * i + 3] = ptx::ex2(fmaf(s[4 * i + 3], sl2, -ref1));
        sum0 += s[4 * i] + s[4 * i + 1];
        sum1 += s[4 * i + 2] + s[4 * i + 3];
      }
      l0 = l0 * a0 + sum0;
      l1 = l1 * a1 + sum1;

      // P as the A fragment of k step kk (tokens 16 kk ..): n8 blocks 2 kk and 2 kk + 1.
      unsigned pa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = f32x2_to_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = f32x2_to_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = f32x2_to_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = f32x2_to_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
      }
      // P and the row factors to consumer 1. WG1 may still be reading the previous block's
      // (phase it - 1 of p_free).
      const auto hand_over_p = [&] {
        if (it > 0) mbar_wait(sm.p_free(), (it - 1) & 1);
        // sP: 64 rows x 64 bf16 = one K-major swizzled chunk; element (row, col) at unit col / 8.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const unsigned base = sm.p() + 4 * (c & 3);
          sts32(base + swz(r0, 2 * kk), pa[kk][0]);
          sts32(base + swz(r0 + 8, 2 * kk), pa[kk][1]);
          sts32(base + swz(r0, 2 * kk + 1), pa[kk][2]);
          sts32(base + swz(r0 + 8, 2 * kk + 1), pa[kk][3]);
        }
        if (c == 0) {
          sm.row_scale()[r0] = a0;
          sm.row_scale()[r0 + 8] = a1;
        }
        if constexpr (PHandOf<Cfg>::value != kPHandRegs) fence_proxy_async_smem();
        mbar_arrive(sm.p_ready());
      };
      // kPHandAfterPv: this warpgroup's P V is issued first and the hand-over (stores, proxy
      // fence, arrival: ~11 % of consumer 0's samples at b128 h128) runs while it executes;
      // consumer 1's P V queues behind it on the tensor cores either way.
      constexpr bool kHandFirst = PHandOf<Cfg>::value != kPHandAfterPv;
      if constexpr (kHandFirst) hand_over_p();
      rescale<kRescale>(o, a0, a1);
      if constexpr (!kNoMma<Cfg>) {
        issue_pv_left<ProducersOf<Cfg>::value, kOverlap>(o, pa, tile, sm.p());
      }
      if constexpr (!kHandFirst) hand_over_p();
    };
    // Every wgmma of this warpgroup done (P V the last one), then the block's tile released.
    const auto wait_and_release = [&](int stage) {
      if constexpr (!kNoMma<Cfg>) {
        wgmma_wait<0>();
        fence_regs(o);
      }
      if (lane == 0) release_tile<Cfg, kCl>(sm, stage);
    };
    if constexpr (!kOverlap) {
      for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
        const int stage = it & 1;
        const unsigned tile = sm.k(stage);
        wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
        if constexpr (!kNoMma<Cfg>) issue_qk(s, dq, tile);
        softmax_and_pv(tile);
        wait_and_release(stage);
      }
    } else if (pc.blk_begin < pc.blk_end) {
      // kPHandOverlap: when the next block's tile is already full, its S is issued right behind
      // this block's P V, and P V is waited for (and its tile released) after; else P V is
      // waited for and its tile released first, so that the producers never wait for a tile this
      // consumer holds only because the next one is late (releasing after the next tile's
      // arrival made b128 h128 24 % slower). The four warps decide together (wgmma is
      // warpgroup-wide). Written so that ptxas sees one QK^T site (two made it keep the 36 Q
      // descriptors live: spills) and no wgmma in flight past the loop (else it serializes every
      // wgmma).
      wait_tile<Cfg, kCl>(sm, it & 1, (it >> 1) & 1);
      bool pv_pending = false;
      for (int blk = pc.blk_begin;; ++blk, ++it) {
        const int stage = it & 1;
        if constexpr (!kNoMma<Cfg>) {
          issue_qk(s, dq, sm.k(stage));
          if (pv_pending) {
            wgmma_wait<1>();
            fence_regs(o);
          }
        }
        if (pv_pending && lane == 0) release_tile<Cfg, kCl>(sm, stage ^ 1);
        softmax_and_pv(sm.k(stage));
        if (blk + 1 < pc.blk_end) {
          const unsigned parity = ((it + 1) >> 1) & 1;
          pv_pending = named_bar_all(kBarVote, 128, tile_ready<Cfg, kCl>(sm, stage ^ 1, parity));
          if (!pv_pending) {
            wait_and_release(stage);
            wait_tile<Cfg, kCl>(sm, stage ^ 1, parity);
          }
        } else {
          wait_and_release(stage);
          ++it;
          break;
        }
      }
    }

    // Epilogue: full row sums, then the output factor (1 / l, with the sink for a final
    // output) shared with WG1 and the LSE.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float f[2], lse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = half == 0 ? l0 : l1;
      const float m = half == 0 ? m0 : m1;
      const int head = head0 + r0 + 8 * half;
      if (l == 0.f) {  // no valid key: zeros and LSE -inf (DESIGN.md), sink or not
        f[half] = 0.f;
        lse[half] = kNegInf;
      } else {
        lse[half] = (m + ptx::lg2(l)) * kLn2;
        float denom = l;
        if (!pc.split && p.attn_sink != nullptr && head < p.num_heads) {
          denom += ptx::ex2(p.attn_sink[head] * kLog2e - m);
        }
        f[half] = 1.f / denom;
      }
    }
    // Consumer 1 copies the previous request's factors to registers first thing, so this wait
    // (phase nreq - 1 of out_free) has long completed by now.
    float* out_scale = sm.out_scale();
    if (nreq > 0) mbar_wait(sm.out_free(), (nreq - 1) & 1);
    if (c == 0) {
      out_scale[r0] = f[0];
      out_scale[r0 + 8] = f[1];
    }
    mbar_arrive(sm.out_ready());
    store_o(kp, pc, r, tok, head0, r0, c, 0, o, f[0], f[1]);
    if (c == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int head = head0 + r0 + 8 * half;
        if (head >= p.num_heads) continue;
        if (pc.split) {
          kp.run.partial_lse[(static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head] = lse[half];
        } else if (p.lse != nullptr) {
          p.lse[r * p.lse_stride_batch + tok * p.lse_stride_token + head * p.lse_stride_head] = lse[half];
        }
      }
    }
  }
  // Matches WG1's arrival after the partition's last block.
  if (it > 0) mbar_wait(sm.p_free(), (it - 1) & 1);
}

template <class Cfg>
__device__ __forceinline__ void consumer1(const SparseKernelParams& kp, const SparsePart& part,
                                          int tok, int head0, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  constexpr bool kRegsP = PHandOf<Cfg>::value == kPHandRegs;
  const int t = threadIdx.x - 128;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const int c = lane & 3;
  if constexpr (kNoConsume<Cfg>) {
    release_only<Cfg>(kp, part, sm, lane);
    return;
  }
  float o[128];
  int it = 0;
  int nreq = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of(kp, part, r);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      const unsigned tile = sm.k(stage);
      // Acquire the producer's tile for this warpgroup's own async-proxy reads.
      wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
      mbar_wait(sm.p_ready(), it & 1);
      const float a0 = sm.row_scale()[r0];
      const float a1 = sm.row_scale()[r0 + 8];
      // kPHandRegs: P's A fragments from where consumer 0 stored its own (same thread layout);
      // P's slot and the factors are then free.
      [[maybe_unused]] unsigned pa[4][4];
      if constexpr (kRegsP) {
        const unsigned base = sm.p() + 4 * c;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          pa[kk][0] = ptx::lds32(base + swz(r0, 2 * kk));
          pa[kk][1] = ptx::lds32(base + swz(r0 + 8, 2 * kk));
          pa[kk][2] = ptx::lds32(base + swz(r0, 2 * kk + 1));
          pa[kk][3] = ptx::lds32(base + swz(r0 + 8, 2 * kk + 1));
        }
        mbar_arrive(sm.p_free());
      }
      rescale<RescaleOf<Cfg>::value>(o, a0, a1);
      // O[:, 256:512] += P V: A = P (K-major 64 x 64, k step kk at byte 32 kk; or registers),
      // B = V chunks 4..7 as in consumer 0.
      if constexpr (!kNoMma<Cfg>) {
        wgmma_fence();
        const unsigned long long dp = smem_desc_sw128(sm.p(), 16, 1024);
        const unsigned long long dv = smem_desc_sw128(tile + 4 * kChunkBytes, kChunkBytes, 1024);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if constexpr (kRegsP) {
            wgmma_m64n256k16_rs<1>(o, pa[kk], desc_advance(dv, 2048 * kk), true);
          } else if constexpr (ProducersOf<Cfg>::value == 2) {
            // Columns 256..383 (chunks 4, 5) and 384..511 (chunks 6, 7): sm90_ptx.cuh says why.
            wgmma_m64n128k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
            wgmma_m64n128k16_ss<1>(o + 64, desc_advance(dp, 32 * kk),
                                   desc_advance(dv, 2 * kChunkBytes + 2048 * kk), true);
          } else {
            wgmma_m64n256k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
      }
      if constexpr (!kRegsP) mbar_arrive(sm.p_free());
      if (lane == 0) release_tile<Cfg, kCl>(sm, stage);
    }
    mbar_wait(sm.out_ready(), nreq & 1);
    const float* out_scale = sm.out_scale();
    const float f0 = out_scale[r0], f1 = out_scale[r0 + 8];
    mbar_arrive(sm.out_free());
    store_o(kp, pc, r, tok, head0, r0, c, 256, o, f0, f1);
  }
}

template <class Cfg>
__device__ __forceinline__ void mla_sparse_decode_sm90(const SparseKernelParams& kp,
                                                       unsigned char* smem_raw) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  constexpr int kProducers = ProducersOf<Cfg>::value;
  static_assert(kCl == 1 || kCl == 2, "Cfg::kCluster: 1, or 2 for two head blocks");
  static_assert(PipeOf<Cfg>::value >= kPipeBase && PipeOf<Cfg>::value <= kPipeStream, "Cfg::kPipe");
  static_assert(kProducers == 1 || (kProducers == 2 && PipeOf<Cfg>::value >= kPipeAhead &&
                                    MapOf<Cfg>::value != kMapTokens),
                "Cfg::kProducers: 1, or 2 with kPipe 1..4 and the unit split (or its pairs)");
  static_assert(DequantOf<Cfg>::value >= 0 && DequantOf<Cfg>::value <= 2, "Cfg::kDequant");
  static_assert(!kBulkPeer<Cfg> || (PipeOf<Cfg>::value >= kPipeAhead && PipeOf<Cfg>::value <= kPipeEarly &&
                                    MapOf<Cfg>::value != kMapTokens && !kNoPeer<Cfg>),
                "Cfg::kPeerCopy 1: the block producer (pipes 1-3, not the token split)");
  static_assert(MapOf<Cfg>::value != kMapRows || DequantOf<Cfg>::value <= 1,
                "Cfg::kMap 3 (rows) converts with the hardware conversions or the integer placement");
  static_assert(DequantOf<Cfg>::value != 2 || (MapOf<Cfg>::value == kMapUnits && kCl == 2),
                "Cfg::kDequant = 2: a quad of lanes on one token (the unit split), in a cluster "
                "(without one the producer spills)");
  const unsigned raw = ptx::smem_addr(smem_raw);
  Smem sm;
  sm.base = (raw + 1023u) & ~1023u;
  sm.ptr = smem_raw + (sm.base - raw);
  // Both CTAs of a cluster run the same kernel, so their plans sit at the same offsets.
  unsigned rank = 0;
  sm.peer_delta = 0;
  if constexpr (kCl == 2) {
    rank = cluster_ctarank();
    sm.peer_delta = mapa_shared(sm.base, rank ^ 1u) - sm.base;
  }

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(sm.full(s), 128 * kProducers);  // every producer thread
      mbar_init(sm.empty(s), 8 * kCl);  // lane 0 of each consumer warp (of both CTAs)
      mbar_init(sm.remote(s), 1);       // the local expect_tx arrival (+ the peer's bytes)
    }
    mbar_init(sm.p_ready(), 128);  // every consumer-0 thread
    mbar_init(sm.p_free(), 128);   // every consumer-1 thread
    mbar_init(sm.out_ready(), 128);
    mbar_init(sm.out_free(), 128);
    fence_mbar_init();
  }
  if constexpr (kNoProduce<Cfg>) {
    // Consumers only: finite tiles (zeros) and valid ids (0) in place of the producers' work.
    for (int i = threadIdx.x; i < (kStages * kTileBytes + kIdSlots * 64 * 4) / 16; i += blockDim.x) {
      const unsigned off = i < kStages * kTileBytes / 16
                               ? SmemPlan::kK + 16u * i
                               : SmemPlan::kIdx + 16u * (i - kStages * kTileBytes / 16);
      sts128(sm.base + off, make_uint4(0, 0, 0, 0));
    }
    fence_proxy_async_smem();
  }
  // In a cluster the peer's barriers must be initialised before its first remote arrival.
  if constexpr (kCl == 2) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  // Under programmatic dependent launch the scheduler's metadata may still be in flight.
  grid_dependency_wait();
  // A reused schedule of another call shape (ScheduleStamp): write nothing. Every CTA of a
  // cluster reads the same stamp, so both leave here or neither does.
  if (!schedule_matches(kp.p, kp.run)) return;

  const SparsePart part = kp.run.parts[blockIdx.z];
  const int tok = blockIdx.y;
  const int head0 = blockIdx.x * kHeadsPerCta;
  // Read through a shuffle so that ptxas sees a warp-uniform role: wgmma in a path it takes for
  // divergent is serialized (C7518: a wait after every wgmma).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  constexpr RegBudget kRegs = reg_budget(PipeOf<Cfg>::value, PHandOf<Cfg>::value, kProducers, kCl);
  if (wg >= 2) {
    setmaxnreg_dec<kRegs.producer>();
    if constexpr (kNoProduce<Cfg>) {
    } else if constexpr (PipeOf<Cfg>::value == kPipeBase) {
      producer<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    } else if constexpr (PipeOf<Cfg>::value == kPipeStream && kProducers == 2) {
      producer_stream_small<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    } else if constexpr (PipeOf<Cfg>::value == kPipeStream) {
      producer_stream<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    } else {
      producer_ahead<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    }
  } else if (wg == 0) {
    setmaxnreg_inc<kRegs.consumer0>();
    consumer0<Cfg>(kp, part, tok, head0, sm);
  } else {
    if constexpr (kRegs.consumer1 > launch_regs(kProducers)) {
      setmaxnreg_inc<kRegs.consumer1>();
    } else {
      setmaxnreg_dec<kRegs.consumer1>();
    }
    consumer1<Cfg>(kp, part, tok, head0, sm);
  }
  // The combine kernel (launched with programmatic dependent launch) may start; its
  // griddepcontrol.wait still sees every write of this grid.
  launch_dependents();
  // Neither CTA of a cluster may leave while the other can still write its tiles or arrive on
  // its barriers.
  if constexpr (kCl == 2) cluster_sync();
}

}  // namespace deca::mla::sm90
