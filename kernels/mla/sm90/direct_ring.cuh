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
// 0..63 of a head's row, lo at 64..127; 64 tokens each). At a request's end (Q no longer read)
// warpgroup 1 hands its O^T (512 x 16 f32, 32 KB) to warpgroup 0 through the first 32 KB: 16 KB
// of their own, then Q's NoPE terms. The exchange areas of the block maxima and group scales
// keep two buffers per warpgroup; the alternating consumers use the first.
struct DirectPlan {
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
static_assert(DirectPlan::kQ % 1024 == 0 && DirectPlan::kP % 1024 == 0 && DirectPlan::kRing % 16 == 0,
              "swizzle atoms, copy alignment");
static_assert(DirectPlan::kOX + 64 * 128 * 4 <= DirectPlan::kQRope, "O^T's exchange: its own 16 KB and Q's terms");
static_assert(DirectPlan::kBarFull % 8 == 0, "mbarrier alignment");
static_assert(DirectPlan::kEnd + 1024 <= kSmemBytes, "the plan fits what the backend asks at launch");

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
  __device__ __forceinline__ mbar_t* bar(int offset) const { return reinterpret_cast<mbar_t*>(ptr + offset); }
};

// Both consumer warpgroups meet: every thread's earlier shared-memory accesses are released by its
// arrival and acquired by every thread's wait (`parity`: the barrier's phase, one per use).
__device__ __forceinline__ void rendezvous(mbar_t* bar, unsigned parity) {
  mbar_arrive(bar);
  mbar_wait(bar, parity);
}

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
}

// The producer warpgroup's 16-byte cp.async (LDGSTS). Warp w copies tokens 16 w ..
// 16 w + 15 of a block (lane l: bytes 16 l of each record, and 512 + 16 l for l < 9), a skipped
// id's 41 units as zeros (src-size 0: nothing read); each thread's copies complete on the slot's
// full barrier (.noinc arrivals, 128 of them) and each thread arrives once more after its id is
// stored (a release of its own stores, which is what racecheck follows): 256 arrivals per phase.
template <class Cfg>
__device__ __forceinline__ void producer_copies(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                                const DirectSmem& sm) {
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;
  const int warp = tg >> 5, lane = tg & 31;
  const int mine = 16 * warp + (lane & 15);  // the token whose id this lane loads
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  BlockPos<Cfg> cur = first_block<Cfg>(kp, part, tok);
  RawId id = raw_id_at<Cfg>(part, cur, mine);
  [[maybe_unused]] int bad_it = -1;  // checked: the first block whose id of this lane was refused
  for (int it = 0; cur.r <= part.end_req; ++it) {
    const int c = finish_id<Cfg>(kp, id, pool);
    if constexpr (kChecked<Cfg>) bad_it = first_refused<Cfg>(id, c, it, bad_it);  // checked.cuh
    next_block<Cfg>(kp, part, tok, cur);
    id = raw_id_at<Cfg>(part, cur, mine);  // the next block's, in flight while this one waits
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
    mbar_arrive(sm.full(it));
  }
  if constexpr (kChecked<Cfg>) {
    if (lane < 16) report_refused<Cfg>(kp, part, tok, bad_it, mine, pool);  // 16..31 hold the same ids
    if (warp == 0) check_lengths<Cfg>(kp, part, lane);
  }
}

}  // namespace deca::mla::sm90
