// The direct kernel's ring side (direct.cuh): the shared-memory plan, the request's Q as the
// consumers' B operands, and the producer warpgroup's copies of each block's records into a ring
// slot.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/checked.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/model1.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

constexpr int kDirectRing = 4;    // slots of 64 records in flight between the producer and the consumers
constexpr int kSlotBytes = kTokens * kTokenBytes;  // 41984, 16-byte aligned records back to back

// Byte offsets from the 1024-aligned base, per format (DirectPlanT<kModel1>). Operands in the
// 128-byte swizzle (16 rows of 128 B: two 1024-byte atoms, SBO 1024): Q's NoPE as f16, 64 values
// per chunk in the k order of direct_q_k (layout.cuh), Q's RoPE one chunk (64 bf16), P one chunk
// per group and block parity (hi at bytes 0..63 of a head's row, lo at 64..127; 64 tokens each).
// At a request's end (Q and P no longer read) warpgroup 1 hands its O^T (512 x 16 f32, 32 KB)
// to warpgroup 0 through the first 32 KB. The exchange areas of the block maxima and group scales
// keep two buffers per warpgroup; the alternating consumers use the first.
template <bool kModel1Token>
struct DirectPlanT;
// The 656-byte token: four 128-value groups; O^T's exchange over 16 KB of its own, then Q's
// NoPE terms.
template <>
struct DirectPlanT<false> {
  static constexpr int kGroups = 4;                                // NoPE scale groups
  static constexpr int kPChunks = 4;                               // P's chunks per block parity
  static constexpr int kOX = 0;                                    // f32 [64][128 thr] (request end)
  static constexpr int kQ = kOX + 16384;                           // f16 NoPE: 32 k16 steps, 8 chunks of 2 KB
  static constexpr int kQRope = kQ + 8 * 2048;
  static constexpr int kP = kQRope + 2048;                         // [2 parity][4 groups] x 2 KB
  static constexpr int kRing = kP + 2 * 4 * 2048;                  // kDirectRing slots
  static constexpr int kXMax = kRing + kDirectRing * kSlotBytes;   // f32 [2 wg][2 parity][16 heads][4 warps]
  static constexpr int kXScale = kXMax + 2 * 2 * 16 * 4 * 4;       // f32 [2 wg][2 parity][4 groups][4 warps]
  static constexpr int kXSum = kXScale + 2 * 2 * 4 * 4 * 4;        // f32 [2 wg][16 heads][4 warps]
  static constexpr int kXState = kXSum + 2 * 16 * 4 * 4;           // f32 [2 wg][2: m, l][16 heads]
  static constexpr int kHeadScale = kXState + 2 * 2 * 16 * 4;      // f32 [16]: log2(e) x scale / s_h
  static constexpr int kIdx = kHeadScale + 16 * 4;                 // int [kDirectRing][64]
  static constexpr int kBarFull = kIdx + kDirectRing * 64 * 4;     // u64 [kDirectRing]
  static constexpr int kBarEmpty = kBarFull + kDirectRing * 8;     // u64 [kDirectRing]
  // The consumer warpgroups' rendezvous (u64 each, 256 arrivals; rendezvous() below): a request's
  // start (the previous one's reads done), its Q landed, its states exchanged, its O^T exchanged.
  static constexpr int kBarRequest = kBarEmpty + kDirectRing * 8;
  static constexpr int kBarQLanded = kBarRequest + 8;
  static constexpr int kBarStates = kBarQLanded + 8;
  static constexpr int kBarOX = kBarStates + 8;
  static constexpr int kEnd = kBarOX + 8;
};
// MODEL1's token (direct_model1.cuh): seven 64-value groups, and P's eighth chunk the RoPE part's
// P in bf16 (64 tokens x 2 bytes a head). P's 32 KB (both parities) are also O^T's exchange, so
// that the plan fits beside the same four slots; Q's NoPE is 7 chunks.
template <>
struct DirectPlanT<true> {
  static constexpr int kGroups = 7;
  static constexpr int kPChunks = 8;                               // 7 groups' e4m3 P, then the RoPE's bf16 P
  static constexpr int kOX = 0;                                    // over P (request end)
  static constexpr int kP = 0;                                     // [2 parity][8 chunks] x 2 KB
  static constexpr int kQ = kP + 2 * 8 * 2048;                     // f16 NoPE: 28 k16 steps, 7 chunks of 2 KB
  static constexpr int kQRope = kQ + 7 * 2048;
  static constexpr int kRing = kQRope + 2048;
  static constexpr int kXMax = kRing + kDirectRing * kSlotBytes;
  static constexpr int kXScale = kXMax + 2 * 2 * 16 * 4 * 4;       // f32 [2 wg][2 parity][8 groups][4 warps]
  static constexpr int kXSum = kXScale + 2 * 2 * 8 * 4 * 4;
  static constexpr int kXState = kXSum + 2 * 16 * 4 * 4;
  static constexpr int kHeadScale = kXState + 2 * 2 * 16 * 4;
  static constexpr int kIdx = kHeadScale + 16 * 4;
  static constexpr int kBarFull = kIdx + kDirectRing * 64 * 4;
  static constexpr int kBarEmpty = kBarFull + kDirectRing * 8;
  static constexpr int kBarRequest = kBarEmpty + kDirectRing * 8;
  static constexpr int kBarQLanded = kBarRequest + 8;
  static constexpr int kBarStates = kBarQLanded + 8;
  static constexpr int kBarOX = kBarStates + 8;
  static constexpr int kEnd = kBarOX + 8;
};
using DirectPlan = DirectPlanT<false>;
template <class Plan>
constexpr bool direct_plan_fits() {
  return Plan::kQ % 1024 == 0 && Plan::kQRope % 1024 == 0 && Plan::kP % 1024 == 0 && Plan::kRing % 16 == 0 &&
         Plan::kBarFull % 8 == 0 && Plan::kEnd + 1024 <= kSmemBytes;
}
static_assert(direct_plan_fits<DirectPlanT<false>>() && direct_plan_fits<DirectPlanT<true>>(),
              "swizzle atoms, copy and mbarrier alignment, the size the backend asks at launch");
static_assert(DirectPlan::kOX + 64 * 128 * 4 <= DirectPlan::kQRope, "O^T's exchange: its own 16 KB and Q's terms");
static_assert(DirectPlanT<true>::kOX + 64 * 128 * 4 <= DirectPlanT<true>::kQ, "O^T's exchange: P's 32 KB");

// Named barriers of the direct kernel (0 is __syncthreads), each inside one consumer warpgroup.
// What crosses between the warpgroups goes through mbarriers instead (DirectPlan::kBarRequest ..):
// compute-sanitizer racecheck orders nothing by a named barrier of part of the CTA, while an
// mbarrier arrive / wait is release / acquire for each thread, which it follows.
enum DirectBarrier : int {
  kBarDirectWg = 2,  // + warpgroup (2, 3) x 128: its maxima exchanged, its P stored
};

// e such that x < 2^e for a finite x >= 0 (from the exponent bits; 0 and denormals give -126),
// clamped to [-118, 127] so that 2^(8 - e) and 2^(e - 8) are normal floats.
constexpr int kExpFloor = -118;
__device__ __forceinline__ int exponent_above(float x) {
  const int e = static_cast<int>((__float_as_uint(x) >> 23) & 0xFFu) - 126;
  return e < kExpFloor ? kExpFloor : (e > 127 ? 127 : e);
}
__device__ __forceinline__ float pow2f(int e) {  // e in [-126, 127]
  return __uint_as_float(static_cast<unsigned>(e + 127) << 23);
}

__device__ __forceinline__ void sts16(unsigned addr, unsigned v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v)) : "memory");
}

// The 4 x 4 byte transpose: in w[j] byte x, out o[x] byte j.
__device__ __forceinline__ void transpose4x4(const unsigned (&w)[4], unsigned (&o)[4]) {
  const unsigned x0 = ptx::prmt(w[0], w[1], 0x5140u);  // w0.0 w1.0 w0.1 w1.1
  const unsigned x1 = ptx::prmt(w[0], w[1], 0x7362u);  // w0.2 w1.2 w0.3 w1.3
  const unsigned y0 = ptx::prmt(w[2], w[3], 0x5140u);
  const unsigned y1 = ptx::prmt(w[2], w[3], 0x7362u);
  o[0] = ptx::prmt(x0, y0, 0x5410u);
  o[1] = ptx::prmt(x0, y0, 0x7632u);
  o[2] = ptx::prmt(x1, y1, 0x5410u);
  o[3] = ptx::prmt(x1, y1, 0x7632u);
}

// S^T's A fragments from a record slot (direct_consumer.cuh, direct_model1.cuh): `at` is the
// byte of row r0's record (r0 x 656 + 4 q + the part's offset); rows r0 and r0 + 8 are 8 records
// apart. The bf16 RoPE's k16 step: the words at `at` and 16 further of both rows, as stored.
__device__ __forceinline__ void load_a_rows(unsigned at, unsigned (&a)[4]) {
  a[0] = ptx::lds32(at);
  a[1] = ptx::lds32(at + 8 * kTokenBytes);
  a[2] = ptx::lds32(at + 16);
  a[3] = ptx::lds32(at + 8 * kTokenBytes + 16);
}
// An fp8 chunk of 32 bytes: the same four words widened to f16 pairs (exact), k16 steps f0 (the
// words at `at`) and f1 (16 further), in direct_q_k's k order.
__device__ __forceinline__ void widen_chunk(unsigned at, unsigned (&f0)[4], unsigned (&f1)[4]) {
  const uint2 h0 = e4m3x4_to_f16x4(ptx::lds32(at));
  const uint2 h1 = e4m3x4_to_f16x4(ptx::lds32(at + 8 * kTokenBytes));
  const uint2 h2 = e4m3x4_to_f16x4(ptx::lds32(at + 16));
  const uint2 h3 = e4m3x4_to_f16x4(ptx::lds32(at + 8 * kTokenBytes + 16));
  f0[0] = h0.x, f0[1] = h1.x, f0[2] = h0.y, f0[3] = h1.y;
  f1[0] = h2.x, f1[1] = h3.x, f1[2] = h2.y, f1[3] = h3.y;
}
// A group of kChunks fp8 chunks from `at` (its first chunk's byte, as above): k16 steps 0 ..
// 2 kChunks - 1 of f.
template <int kChunks>
__device__ __forceinline__ void widen_group(unsigned at, unsigned (&f)[8][4]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) widen_chunk(at + static_cast<unsigned>(32 * c), f[2 * c], f[2 * c + 1]);
}
// Timing only (Cfg::kAblate kNoMma): S^T's accumulators made from operands already loaded (the
// first register set's kSteps steps, the RoPE's), so that the loads stay and no product runs.
template <int kSteps, int kG>
__device__ __forceinline__ void scores_without_products(const unsigned (&f)[8][4], const unsigned (&ar)[4][4],
                                                        float (&acc)[kG][8], float (&racc)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
#pragma unroll
    for (int g = 0; g < kG; ++g) acc[g][k] = __uint_as_float(f[k % kSteps][g & 3] & 0x3F000000u);
    racc[k] = __uint_as_float(ar[k & 1][k >> 1] & 0x3F000000u);
  }
}
// S^T's products: kG groups of kSteps k16 steps (group g's steps kSteps g .. of Q's NoPE, in its
// 2 KB chunks of four steps), each group widened (widen(g, set)) into one of two register sets,
// a set rewritten once the group that read it completed (wgmma.wait_group 1); then the RoPE's
// four bf16 steps; all complete on return.
template <int kG, int kSteps, class Widen>
__device__ __forceinline__ void scores_products(const Widen& widen, unsigned long long dq, unsigned long long dqr,
                                                unsigned (&kf)[2][8][4], const unsigned (&ar)[4][4],
                                                float (&acc)[kG][8], float (&racc)[8]) {
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g >= 2) wgmma_wait<1>();  // group g - 2, the last reader of this set, completed
    widen(g, kf[g & 1]);
    wgmma_fence();
    const unsigned base = static_cast<unsigned>(kSteps * g);  // k16 step of the group's first
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      const unsigned j = base + st;
      wgmma_m64n16k16_f16_rs(acc[g], kf[g & 1][st], desc_advance(dq, (j >> 2) * 2048 + 32 * (j & 3)), st > 0);
    }
    wgmma_commit();
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    wgmma_m64n16k16_rs(racc, ar[ks], desc_advance(dqr, static_cast<unsigned>(32 * ks)), ks > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int g = 0; g < kG; ++g) fence_regs(acc[g]);
  fence_regs(racc);
}
// The scores of rows r0 (k = 0, 1, 4, 5) and r0 + 8 (k = 2, 3, 6, 7): each group's products
// times the token's scale of that group (scr[g][0 / 1]), plus the RoPE's.
template <int kG>
__device__ __forceinline__ void scale_scores(const float (&racc)[8], const float (&acc)[kG][8],
                                             const float (&scr)[kG][2], float (&s)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int hr = (k >> 1) & 1;
    float v = racc[k];
#pragma unroll
    for (int g = kG - 1; g >= 0; --g) v = fmaf(scr[g][hr], acc[g][k], v);
    s[k] = v;
  }
}

template <bool kModel1Token>
struct DirectSmemT {
  using Plan = DirectPlanT<kModel1Token>;
  unsigned base;
  unsigned char* ptr;
  __device__ __forceinline__ unsigned slot(int it) const {
    return base + Plan::kRing + static_cast<unsigned>(it % kDirectRing) * kSlotBytes;
  }
  __device__ __forceinline__ int* ids(int it) const {
    return reinterpret_cast<int*>(ptr + Plan::kIdx) + (it % kDirectRing) * 64;
  }
  __device__ __forceinline__ mbar_t* full(int it) const {
    return reinterpret_cast<mbar_t*>(ptr + Plan::kBarFull) + it % kDirectRing;
  }
  __device__ __forceinline__ mbar_t* empty(int it) const {
    return reinterpret_cast<mbar_t*>(ptr + Plan::kBarEmpty) + it % kDirectRing;
  }
  __device__ __forceinline__ unsigned p(int it, int group) const {
    return base + Plan::kP + static_cast<unsigned>(((it & 1) * Plan::kPChunks + group) * 2048);
  }
  __device__ __forceinline__ float* f32(int offset) const { return reinterpret_cast<float*>(ptr + offset); }
  __device__ __forceinline__ mbar_t* bar(int offset) const { return reinterpret_cast<mbar_t*>(ptr + offset); }
};
template <class Cfg>
using DirectSmem = DirectSmemT<kModel1<Cfg>>;

// Both consumer warpgroups meet: every thread's earlier shared-memory accesses are released by its
// arrival and acquired by every thread's wait (`parity`: the barrier's phase, one per use).
__device__ __forceinline__ void rendezvous(mbar_t* bar, unsigned parity) {
  mbar_arrive(bar);
  mbar_wait(bar, parity);
}

// The request's Q (16 heads x 576 bf16 at query token `tok`; MODEL1: x 512, its last 64 the
// RoPE) as the consumers' B operands: per head a power of two s_h with max |q_nope| s_h in
// [128, 256), the NoPE as f16 q s_h (exact) in direct_q_k's order, the RoPE as bf16 q s_h
// (exact), and log2(e) x scale / s_h per head; rows past num_heads zeros. Thread t (0..255) of
// both consumer warpgroups: head t / 16, units (8 values) u, u + 16, u + 32, u + 48 of the NoPE
// (u = t % 16: group g's unit u % 16 is unit 16 g + u), RoPE unit u for u < 8. MODEL1's 56 NoPE
// units are units 0..55 of the row, its RoPE units 56..63: the fourth load of u >= 8.
template <bool kM1>
__device__ __forceinline__ void load_q_direct(const MlaSparseParams& p, const DirectSmemT<kM1>& sm, int r, int tok,
                                              int t, float sl2) {
  using Plan = DirectPlanT<kM1>;
  const int h = t >> 4, u = t & 15;
  const bool real = h < p.num_heads;
  const uint4* q = reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.q) + r * p.q_stride_batch +
                                                  tok * p.q_stride_token + (real ? h : 0) * p.q_stride_head);
  uint4 raw[5];
#pragma unroll
  for (int g = 0; g < 4; ++g) raw[g] = real ? q[16 * g + u] : make_uint4(0, 0, 0, 0);
  if constexpr (!kM1) raw[4] = real && u < 8 ? q[64 + u] : make_uint4(0, 0, 0, 0);
  // Whether load g is NoPE (MODEL1: not the fourth of u >= 8).
  const auto nope = [&](int g) { return !kM1 || g < 3 || u < 8; };
  float x[4][8];
  float amax = 0.f;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    const unsigned w[4] = {raw[g].x, raw[g].y, raw[g].z, raw[g].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[g][2 * k] = __uint_as_float(w[k] << 16);
      x[g][2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
      if (nope(g)) amax = fmaxf(amax, fmaxf(fabsf(x[g][2 * k]), fabsf(x[g][2 * k + 1])));
    }
  }
#pragma unroll
  for (int s = 1; s < 16; s <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
  // amax s_h in [128, 256): s_h = 2^(8 - e) with amax < 2^e (a zero row: any finite s_h); q s_h
  // is exact in f16 down to 2^-14 (a value 2^22 below the row's largest loses bits).
  const int e = exponent_above(amax);
  const float sh = pow2f(8 - e);
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    if (!nope(g)) continue;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int d = 128 * g + 8 * u + k;  // this value's NoPE dimension
      const int j = d >> 4;
      const int kk = direct_q_k(d & 15);
      const unsigned at = static_cast<unsigned>((j >> 2) * 2048) + swz(h, (2 * (j & 3)) + (kk >> 3)) + 2u * (kk & 7);
      sts16(sm.base + Plan::kQ + at, ptx::float_to_fp16_bits(x[g][k] * sh));
    }
  }
  if (kM1 ? u >= 8 : u < 8) {
    const uint4 rr = raw[kM1 ? 3 : 4];
    const unsigned w[4] = {rr.x, rr.y, rr.z, rr.w};
    unsigned o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k] = f32x2_to_bf16x2(__uint_as_float(w[k] << 16) * sh, __uint_as_float(w[k] & 0xFFFF0000u) * sh);
    }
    sts128(sm.base + Plan::kQRope + swz(h, kM1 ? u - 8 : u), make_uint4(o[0], o[1], o[2], o[3]));
  }
  if (u == 0) sm.f32(Plan::kHeadScale)[h] = sl2 * pow2f(e - 8);
  fence_proxy_async_smem();  // the generic stores, read by wgmma's async proxy
}

// The producer warpgroup's 16-byte cp.async (LDGSTS). Warp w copies tokens 16 w ..
// 16 w + 15 of a block (lane l: bytes 16 l of each record, and 512 + 16 l for l < 9), a skipped
// id's 41 units as zeros (src-size 0: nothing read); each thread's copies complete on the slot's
// full barrier (.noinc arrivals, 128 of them) and each thread arrives once more after its id is
// stored (a release of its own stores, which is what racecheck follows): 256 arrivals per phase.
// MODEL1 (kModel1<Cfg>): a record is the token's 576-byte row (lane l: bytes 16 l, and 512 + 16 l
// for l < 4) and its 8 scale bytes from the page's end (lane 4, one 8-byte copy) at byte 576 of
// the slot's 656-byte record, from the block's cache (the first or the extra one).
template <class Cfg>
__device__ __forceinline__ void producer_copies(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                                const DirectSmem<Cfg>& sm) {
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;
  const int warp = tg >> 5, lane = tg & 31;
  const int mine = 16 * warp + (lane & 15);  // the token whose id this lane loads
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  [[maybe_unused]] unsigned extra_pool = 0;
  if constexpr (kModel1<Cfg>) {
    extra_pool = pool_bound(static_cast<long long>(p.extra_num_blocks) * ExtraPageOf<Cfg>::value);
  }
  BlockPos<Cfg> cur = first_block<Cfg>(kp, part, tok);
  RawId id = raw_id_at<Cfg>(part, cur, mine);
  [[maybe_unused]] int bad_it = -1;  // checked: the first block whose id of this lane was refused
  for (int it = 0; cur.r <= part.end_req; ++it) {
    const int c = finish_id<Cfg>(kp, id, pool, extra_pool);
    if constexpr (kChecked<Cfg>) bad_it = first_refused<Cfg>(id, c, it, bad_it);  // checked.cuh
    [[maybe_unused]] bool extra = false;  // MODEL1: the block is the extra cache's
    if constexpr (kModel1<Cfg>) extra = in_extra(cur);
    next_block<Cfg>(kp, part, tok, cur);
    id = raw_id_at<Cfg>(part, cur, mine);  // the next block's, in flight while this one waits
    mbar_wait(sm.empty(it), ((it / kDirectRing) & 1) ^ 1);
    if (lane < 16) sm.ids(it)[mine] = c;
    const unsigned slot = sm.slot(it) + static_cast<unsigned>(16 * warp * kTokenBytes + 16 * lane);
#pragma unroll 4
    for (int u = 0; u < 16; ++u) {
      const int cu = __shfl_sync(0xffffffffu, c, u);
      const bool ok = cu >= 0 && !kNoGather<Cfg>;
      const unsigned dst = slot + static_cast<unsigned>(u * kTokenBytes);
      if constexpr (kModel1<Cfg>) {
        const unsigned char* scales;
        const unsigned char* row = model1_row<Cfg>(p, cu >= 0 ? cu : 0, extra, scales);
        ptx::cp_async_16(dst, row + 16 * lane, ok);
        if (lane < (kModel1RowBytes - 512) / 16) ptx::cp_async_16(dst + 512, row + 512 + 16 * lane, ok);
        if (lane == (kModel1RowBytes - 512) / 16) ptx::cp_async_8(dst + 512, scales, ok);
      } else {
        const unsigned char* src = record_of<Cfg>(p, cu >= 0 ? cu : 0) + 16 * lane;
        ptx::cp_async_16(dst, src, ok);
        if (lane < (kTokenBytes - 512) / 16) ptx::cp_async_16(dst + 512, src + 512, ok);
      }
    }
    ptx::cp_async_mbar_arrive_noinc(ptx::smem_addr(sm.full(it)));
    mbar_arrive(sm.full(it));
  }
  if constexpr (kChecked<Cfg>) {
    if (lane < 16) report_refused<Cfg>(kp, part, tok, bad_it, mine, pool, extra_pool);  // 16..31 hold the same ids
    if (warp == 0) check_lengths<Cfg>(kp, part, lane);
  }
}

}  // namespace deca::mla::sm90
