// The sm90a MLA sparse decode kernel at 16 heads or fewer without the bf16 tile (Cfg::kDirect):
// the consumers multiply the FP8 records themselves, from a ring of record slots.
//
// Why: with the bf16 tile every record crosses shared memory three times (copied in, read back
// by the converting producers, stored as bf16) and the tile is read twice more by the wgmma; two
// tiles of 72 KB leave no room for more than one block of records in flight. At 16 heads the
// tensor work is small, so the producers' conversion and that traffic bound the block
// (docs/perf-notes-mla.md, 2026-12-02, eighth part). Here the records land in a ring of four
// 42 KB slots and are read once from there, by the consumers' own ld.shared, as the A operands
// of wgmma with A in registers:
//
//   S^T = K Q^T: A = the records' e4m3 NoPE words widened to f16 pairs in registers (exact), B = Q
//     as f16 (q s_h, s_h a power of two per head: exact), one accumulator per 128-value group so
//     that each token's group scale multiplies it after the products (the cache's value e4m3 x
//     fp32 scale, nothing rounded to bf16). Not the e4m3 tensor cores: they keep ~14 bits of
//     the sum (DeepSeek-V3's report), and two e4m3 terms of q in one accumulator moved the LSE by
//     up to 8.5e-3 (d754518, H200); f16 products accumulate in f32. The RoPE part on the bf16
//     tensor cores from the records' bf16 bytes (q s_h exact in bf16).
//   O^T = V^T P^T on the e4m3 tensor cores: A = the same NoPE bytes transposed in registers (4 x 4
//     byte transposes by prmt; which token sits at which k and which column at which row is free,
//     and is picked so that the loads are conflict-free and a thread's rows are four adjacent
//     columns), B = P as two e4m3 terms per 128-value group g: P_g = P x scale_g(token) x
//     2^(8 - E_g), the scale folded in per token, E_g the group's running scale exponent (O
//     rescaled when it grows).
//
// Roles (384 threads) and the variants (Cfg::kDirect, below DirectPlan): warpgroup 2 produces
// (per block the 64 checked ids and the records into the ring slot, skipped ids' records as
// zeros so that P V never meets a NaN of an unused slot); consumer warpgroups 0 and 1 either
// split each block (two NoPE groups each, the partial S^T added through shared memory) or take
// alternate blocks (the plan's: each the whole block, their running states merged at a request's
// end).
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/knobs.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/narrow.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/stamps.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

constexpr int kDirectRing = 4;    // slots of 64 records in flight between the producer and the consumers
constexpr int kSlotBytes = kTokens * kTokenBytes;  // 41984, 16-byte aligned records back to back

// Byte offsets from the 1024-aligned base. Operands in the 128-byte swizzle (16 rows of 128 B:
// two 1024-byte atoms, SBO 1024): Q's NoPE as f16, 64 values per chunk in the k order of
// direct_q_k (layout.cuh), Q's RoPE one chunk (64 bf16), P one chunk per group and block parity (hi at bytes
// 0..63 of a head's row, lo at 64..127; 64 tokens each). The partial S^T exchange and Q's NoPE
// are contiguous: at a request's end (Q no longer read) the alternate-block consumers
// (kDirect 3) hand warpgroup 1's O^T (512 x 16 f32) to warpgroup 0 through those 32 KB.
struct DirectPlan {
  static constexpr int kSPart = 0;                                 // f32 [2 wg][2 parity][2 halves][128 thr][4]
  static constexpr int kOX = 0;                                    // f32 [64][128 thr] (kDirect 3, request end)
  static constexpr int kQ = kSPart + 2 * 2 * 2 * 128 * 16;      // f16 NoPE: 32 k16 steps, 8 chunks of 2 KB
  static constexpr int kQRope = kQ + 8 * 2048;
  static constexpr int kP = kQRope + 2048;                         // [2 parity][4 groups] x 2 KB
  static constexpr int kRing = kP + 2 * 4 * 2048;                  // kDirectRing slots
  static constexpr int kXMax = kRing + kDirectRing * kSlotBytes;   // f32 [2 wg][2 parity][16 heads][4 warps]
  static constexpr int kXScale = kXMax + 2 * 2 * 16 * 4 * 4;       // f32 [2 wg][2 parity][4 groups][4 warps]
  static constexpr int kXSum = kXScale + 2 * 2 * 4 * 4 * 4;        // f32 [2 wg][16 heads][4 warps]
  static constexpr int kXState = kXSum + 2 * 16 * 4 * 4;           // f32 [2 wg][2: m, l][16 heads] (kDirect 3)
  static constexpr int kHeadScale = kXState + 2 * 2 * 16 * 4;      // f32 [16]: log2(e) x scale / s_h
  static constexpr int kIdx = kHeadScale + 16 * 4;                 // int [kDirectRing][64]
  static constexpr int kBarFull = kIdx + kDirectRing * 64 * 4;     // u64 [kDirectRing]
  static constexpr int kBarEmpty = kBarFull + kDirectRing * 8;     // u64 [kDirectRing]
  static constexpr int kEnd = kBarEmpty + kDirectRing * 8;
};
static_assert(DirectPlan::kQ % 1024 == 0 && DirectPlan::kP % 1024 == 0 && DirectPlan::kRing % 16 == 0,
              "swizzle atoms, copy alignment");
static_assert(DirectPlan::kOX + 64 * 128 * 4 <= DirectPlan::kQRope, "O^T's exchange: the S^T exchange and Q's terms");
static_assert(DirectPlan::kBarFull % 8 == 0, "mbarrier alignment");
static_assert(DirectPlan::kEnd + 1024 <= kSmemBytes, "the plan fits what the backend asks at launch");

// The variants (Cfg::kDirect): 1 the producer warp's bulk copies (one cp.async.bulk of 656 bytes
// per token) and the consumers in lockstep (two groups each, the partial S^T added through shared
// memory); 2 the producer warpgroup's 16-byte cp.async (LDGSTS: 41 per record over a warp's
// lanes, zero-filled for a skipped id, completing on the slot's barrier per thread) with the
// lockstep consumers; 3 those copies and the consumers taking alternate blocks (each the whole
// S^T, softmax and O^T of its block, its own running state, the two merged at a request's end),
// so that one's softmax runs under the other's tensor work.
template <class Cfg>
inline constexpr bool kDirectCopies = DirectOf<Cfg>::value >= 2;
template <class Cfg>
inline constexpr bool kDirectAlt = DirectOf<Cfg>::value == 3;

// Named barriers of the direct kernel (0 is __syncthreads).
enum DirectBarrier : int {
  kBarDirectBoth = 1,  // both consumer warpgroups x 256: Q landed, a block's partial S^T written
  kBarDirectWg = 2,    // + warpgroup (2, 3) x 128: its maxima exchanged, its P stored
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

struct DirectSmem {
  unsigned base;
  unsigned char* ptr;
  __device__ __forceinline__ unsigned slot(int it) const {
    return base + DirectPlan::kRing + static_cast<unsigned>(it % kDirectRing) * kSlotBytes;
  }
  __device__ __forceinline__ int* ids(int it) const {
    return reinterpret_cast<int*>(ptr + DirectPlan::kIdx) + (it % kDirectRing) * 64;
  }
  __device__ __forceinline__ mbar_t* full(int it) const {
    return reinterpret_cast<mbar_t*>(ptr + DirectPlan::kBarFull) + it % kDirectRing;
  }
  __device__ __forceinline__ mbar_t* empty(int it) const {
    return reinterpret_cast<mbar_t*>(ptr + DirectPlan::kBarEmpty) + it % kDirectRing;
  }
  __device__ __forceinline__ unsigned p(int it, int group) const {
    return base + DirectPlan::kP + static_cast<unsigned>(((it & 1) * 4 + group) * 2048);
  }
  __device__ __forceinline__ float* f32(int offset) const { return reinterpret_cast<float*>(ptr + offset); }
};

// The request's Q (16 heads x 576 bf16 at query token `tok`) as the consumers' B operands: per
// head a power of two s_h with max |q_nope| s_h in [128, 256), the NoPE as f16 q s_h (exact) in
// direct_q_k's order, the RoPE as bf16 q s_h (exact), and log2(e) x scale / s_h per head; rows past num_heads zeros. Thread t
// (0..255) of both consumer warpgroups: head t / 16, NoPE units (8 values) u, u + 16, u + 32,
// u + 48 (u = t % 16: group g's unit u % 16 is unit 16 g + u), RoPE unit u for u < 8.
__device__ __forceinline__ void load_q_direct(const MlaSparseParams& p, const DirectSmem& sm, int r, int tok,
                                              int t, float sl2) {
  const int h = t >> 4, u = t & 15;
  const bool real = h < p.num_heads;
  const uint4* q = reinterpret_cast<const uint4*>(static_cast<const unsigned short*>(p.q) + r * p.q_stride_batch +
                                                  tok * p.q_stride_token + (real ? h : 0) * p.q_stride_head);
  uint4 raw[5];
#pragma unroll
  for (int g = 0; g < 4; ++g) raw[g] = real ? q[16 * g + u] : make_uint4(0, 0, 0, 0);
  raw[4] = real && u < 8 ? q[64 + u] : make_uint4(0, 0, 0, 0);
  float x[4][8];
  float amax = 0.f;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    const unsigned w[4] = {raw[g].x, raw[g].y, raw[g].z, raw[g].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[g][2 * k] = __uint_as_float(w[k] << 16);
      x[g][2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
      amax = fmaxf(amax, fmaxf(fabsf(x[g][2 * k]), fabsf(x[g][2 * k + 1])));
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
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int d = 128 * g + 8 * u + k;  // this value's NoPE dimension
      const int j = d >> 4;
      const int kk = direct_q_k(d & 15);
      const unsigned at = static_cast<unsigned>((j >> 2) * 2048) + swz(h, (2 * (j & 3)) + (kk >> 3)) + 2u * (kk & 7);
      sts16(sm.base + DirectPlan::kQ + at, ptx::float_to_fp16_bits(x[g][k] * sh));
    }
  }
  if (u < 8) {
    const unsigned w[4] = {raw[4].x, raw[4].y, raw[4].z, raw[4].w};
    unsigned o[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k] = f32x2_to_bf16x2(__uint_as_float(w[k] << 16) * sh, __uint_as_float(w[k] & 0xFFFF0000u) * sh);
    }
    sts128(sm.base + DirectPlan::kQRope + swz(h, u), make_uint4(o[0], o[1], o[2], o[3]));
  }
  if (u == 0) sm.f32(DirectPlan::kHeadScale)[h] = sl2 * pow2f(e - 8);
  fence_proxy_async_smem();  // the generic stores, read by wgmma's async proxy
  named_bar_sync(kBarDirectBoth, 256);
}

template <class Cfg>
__device__ __forceinline__ void producer_direct(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                                const DirectSmem& sm) {
  const MlaSparseParams& p = kp.p;
  const int lane = threadIdx.x & 31;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  BlockPos cur = first_block(kp, part, tok);
  int id0 = raw_id_at(part, cur, lane);
  int id1 = raw_id_at(part, cur, lane + 32);
  for (int it = 0; cur.r <= part.end_req; ++it) {
    const int c[2] = {checked_id(id0, pool), checked_id(id1, pool)};
    next_block(kp, part, tok, cur);
    id0 = raw_id_at(part, cur, lane);  // the next block's, in flight while this one waits
    id1 = raw_id_at(part, cur, lane + 32);
    // Fresh barriers complete "the phase before phase 0": the first pass of the ring waits for nothing.
    mbar_wait(sm.empty(it), ((it / kDirectRing) & 1) ^ 1);
    int* ids = sm.ids(it);
    const unsigned slot = sm.slot(it);
    const unsigned full = ptx::smem_addr(sm.full(it));
    bool zeroed = false;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int token = lane + 32 * k;
      ids[token] = c[k];
      const unsigned rec = slot + static_cast<unsigned>(token * kTokenBytes);
      if constexpr (kNoGather<Cfg>) {
        // Timing only: the slot keeps whatever it holds (knobs.cuh Ablate).
      } else if (c[k] >= 0) {
        bulk_load_shared(rec, record_of<Cfg>(p, c[k]), kTokenBytes, full);
      } else {
        for (int b = 0; b < kTokenBytes; b += 16) sts128(rec + b, make_uint4(0, 0, 0, 0));
        zeroed = true;
      }
    }
    // The zeros (generic proxy) before any later bulk copy (async proxy) into the same bytes.
    if (zeroed) fence_proxy_async_smem();
    const unsigned valid = kNoGather<Cfg> ? 0u
                                          : __popc(__ballot_sync(0xffffffffu, c[0] >= 0)) +
                                                __popc(__ballot_sync(0xffffffffu, c[1] >= 0));
    // Every lane arrives (its ids and zeros released by its own arrival), lane 0 with the copies'
    // bytes; they may complete before (the transaction count goes below zero): the phase completes
    // only with the 32 arrivals and all of them.
    if (lane == 0) {
      mbar_arrive_expect_tx_cta(sm.full(it), valid * static_cast<unsigned>(kTokenBytes));
    } else {
      mbar_arrive(sm.full(it));
    }
    if (lane == 0 && it == 0) timeline_mark<Cfg>(kEventFirstFull);
  }
}

// Cfg::kDirect 2, 3: the producer warpgroup's 16-byte cp.async. Warp w copies tokens 16 w ..
// 16 w + 15 of a block (lane l: bytes 16 l of each record, and 512 + 16 l for l < 9), a skipped
// id's 41 units as zeros (src-size 0: nothing read); each thread's copies complete on the slot's
// full barrier (.noinc arrivals, 128 of them) and each warp's lane 0 arrives once more after its
// ids are stored (release): 132 arrivals per phase.
template <class Cfg>
__device__ __forceinline__ void producer_copies(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                                const DirectSmem& sm) {
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;
  const int warp = tg >> 5, lane = tg & 31;
  const int mine = 16 * warp + (lane & 15);  // the token whose id this lane loads
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  BlockPos cur = first_block(kp, part, tok);
  int id = raw_id_at(part, cur, mine);
  for (int it = 0; cur.r <= part.end_req; ++it) {
    const int c = checked_id(id, pool);
    next_block(kp, part, tok, cur);
    id = raw_id_at(part, cur, mine);  // the next block's, in flight while this one waits
    mbar_wait(sm.empty(it), ((it / kDirectRing) & 1) ^ 1);
    if (lane < 16) sm.ids(it)[mine] = c;
    const unsigned slot = sm.slot(it) + static_cast<unsigned>(16 * warp * kTokenBytes + 16 * lane);
#pragma unroll 4
    for (int u = 0; u < 16; ++u) {
      const int cu = __shfl_sync(0xffffffffu, c, u);
      const bool ok = cu >= 0 && !kNoGather<Cfg>;
      const unsigned char* src = record_of<Cfg>(p, cu >= 0 ? cu : 0) + 16 * lane;
      const unsigned dst = slot + static_cast<unsigned>(u * kTokenBytes);
      ptx::cp_async_16(dst, src, ok);
      if (lane < (kTokenBytes - 512) / 16) ptx::cp_async_16(dst + 512, src + 512, ok);
    }
    ptx::cp_async_mbar_arrive_noinc(ptx::smem_addr(sm.full(it)));
    __syncwarp();  // the warp's ids before the arrival that publishes them
    if (lane == 0) mbar_arrive(sm.full(it));
    if (tg == 0 && it == 0) timeline_mark<Cfg>(kEventFirstFull);
  }
}

// One consumer warpgroup (wg 0, 1) of the direct kernel. In lockstep (kDirect 1, 2): NoPE groups
// 2 wg and 2 wg + 1, RoPE k steps 2 wg and 2 wg + 1, O^T of columns 256 wg .. 256 wg + 255
// (group-major, direct_column), the partial S^T added through shared memory. With alternate
// blocks (kDirect 3): blocks it with it % 2 = wg, all four groups and RoPE steps, O^T of all 512
// columns, the running state merged with the other warpgroup's at the request's end.
template <class Cfg>
__device__ __forceinline__ void consumer_direct(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                                const DirectSmem& sm, int wg) {
  constexpr bool kAlt = kDirectAlt<Cfg>;
  constexpr int kG = kAlt ? 4 : 2;  // NoPE groups of this warpgroup
  constexpr int kR = kAlt ? 4 : 2;  // RoPE k steps of this warpgroup
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const int i = lane >> 2, q = lane & 3;
  const int r0 = 16 * warp + i;  // S^T rows r0, r0 + 8: tokens; O^T rows: columns (direct_column)
  const int hA = 2 * q;
  const int heads[4] = {hA, hA + 1, hA + 8, hA + 9};
  const int g0 = kAlt ? 0 : 2 * wg;   // first NoPE group
  const int rs0 = kAlt ? 0 : 2 * wg;  // first RoPE k step
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale : 0.041666666666666664f;  // 1/sqrt(576)
  const float sl2 = scale * kLog2e;
  float* const spart = sm.f32(DirectPlan::kSPart);
  float* const xmax = sm.f32(DirectPlan::kXMax) + wg * (2 * 16 * 4);
  float* const xscale = sm.f32(DirectPlan::kXScale) + wg * (2 * 4 * 4);
  float* const xsum = sm.f32(DirectPlan::kXSum) + wg * (16 * 4);
  const int bar_wg = kBarDirectWg + wg;
  // Byte offsets inside a slot: this thread's S^T fragment words (row r0; + 8 rows is + 8
  // records), its P V fragment word (column 4 (8 w + i) of a group, records 2 q + ...), its scales.
  const unsigned s_off = static_cast<unsigned>(r0 * kTokenBytes + 4 * q);
  const unsigned pv_off = static_cast<unsigned>(2 * q * kTokenBytes + 4 * (8 * warp + i));
  // P's stores: heads' rows, tokens r0 and r0 + 8 at kappa 16 w + 2 i and + 1 (one byte pair;
  // direct_token), hi / lo halves of the row.
  const int kappa = 16 * warp + 2 * i;

  int it = 0;
  int nreq = 0;
  float o[8 * 2 * kG];  // m-block mb (group g0 + mb / 2) at o[8 mb ..], m64n16 accumulator layout
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of(kp, part, r);
    // Both warpgroups are past the previous request's reads of Q, the head scales, the sums
    // (and, alternating, the O^T exchange over Q's terms).
    if (nreq > 0) named_bar_sync(kBarDirectBoth, 256);
    if (pc.blk_begin < pc.blk_end) load_q_direct(p, sm, r, tok, threadIdx.x, sl2);
    if (threadIdx.x == 0 && nreq == 0) timeline_mark<Cfg>(kEventQ);
    float sl2h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) sl2h[k] = sm.f32(DirectPlan::kHeadScale)[heads[k]];
#pragma unroll
    for (int k = 0; k < 8 * 2 * kG; ++k) o[k] = 0.f;
    float m[4] = {kNegInf, kNegInf, kNegInf, kNegInf};
    float l[4] = {0.f, 0.f, 0.f, 0.f};
    int eg[kG];  // the groups' running scale exponents (every scale seen < 2^eg)
#pragma unroll
    for (int g = 0; g < kG; ++g) eg[g] = kExpFloor;
    const unsigned long long dq = smem_desc_sw128(sm.base + DirectPlan::kQ, 16, 1024);
    const unsigned long long dqr = smem_desc_sw128(sm.base + DirectPlan::kQRope, 16, 1024);
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      if (kAlt && (it & 1) != wg) continue;  // the other warpgroup's block
      mbar_wait(sm.full(it), (it / kDirectRing) & 1);
      if (t == 0 && it < 2) timeline_mark<Cfg>(kEventFirstTile);
      if constexpr (kNoConsume<Cfg>) {  // timing only: every slot released as soon as it is full
        if (lane == 0) mbar_arrive(sm.empty(it));
        continue;
      }
      const unsigned rec = sm.slot(it);
      // ---- S^T over this warpgroup's groups and RoPE steps ----
      // The keys' e4m3 words widened to f16 pairs (exact) for the f16 tensor cores, a group (8 k16
      // steps, 32 registers) at a time in two register sets: a set is rewritten once the group
      // that read it completed (wgmma.wait_group 1). The RoPE bf16 words go as they are.
      unsigned ar[kR][4];
#pragma unroll
      for (int ks = 0; ks < kR; ++ks) {
        const unsigned at = rec + s_off + static_cast<unsigned>(kDimNope + 16 + 32 * (rs0 + ks));
        ar[ks][0] = ptx::lds32(at);
        ar[ks][1] = ptx::lds32(at + 8 * kTokenBytes);
        ar[ks][2] = ptx::lds32(at + 16);
        ar[ks][3] = ptx::lds32(at + 8 * kTokenBytes + 16);
      }
      // Group g's scales of tokens r0 and r0 + 8.
      float scr[kG][2];
      {
        const unsigned at = rec + static_cast<unsigned>(r0 * kTokenBytes + kDimNope + 4 * g0);
        if constexpr (kAlt) {
          const uint4 u0 = ptx::lds128(at), u1 = ptx::lds128(at + 8 * kTokenBytes);
          const unsigned w0[4] = {u0.x, u0.y, u0.z, u0.w}, w1[4] = {u1.x, u1.y, u1.z, u1.w};
#pragma unroll
          for (int g = 0; g < kG; ++g) scr[g][0] = __uint_as_float(w0[g]), scr[g][1] = __uint_as_float(w1[g]);
        } else {
          const uint2 u0 = ptx::lds64(at), u1 = ptx::lds64(at + 8 * kTokenBytes);
          scr[0][0] = __uint_as_float(u0.x), scr[0][1] = __uint_as_float(u1.x);
          scr[kG - 1][0] = __uint_as_float(u0.y), scr[kG - 1][1] = __uint_as_float(u1.y);
        }
      }
      float acc[kG][8], racc[8];
      unsigned kf[2][8][4];  // [set][k16 step][fragment]
      const auto widen = [&](int g, unsigned (&f)[8][4]) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const unsigned at = rec + s_off + static_cast<unsigned>(128 * (g0 + g) + 32 * c);
          const uint2 h0 = e4m3x4_to_f16x4(ptx::lds32(at));
          const uint2 h1 = e4m3x4_to_f16x4(ptx::lds32(at + 8 * kTokenBytes));
          const uint2 h2 = e4m3x4_to_f16x4(ptx::lds32(at + 16));
          const uint2 h3 = e4m3x4_to_f16x4(ptx::lds32(at + 8 * kTokenBytes + 16));
          f[2 * c][0] = h0.x, f[2 * c][1] = h1.x, f[2 * c][2] = h0.y, f[2 * c][3] = h1.y;
          f[2 * c + 1][0] = h2.x, f[2 * c + 1][1] = h3.x, f[2 * c + 1][2] = h2.y, f[2 * c + 1][3] = h3.y;
        }
      };
      if constexpr (kNoMma<Cfg>) {  // timing only: the products left out, their operands still loaded
        widen(0, kf[0]);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
#pragma unroll
          for (int g = 0; g < kG; ++g) acc[g][k] = __uint_as_float(kf[0][k][g & 3] & 0x3F000000u);
          racc[k] = __uint_as_float(ar[k & 1][k >> 1] & 0x3F000000u);
        }
      } else {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          if (g >= 2) wgmma_wait<1>();  // group g - 2, the last reader of this set, completed
          widen(g, kf[g & 1]);
          wgmma_fence();
          const unsigned base = static_cast<unsigned>(8 * (g0 + g));  // k16 step of the group's first
#pragma unroll
          for (int st = 0; st < 8; ++st) {
            const unsigned j = base + st;
            wgmma_m64n16k16_f16_rs(acc[g], kf[g & 1][st], desc_advance(dq, (j >> 2) * 2048 + 32 * (j & 3)), st > 0);
          }
          wgmma_commit();
        }
#pragma unroll
        for (int ks = 0; ks < kR; ++ks) {
          wgmma_m64n16k16_rs(racc, ar[ks], desc_advance(dqr, static_cast<unsigned>(32 * (rs0 + ks))), ks > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int g = 0; g < kG; ++g) fence_regs(acc[g]);
        fence_regs(racc);
      }
      // Rows r0 (k = 0, 1, 4, 5) and r0 + 8 (k = 2, 3, 6, 7): scale x group products + RoPE.
      float s[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int hr = (k >> 1) & 1;
        float v = racc[k];
#pragma unroll
        for (int g = kG - 1; g >= 0; --g) v = fmaf(scr[g][hr], acc[g][k], v);
        s[k] = v;
      }
      if constexpr (!kAlt) {
        // The other warpgroup's partial at the same positions (thread t of both holds the same
        // tokens and heads); buffers by block parity. Warpgroup 0's partial first in both sums.
        float* mine = spart + ((wg * 2 + (it & 1)) * 2) * 512;
        *reinterpret_cast<float4*>(mine + 4 * t) = make_float4(s[0], s[1], s[2], s[3]);
        *reinterpret_cast<float4*>(mine + 512 + 4 * t) = make_float4(s[4], s[5], s[6], s[7]);
        named_bar_sync(kBarDirectBoth, 256);
        const float* other = spart + (((1 - wg) * 2 + (it & 1)) * 2) * 512;
        const float4 u0 = *reinterpret_cast<const float4*>(other + 4 * t);
        const float4 u1 = *reinterpret_cast<const float4*>(other + 512 + 4 * t);
        const float ov[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) s[k] = wg == 0 ? s[k] + ov[k] : ov[k] + s[k];
      }
      const int* ids = sm.ids(it);
      if (ids[r0] < 0) s[0] = s[1] = s[4] = s[5] = kNegInf;
      if (ids[r0 + 8] < 0) s[2] = s[3] = s[6] = s[7] = kNegInf;
      // ---- the column softmax (narrow.cuh's, per head scale) and the groups' scale maxima ----
      float bm[4] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3]), fmaxf(s[4], s[6]), fmaxf(s[5], s[7])};
      float gm[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) gm[g] = fmaxf(scr[g][0], scr[g][1]);
#pragma unroll
      for (int x = 4; x < 32; x *= 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) bm[k] = fmaxf(bm[k], __shfl_xor_sync(0xffffffffu, bm[k], x));
#pragma unroll
        for (int g = 0; g < kG; ++g) gm[g] = fmaxf(gm[g], __shfl_xor_sync(0xffffffffu, gm[g], x));
      }
      // Lockstep: buffers by block parity (a warp writes block it + 2's only after every warp's
      // reads of block it: they precede block it + 1's barriers). Alternating: one buffer, the
      // P barrier between a block's reads and the warpgroup's next block's writes.
      const int par = kAlt ? 0 : (it & 1);
      float* const xm = xmax + par * (16 * 4);
      float* const xs = xscale + par * (4 * 4);
      if (lane < 4) {
#pragma unroll
        for (int k = 0; k < 4; ++k) xm[heads[k] * 4 + warp] = bm[k];
      }
      if (lane == 0) {
#pragma unroll
        for (int g = 0; g < kG; ++g) xs[4 * g + warp] = gm[g];
      }
      named_bar_sync(bar_wg, 128);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(xm + heads[k] * 4);
        bm[k] = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      }
      float rho[kG], gmul[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float4 v = *reinterpret_cast<const float4*>(xs + 4 * g);
        const int e = exponent_above(fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        const int en = e > eg[g] ? e : eg[g];
        rho[g] = en - eg[g] > 126 ? 0.f : pow2f(eg[g] - en);
        eg[g] = en;
        gmul[g] = pow2f(8 - en);
      }
      float alpha[4], ref[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float mn = fmaxf(m[k], bm[k] * sl2h[k]);
        ref[k] = row_ref(mn);
        alpha[k] = ptx::ex2(m[k] - ref[k]);
        m[k] = mn;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int h = (k & 1) + 2 * (k >> 2);
        s[k] = ptx::ex2(fmaf(s[k], sl2h[h], -ref[h]));
      }
      l[0] = l[0] * alpha[0] + (s[0] + s[2]);
      l[1] = l[1] * alpha[1] + (s[1] + s[3]);
      l[2] = l[2] * alpha[2] + (s[4] + s[6]);
      l[3] = l[3] * alpha[3] + (s[5] + s[7]);
      // ---- P_g = P x scale_g x 2^(8 - eg) as e4m3 hi + lo, transposed into the slot ----
      // (This warpgroup's slots of this parity were last read by its previous block's P V, waited for.)
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const unsigned pb = sm.p(it, g0 + g);
        const float f0 = scr[g][0] * gmul[g], f1 = scr[g][1] * gmul[g];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {  // heads hA + 8 nb, + 1: s[4 nb ..]
          unsigned hi, lo;
          kv::split_e4m3_f16(s[4 * nb] * f0, s[4 * nb + 2] * f1, s[4 * nb + 1] * f0, s[4 * nb + 3] * f1, hi, lo);
          const int h = hA + 8 * nb;
          sts16(pb + swz(h, kappa >> 4) + (kappa & 15), hi);
          sts16(pb + swz(h + 1, kappa >> 4) + (kappa & 15), hi >> 16);
          sts16(pb + swz(h, 4 + (kappa >> 4)) + (kappa & 15), lo);
          sts16(pb + swz(h + 1, 4 + (kappa >> 4)) + (kappa & 15), lo >> 16);
        }
      }
      fence_proxy_async_smem();
      named_bar_sync(bar_wg, 128);
      // ---- O^T *= alpha x rho, += V^T P^T ----
      {
        bool ones = alpha[0] == 1.f && alpha[1] == 1.f && alpha[2] == 1.f && alpha[3] == 1.f;
#pragma unroll
        for (int g = 0; g < kG; ++g) ones = ones && rho[g] == 1.f;
        if (!__all_sync(0xffffffffu, ones)) {
#pragma unroll
          for (int k = 0; k < 8 * 2 * kG; ++k) {
            const int h = (k & 1) + 2 * ((k >> 2) & 1);
            o[k] *= alpha[h] * rho[k >> 4];
          }
        }
      }
      unsigned v[kG][2][2][4];  // [group][k step][m-block of the pair][fragment]
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            unsigned w[4], tr[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int tk = 32 * ks + 16 * e + 8 * (j & 1) + (j >> 1);  // + 2 q in pv_off
              w[j] = ptx::lds32(rec + pv_off + static_cast<unsigned>(tk * kTokenBytes + 128 * (g0 + g)));
            }
            transpose4x4(w, tr);
            v[g][ks][0][2 * e] = tr[0];
            v[g][ks][0][2 * e + 1] = tr[1];
            v[g][ks][1][2 * e] = tr[2];
            v[g][ks][1][2 * e + 1] = tr[3];
          }
        }
      }
      // Every read of the slot is done (the loads above completed into registers): release it.
      if (lane == 0) mbar_arrive(sm.empty(it));
      if constexpr (kNoMma<Cfg>) {
#pragma unroll
        for (int k = 0; k < 8 * 2 * kG; ++k) {
          o[k] += __uint_as_float(v[k >> 4][(k >> 3) & 1][(k >> 2) & 1][k & 3] & 0x3F000000u);
        }
        continue;
      }
      wgmma_fence();
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const unsigned long long dp = smem_desc_sw128(sm.p(it, g0 + g), 16, 1024);
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float* const om = o + 8 * (2 * g + h);
            wgmma_m64n16k32_e4m3_rs(om, v[g][ks][h], desc_advance(dp, 32 * ks), true);
            wgmma_m64n16k32_e4m3_rs(om, v[g][ks][h], desc_advance(dp, 64 + 32 * ks), true);
          }
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
    }
    if (t == 0) timeline_mark<Cfg>(kEventLastRelease);

    // ---- the request's sums, factors, outputs ----
    head_sums(l, xsum, heads, warp, lane, bar_wg);
    // O^T in true units: x 2^(eg - 8) per group (rows), then per head.
    float gsc[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) gsc[g] = pow2f(eg[g] - 8);
    if constexpr (kAlt) {
      // Both warpgroups' states to shared memory; each head's maximum M over both, each side's
      // weight 2^(m_w - M) (0 for a side that saw no valid key), the sum over both.
      float* const xst = sm.f32(DirectPlan::kXState);
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          xst[wg * 32 + heads[k]] = m[k];
          xst[wg * 32 + 16 + heads[k]] = l[k];
        }
      }
      named_bar_sync(kBarDirectBoth, 256);
      float wmine[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float mo = xst[(1 - wg) * 32 + heads[k]], lo = xst[(1 - wg) * 32 + 16 + heads[k]];
        const float mm = fmaxf(m[k], mo);
        wmine[k] = m[k] == kNegInf ? 0.f : ptx::ex2(m[k] - mm);
        const float wother = mo == kNegInf ? 0.f : ptx::ex2(mo - mm);
        // Warpgroup 0's term first in both sums.
        l[k] = wg == 0 ? l[k] * wmine[k] + lo * wother : lo * wother + l[k] * wmine[k];
        m[k] = mm;
      }
      float* const ox = sm.f32(DirectPlan::kOX);
      if (wg == 1) {
#pragma unroll
        for (int k = 0; k < 64; ++k) {
          const int h = (k & 1) + 2 * ((k >> 2) & 1);
          ox[k * 128 + t] = o[k] * wmine[h] * gsc[k >> 4];
        }
      }
      named_bar_sync(kBarDirectBoth, 256);
      if (wg == 1) continue;  // warpgroup 0 writes the request's outputs
#pragma unroll
      for (int k = 0; k < 64; ++k) {
        const int h = (k & 1) + 2 * ((k >> 2) & 1);
        o[k] = fmaf(o[k] * wmine[h], gsc[k >> 4], ox[k * 128 + t]);
      }
#pragma unroll
      for (int g = 0; g < kG; ++g) gsc[g] = 1.f;
    }
    float f[4], lse[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float fi[2], li[2];
      output_factors(p, pc, 0, heads[k], l[k], 0.f, m[k], kNegInf, fi, li);
      f[k] = fi[0];
      lse[k] = li[0];
    }
    // The thread's columns: 4 adjacent ones per group at 128 G + 4 (8 w + i), G = g0 + g.
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const int col = 128 * (g0 + g) + 4 * (8 * warp + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // head heads[k]: accumulator registers kr, kr + 2 of m-blocks 2 g, 2 g + 1
        const int head = heads[k];
        if (head >= p.num_heads) continue;
        const int kr = (k & 1) + 4 * (k >> 1);
        const float fk = f[k] * gsc[g];
        const float v0 = o[16 * g + kr] * fk, v1 = o[16 * g + kr + 2] * fk;
        const float v2 = o[16 * g + 8 + kr] * fk, v3 = o[16 * g + 8 + kr + 2] * fk;
        if (pc.split) {
          float* dst =
              kp.run.partial_o + ((static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head) * kDimV + col;
          *reinterpret_cast<float4*>(dst) = make_float4(v0, v1, v2, v3);
        } else {
          unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch +
                                tok * p.out_stride_token + head * p.out_stride_head + col;
          *reinterpret_cast<uint2*>(dst) = make_uint2(f32x2_to_bf16x2(v0, v1), f32x2_to_bf16x2(v2, v3));
        }
      }
    }
    if (wg == 0 && warp == 0 && lane < 4) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float pair[2] = {lse[k], lse[k + 2]};  // heads hA + k and hA + k + 8
        store_lse(kp, pc, r, tok, 0, heads[k], pair);
      }
    }
    if (t == 0) timeline_mark<Cfg>(kEventOut0);
  }
}

template <class Cfg>
__device__ __forceinline__ void mla_sparse_direct_sm90(const DecodeKernelParams& kp, unsigned char* smem_raw) {
  static_assert(ClusterOf<Cfg>::value == 1 && ProducersOf<Cfg>::value == 1,
                "Cfg::kDirect: one head block of at most 16 heads, 384 threads");
  static_assert(DirectOf<Cfg>::value >= 1 && DirectOf<Cfg>::value <= 3, "Cfg::kDirect: 1..3");
  if (threadIdx.x == 0) timeline_mark<Cfg>(kEventEntry);
  grid_dependency_wait();
  const SparsePart part = kp.run.parts[blockIdx.z];
  const bool matches = schedule_matches(kp.p, kp.run);
  const unsigned raw = ptx::smem_addr(smem_raw);
  DirectSmem sm;
  sm.base = (raw + 1023u) & ~1023u;
  sm.ptr = smem_raw + (sm.base - raw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kDirectRing; ++s) {
      // The producer: its warp's 32 arrivals (bulk copies' bytes on top), or 128 copy-completion
      // arrivals and 4 warps' id releases. The consumers: lane 0 of each warp reading the slot.
      mbar_init(sm.full(s), kDirectCopies<Cfg> ? 132 : 32);
      mbar_init(sm.empty(s), kDirectAlt<Cfg> ? 4 : 8);
    }
    fence_mbar_init();
  }
  __syncthreads();
  if (!matches) {
    fill_nan_outputs(kp.p, 0, kHeadsPerCta, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z),
                     static_cast<int>(gridDim.z));
    return;
  }
  if (threadIdx.x == 0) timeline_mark<Cfg>(kEventStart);
  const int tok = blockIdx.y;
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 2) {
    setmaxnreg_dec<40>();
    if constexpr (kDirectCopies<Cfg>) {
      producer_copies<Cfg>(kp, part, tok, sm);
    } else if (threadIdx.x < 288) {
      producer_direct<Cfg>(kp, part, tok, sm);
    }
  } else {
    setmaxnreg_inc<232>();
    consumer_direct<Cfg>(kp, part, tok, sm, wg);
  }
  launch_dependents();
  if (threadIdx.x == 0) timeline_mark<Cfg>(kEventExit);
}

}  // namespace deca::mla::sm90
