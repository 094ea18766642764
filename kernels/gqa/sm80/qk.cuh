// The portable GQA kernel's S = q K^T (decode.cuh) for one chunk of kChunk tokens (kChunk / 8 n8
// tiles) of the warp's 16 rows, on the path of the cache's type: 16-bit K as is; 8-bit K widened
// to fp16 from ldmatrix loads; or K kept 8-bit against q's two terms on the 8-bit mma (e4m3 for
// fp8, IMMA for int8). `ks`: the stage's K tile; `local0`: the chunk's first token row in it.
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/q_operand.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// The two-term paths' working arrays: int8's int32 sums of a pair of n8 tiles (one per q term) and
// q's two terms of a k step. Arrays of the kernel's (gqa_decode_kernel says why), referenced here.
struct QkScratch {
  int (&s_hi)[2][4];
  int (&s_lo)[2][4];
  unsigned (&qh)[4];
  unsigned (&ql)[4];
};

// 8-bit K rows of n8 tiles j and j + 1 at k step kk of kStep bytes, straight from shared memory
// (ldmatrix on 8-bit rows gives thread (g, c) bytes 4c..4c+3 of row g, dims in natural order):
// the two-term paths' m16n8k32 B fragments (kStep 32), or two m16n8k16 steps' raw bytes to widen
// (kStep 16).
template <class T, int kStep = 32>
__device__ __forceinline__ void load_k8(unsigned ks, int local0, int lane, int j, int kk, unsigned& b0,
                                        unsigned& b1, unsigned& b2, unsigned& b3) {
  const int m = lane / 8;
  if (kk * kStep + 16 < T::kHeadDim) {
    // x4: (tokens 0-7, bytes 0-15), (tokens 0-7, bytes 16-31), (tokens 8-15, ...) x2.
    const int tok = local0 + j * 8 + (m / 2) * 8 + lane % 8;
    ptx::ldmatrix_x4(ks + tok * T::kRowStride + kk * kStep + (m % 2) * 16, b0, b1, b2, b3);
  } else {
    // 16 bytes left: (tokens 0-7), (tokens 8-15); the upper half is zero on both sides (padding
    // bytes of the row could hold anything, NaN codes included).
    const int tok = local0 + j * 8 + (m % 2) * 8 + lane % 8;
    ptx::ldmatrix_x2(ks + tok * T::kRowStride + kk * kStep, b0, b2);
    b1 = b3 = 0u;
  }
}

// int8 K on IMMA against q's two int8 terms: the fp8 two-term loop with the loops swapped, per
// pair of n8 tiles every k step, so that only this pair's int32 sums are live (16 registers, not
// 2 * kN8 * 4): one per q term, each starting at its bias (kv_convert.cuh kMagicBits); the low one
// is shifted into the high one after the last step. q is in registers, or (head_dim > 128) the
// chunk is 16 tokens: one pair, so nothing is loaded twice.
template <class T, int kN8>
__device__ __forceinline__ void qk_two_term_s8(const QOperand<T>& q, unsigned ks, int local0, const Lane& ln,
                                               float (&s_acc)[kN8][4], QkScratch& x) {
  int (&s_hi)[2][4] = x.s_hi;
  int (&s_lo)[2][4] = x.s_lo;
  unsigned (&qh)[4] = x.qh;
  unsigned (&ql)[4] = x.ql;
#pragma unroll
  for (int j = 0; j < kN8; j += 2) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s_hi[0][e] = s_hi[1][e] = kv::kMagicBits;
      s_lo[0][e] = s_lo[1][e] = 64;
    }
#pragma unroll
    for (int kk = 0; kk < T::kK32Steps; ++kk) {
      q.a8(kk, 0, ln, qh);
      q.a8(kk, 1, ln, ql);
      unsigned b0, b1, b2, b3;
      load_k8<T>(ks, local0, ln.lane, j, kk, b0, b1, b2, b3);
      ptx::mma_s8_16832(s_hi[0], qh, b0, b1);
      ptx::mma_s8_16832(s_lo[0], ql, b0, b1);
      ptx::mma_s8_16832(s_hi[1], qh, b2, b3);
      ptx::mma_s8_16832(s_lo[1], ql, b2, b3);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s_acc[j][e] = kv::magic_to_float(s_hi[0][e] + (s_lo[0][e] >> 7));
      s_acc[j + 1][e] = kv::magic_to_float(s_hi[1][e] + (s_lo[1][e] >> 7));
    }
  }
}

// fp8 K on the e4m3 mma (sm_89+) against q's two e4m3 terms: both terms share every K fragment.
template <class T, int kN8>
__device__ __forceinline__ void qk_two_term_e4m3(const QOperand<T>& q, unsigned ks, int local0,
                                                 const Lane& ln, float (&s_acc)[kN8][4], QkScratch& x) {
  unsigned (&qh)[4] = x.qh;
  unsigned (&ql)[4] = x.ql;
#pragma unroll
  for (int kk = 0; kk < T::kK32Steps; ++kk) {
    q.a8(kk, 0, ln, qh);
    q.a8(kk, 1, ln, ql);
#pragma unroll
    for (int j = 0; j < kN8; j += 2) {
      unsigned b0, b1, b2, b3;
      load_k8<T>(ks, local0, ln.lane, j, kk, b0, b1, b2, b3);
      ptx::mma_e4m3_16832(s_acc[j], qh, b0, b1);
      ptx::mma_e4m3_16832(s_acc[j], ql, b0, b1);
      ptx::mma_e4m3_16832(s_acc[j + 1], qh, b2, b3);
      ptx::mma_e4m3_16832(s_acc[j + 1], ql, b2, b3);
    }
  }
}

// 8-bit K widened to fp16: ldmatrix on 8-bit rows gives thread (g, c) bytes 4c..4c+3 of token g
// per matrix; one x4 feeds two tiles x two k steps.
template <class T, int kN8>
__device__ __forceinline__ void qk_widen_ldsm(const QOperand<T>& q, unsigned ks, int local0, const Lane& ln,
                                              float (&s_acc)[kN8][4]) {
  constexpr int kKSteps = T::kHeadDim / 16;
  constexpr bool kFp16 = T::kComputeFp16;
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk += 2) {
    const bool pair = kk + 1 < kKSteps;  // compile-time after unrolling
    unsigned a0[4], a1[4];
    q.a16(kk, ln, a0);
    if (pair) q.a16(kk + 1, ln, a1);
#pragma unroll
    for (int j = 0; j < kN8; j += 2) {
      // x4: (tokens 0-7, step kk), (tokens 0-7, kk + 1), (tokens 8-15, kk), (8-15, kk + 1); the
      // last step alone (x2) when there is no pair.
      unsigned w0, w1, w2, w3;
      load_k8<T, 16>(ks, local0, ln.lane, j, kk, w0, w1, w2, w3);
      unsigned b0, b1;
      kv::widen4<T::kKvKind>(w0, b0, b1);
      ptx::mma_16816<kFp16>(s_acc[j], a0, b0, b1);
      kv::widen4<T::kKvKind>(w2, b0, b1);
      ptx::mma_16816<kFp16>(s_acc[j + 1], a0, b0, b1);
      if (pair) {
        kv::widen4<T::kKvKind>(w1, b0, b1);
        ptx::mma_16816<kFp16>(s_acc[j], a1, b0, b1);
        kv::widen4<T::kKvKind>(w3, b0, b1);
        ptx::mma_16816<kFp16>(s_acc[j + 1], a1, b0, b1);
      }
    }
  }
}

// 16-bit K as stored.
template <class T, int kN8>
__device__ __forceinline__ void qk_16bit(const QOperand<T>& q, unsigned ks, int local0, const Lane& ln,
                                         float (&s_acc)[kN8][4]) {
  constexpr int kKSteps = T::kHeadDim / 16;
  constexpr bool kFp16 = T::kComputeFp16;
  const int lane = ln.lane;
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    unsigned a[4];
    q.a16(kk, ln, a);
#pragma unroll
    for (int j = 0; j < kN8; j += 2) {
      // x4: (tokens 0-7, dims 0-7), (tokens 0-7, dims 8-15), (tokens 8-15, ...) x2.
      const int m = lane / 8;
      const int tok = local0 + j * 8 + (m / 2) * 8 + lane % 8;
      const unsigned addr = ks + tok * T::kRowStride + (kk * 16 + (m % 2) * 8) * 2;
      unsigned b0, b1, b2, b3;
      ptx::ldmatrix_x4(addr, b0, b1, b2, b3);
      ptx::mma_16816<kFp16>(s_acc[j], a, b0, b1);
      ptx::mma_16816<kFp16>(s_acc[j + 1], a, b2, b3);
    }
  }
}

// s_acc = q K^T for the chunk (zeroed first: the mma paths accumulate into it).
template <class T, int kN8>
__device__ __forceinline__ void qk_chunk(const QOperand<T>& q, unsigned ks, int local0, const Lane& ln,
                                         float (&s_acc)[kN8][4], QkScratch& x) {
#pragma unroll
  for (int j = 0; j < kN8; ++j) s_acc[j][0] = s_acc[j][1] = s_acc[j][2] = s_acc[j][3] = 0.f;
  if constexpr (T::kTwoTermI8) {
    qk_two_term_s8<T>(q, ks, local0, ln, s_acc, x);
  } else if constexpr (T::kTwoTerm) {
    qk_two_term_e4m3<T>(q, ks, local0, ln, s_acc, x);
  } else if constexpr (T::kLdsm8) {
    qk_widen_ldsm<T>(q, ks, local0, ln, s_acc);
  } else {
    qk_16bit<T>(q, ks, local0, ln, s_acc);
  }
}

}  // namespace deca::gqa
