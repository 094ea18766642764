// The portable GQA kernel's q (decode.cuh): each warp's 16 rows as mma A fragments, loaded once
// per CTA, in registers up to head_dim 128 or staged in shared memory beyond (where the output
// accumulators need the registers). 16-bit caches take q in their own type; 8-bit caches take it
// scaled per row by a power of two into fp16 range (the inverse goes to that row's logits), or,
// on the two-term path, split into two terms of the cache's type.
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// Two consecutive q values (d, d+1) of a row, as floats.
template <class T>
__device__ __forceinline__ float2 q_pair(const void* q_row, int d) {
  const unsigned raw = *reinterpret_cast<const unsigned*>(
      static_cast<const unsigned short*>(q_row) + d);
  const unsigned short lo = static_cast<unsigned short>(raw & 0xFFFF);
  const unsigned short hi = static_cast<unsigned short>(raw >> 16);
  if constexpr (T::kQDtype == kv::kFP16) {
    return make_float2(ptx::fp16_bits_to_float(lo), ptx::fp16_bits_to_float(hi));
  } else {
    return make_float2(ptx::bf16_bits_to_float(lo), ptx::bf16_bits_to_float(hi));
  }
}

// The int8 two-term path's q scale: 127 / amax, so that the row's largest |q| is the largest
// int8 term (not a power of two: the inverse applied to the logits is rounded, a relative 2^-24
// on every logit of the row, which the softmax does not see). Capped at 2^126 (no inf for
// subnormal rows); 1 for an all-zero row.
__device__ __forceinline__ float q_row_scale_s8(float amax) {
  if (!(amax > 0.f) || amax > 3.0e38f) return 1.f;
  return fminf(127.f / amax, __uint_as_float(253u << 23));
}

// K-dimension order inside a 16-wide k step: the 16-bit path is the mma's own (pairs at 2c and
// 2c+8); the 8-bit K path gets 4 consecutive bytes per thread from ldmatrix (dims 4c..4c+3), so q
// is permuted the same way: the dot product does not care about the order of its terms.
template <class T>
__device__ __forceinline__ int q_dim(int kk, int c, int half) {
  if constexpr (T::kKvKind == kv::kKv16) return kk * 16 + half * 8 + 2 * c;
  return kk * 16 + 4 * c + 2 * half;
}

// q's layout: registers up to head_dim 128 (16-bit fragments, or the two-term path's two terms),
// else shared memory after the pipeline / merge area, which it outlives.
template <class T>
struct QLayout {
  static constexpr int D = T::kHeadDim;
  static constexpr int kKSteps = D / 16;
  static constexpr int kFragSteps = T::kQInRegs && !T::kTwoTerm ? kKSteps : 1;
  static constexpr int kFrag8Steps = T::kQInRegs && T::kTwoTerm ? T::kK32Steps : 1;
  static constexpr int kQTop = T::kTwoTerm ? 7 : 14;  // q_row_scale's target exponent
  static constexpr bool kFp16 = T::kComputeFp16;

  static __device__ __forceinline__ unsigned smem(unsigned smem_base) {
    return smem_base + (T::kPipeBytes > T::kMergeBytes ? T::kPipeBytes : T::kMergeBytes);
  }
  static __device__ __forceinline__ float scale_of(float amax) {
    return T::kTwoTermI8 ? q_row_scale_s8(amax) : q_row_scale(amax, kQTop);
  }
  // Four scaled q values -> the two terms of the cache's type.
  static __device__ __forceinline__ void split(float x0, float x1, float x2, float x3, unsigned& hi,
                                               unsigned& lo) {
    if constexpr (T::kTwoTermI8) {
      kv::split_s8_f32(x0, x1, x2, x3, hi, lo);
    } else {
      kv::split_e4m3_f32(x0, x1, x2, x3, hi, lo);
    }
  }
};

// The thread's two q rows, g and g + 8 of its warp's 16: whether each is one of the CTA's, and its
// q (null past the CTA's rows).
struct ThreadQRows {
  bool lo_ok, hi_ok;
  const void* q_lo;
  const void* q_hi;
};

template <class T>
__device__ __forceinline__ ThreadQRows thread_q_rows(const GqaParams& p, const CtaCoords<T>& cta, const Lane& ln) {
  const int row_lo = cta.row0 + ln.warp_m * 16 + ln.g;
  const int row_hi = row_lo + 8;
  const bool lo_ok = row_lo < cta.rows_total;
  const bool hi_ok = row_hi < cta.rows_total;
  return {lo_ok, hi_ok, lo_ok ? cta.q_row(p, row_lo) : nullptr, hi_ok ? cta.q_row(p, row_hi) : nullptr};
}

// The loads below fill the kernel's row_inv[h]: the inverse of the power of two the thread's row
// g + 8 h was scaled by (8-bit caches), applied to that row's logits. The register loads stage
// the rows in arrays of the kernel's (f, amax, sc; gqa_decode_kernel says why).

// Two-term q in registers: per 32-dim k step, the hi and lo terms of the A fragment (rows g / g+8,
// dims 4c..4c+3 and 16 + 4c..), natural dim order; dims past head_dim are zero.
template <class T>
__device__ __forceinline__ void load_q_two_term(const GqaParams& p, const CtaCoords<T>& cta, const Lane& ln,
                                                float (&row_inv)[2],
                                                unsigned (&frag8)[QLayout<T>::kFrag8Steps][2][4],
                                                float4 (&f)[T::kK32Steps][4], float (&amax)[2], float (&sc)[2]) {
  using Q = QLayout<T>;
  constexpr int D = Q::D;
  const auto [lo_ok, hi_ok, q_lo, q_hi] = thread_q_rows<T>(p, cta, ln);
  const int c = ln.c;
  amax[0] = amax[1] = 0.f;
#pragma unroll
  for (int kk = 0; kk < T::kK32Steps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int d = kk * 32 + (j / 2) * 16 + 4 * c;
      const bool ok = ((j % 2) ? hi_ok : lo_ok) && d < D;
      const void* qr = (j % 2) ? q_hi : q_lo;
      const float2 a = ok ? q_pair<T>(qr, d) : make_float2(0.f, 0.f);
      const float2 b = ok ? q_pair<T>(qr, d + 2) : make_float2(0.f, 0.f);
      f[kk][j] = make_float4(a.x, a.y, b.x, b.y);
      amax[j % 2] = fmaxf(amax[j % 2], fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y))));
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
    sc[h] = Q::scale_of(amax[h]);
    row_inv[h] = 1.f / sc[h];  // exact for e4m3 (a power of two); int8: see q_row_scale_s8
  }
#pragma unroll
  for (int kk = 0; kk < T::kK32Steps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float s = sc[j % 2];
      Q::split(f[kk][j].x * s, f[kk][j].y * s, f[kk][j].z * s, f[kk][j].w * s, frag8[kk][0][j],
               frag8[kk][1][j]);
    }
  }
}

// 16-bit q in registers, in q_dim's order (8-bit caches: scaled per row).
template <class T>
__device__ __forceinline__ void load_q_16bit(const GqaParams& p, const CtaCoords<T>& cta, const Lane& ln,
                                             float (&row_inv)[2], unsigned (&frag)[QLayout<T>::kFragSteps][4],
                                             float2 (&f)[QLayout<T>::kKSteps][4], float (&sc)[2],
                                             float (&amax)[2]) {
  using Q = QLayout<T>;
  constexpr int kKSteps = Q::kKSteps;
  const auto [lo_ok, hi_ok, q_lo, q_hi] = thread_q_rows<T>(p, cta, ln);
  const int c = ln.c;
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = (j % 2) ? hi_ok : lo_ok;
      f[kk][j] = ok ? q_pair<T>((j % 2) ? q_hi : q_lo, q_dim<T>(kk, c, j / 2)) : make_float2(0.f, 0.f);
    }
  }
  sc[0] = sc[1] = 1.f;
  if constexpr (T::kScaleQRows) {
    amax[0] = amax[1] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        amax[j % 2] = fmaxf(amax[j % 2], fmaxf(fabsf(f[kk][j].x), fabsf(f[kk][j].y)));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
      sc[h] = q_row_scale(amax[h], Q::kQTop);
      row_inv[h] = 1.f / sc[h];  // exact: a power of two
    }
  }
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      frag[kk][j] = ptx::pack2<Q::kFp16>(f[kk][j].x * sc[j % 2], f[kk][j].y * sc[j % 2]);
    }
  }
}

// q in shared memory at `q_smem`: natural order, compute type, one row per kQRowStride bytes, each
// row at its own scale (`row_scale`: a shared float per CTA row, the kernel's).
template <class T>
__device__ __forceinline__ void load_q_shared(const GqaParams& p, const CtaCoords<T>& cta, const Lane& ln,
                                              unsigned q_smem, float* row_scale, float (&row_inv)[2]) {
  using Q = QLayout<T>;
  constexpr int D = Q::D;
  for (int r = ln.tid; r < T::kRows; r += T::kThreads) {
    float amax = 0.f;
    if (T::kScaleQRows && cta.row0 + r < cta.rows_total) {
      const void* qr = cta.q_row(p, cta.row0 + r);
      for (int d = 0; d < D; d += 2) {
        const float2 v = q_pair<T>(qr, d);
        amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
      }
    }
    row_scale[r] = T::kScaleQRows ? Q::scale_of(amax) : 1.f;
  }
  __syncthreads();
  if constexpr (T::kTwoTerm) {
    // Two-term: per row the hi bytes of every dim, then the lo bytes (2 * head_dim bytes fit the
    // 16-bit row stride).
    for (int i = ln.tid; i < T::kRows * (D / 4); i += T::kThreads) {
      const int r = i / (D / 4);
      const int d = (i % (D / 4)) * 4;
      const int row = cta.row0 + r;
      const bool ok = row < cta.rows_total;
      const float2 a = ok ? q_pair<T>(cta.q_row(p, row), d) : make_float2(0.f, 0.f);
      const float2 b = ok ? q_pair<T>(cta.q_row(p, row), d + 2) : make_float2(0.f, 0.f);
      const float sc = row_scale[r];
      unsigned hi, lo;
      Q::split(a.x * sc, a.y * sc, b.x * sc, b.y * sc, hi, lo);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + d), "r"(hi));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + D + d), "r"(lo));
    }
  } else {
    for (int i = ln.tid; i < T::kRows * (D / 2); i += T::kThreads) {
      const int r = i / (D / 2);
      const int d = (i % (D / 2)) * 2;
      const int row = cta.row0 + r;
      const float2 v = row < cta.rows_total ? q_pair<T>(cta.q_row(p, row), d) : make_float2(0.f, 0.f);
      const float sc = row_scale[r];
      const unsigned packed = ptx::pack2<Q::kFp16>(v.x * sc, v.y * sc);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + d * 2), "r"(packed));
    }
  }
  __syncthreads();
  row_inv[0] = 1.f / row_scale[ln.warp_m * 16 + ln.g];
  row_inv[1] = 1.f / row_scale[ln.warp_m * 16 + ln.g + 8];
}

// The loaded q as the products read it: the kernel's fragments, or q in shared memory.
template <class T>
struct QOperand {
  using Q = QLayout<T>;
  const unsigned (&frag)[Q::kFragSteps][4];
  const unsigned (&frag8)[Q::kFrag8Steps][2][4];
  unsigned smem;

  // The A fragment of 16-dim k step kk (16-bit products).
  __device__ __forceinline__ void a16(int kk, const Lane& ln, unsigned (&a)[4]) const {
    if constexpr (T::kQInRegs) {
      a[0] = frag[kk][0];
      a[1] = frag[kk][1];
      a[2] = frag[kk][2];
      a[3] = frag[kk][3];
    } else {
      const unsigned lo = smem + (ln.warp_m * 16 + ln.g) * T::kQRowStride;
      const unsigned hi = lo + 8 * T::kQRowStride;
      a[0] = ptx::lds32(lo + q_dim<T>(kk, ln.c, 0) * 2);
      a[1] = ptx::lds32(hi + q_dim<T>(kk, ln.c, 0) * 2);
      a[2] = ptx::lds32(lo + q_dim<T>(kk, ln.c, 1) * 2);
      a[3] = ptx::lds32(hi + q_dim<T>(kk, ln.c, 1) * 2);
    }
  }
  // Two-term q, the A fragment of 32-dim step kk, term 0 (hi) or 1 (lo).
  __device__ __forceinline__ void a8(int kk, int term, const Lane& ln, unsigned (&a)[4]) const {
    if constexpr (T::kQInRegs) {
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = frag8[kk][term][j];
    } else {
      const unsigned lo = smem + (ln.warp_m * 16 + ln.g) * T::kQRowStride + term * Q::D + kk * 32 + 4 * ln.c;
      const unsigned hi = lo + 8 * T::kQRowStride;
      a[0] = ptx::lds32(lo);
      a[1] = ptx::lds32(hi);
      const bool full = kk * 32 + 16 < Q::D;  // compile-time after unrolling
      a[2] = full ? ptx::lds32(lo + 16) : 0u;
      a[3] = full ? ptx::lds32(hi + 16) : 0u;
    }
  }
};

}  // namespace deca::gqa
