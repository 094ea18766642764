// q of the Hopper GQA kernels (decode.cuh, decode_rows.cuh): for fp8 caches as two e4m3 terms:
// each query row scaled by a power of two into [128, 256), q_hi = e4m3(q_s), q_lo = e4m3(q_s -
// q_hi), both stored as a K-major wgmma operand (rows of 128 bytes in the 128-byte swizzle) and
// the inverse scale kept per row; for 16-bit caches one term of the cache's type (load_q_16bit).
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/kv_kind.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/fused.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/layout.cuh"

namespace deca::gqa::sm90 {

// The address of q's element d0 of query row `row` of the CTA's kv head.
template <class T>
__device__ __forceinline__ const unsigned short* q_elem(const GqaParams& p, int batch, int kv_head, int row, int d0) {
  const int head = kv_head * T::kGroup + row % T::kGroup;
  return static_cast<const unsigned short*>(p.q) + batch * p.q_stride_batch + (row / T::kGroup) * p.q_stride_token +
         head * p.q_stride_head + d0;
}

// Eight q values d0 .. d0 + 7 of query row `row` of the CTA's kv head (row < rows_total), as
// floats: as stored (`words`, read by for_q_chunks), or rotated by the fused step.
template <class T>
__device__ __forceinline__ void load_q_chunk(const GqaParams& p, int batch, int kv_head, int row, int d0,
                                             const unsigned (&words)[4], float (&x)[8]) {
  if constexpr (T::kFused) {
    // The fused step (kernels/gqa/fused.cuh): each element rotated at its token's position
    // and rounded to q's dtype; an empty request (no position) keeps q as it is.
    const int len = load_seq_len<T>(p, batch);
    const int pos = len > 0 ? fused::token_pos<T>(p, batch, row / T::kGroup, len) : 0;
    const long long off = q_elem<T>(p, batch, kv_head, row, d0) - static_cast<const unsigned short*>(p.q) - d0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[j] = len > 0 ? fused::rotated_q_elem<T>(p, off, pos, d0 + j) : fused::load_q_elem<T>(p.q, off + d0 + j);
    }
  }
#pragma unroll
  for (int j = 0; j < 8 && !T::kFused; j += 2) {
    const unsigned two = words[j / 2];
    const unsigned short lo = static_cast<unsigned short>(two & 0xFFFFu);
    const unsigned short hi = static_cast<unsigned short>(two >> 16);
    if constexpr (T::kQDtype == kv::kFP16) {
      x[j] = ptx::fp16_bits_to_float(lo), x[j + 1] = ptx::fp16_bits_to_float(hi);
    } else {
      x[j] = ptx::bf16_bits_to_float(lo), x[j + 1] = ptx::bf16_bits_to_float(hi);
    }
  }
}

// Every 16-byte chunk of the CTA's q operand (kOperandRows rows of kRowChunks chunks; chunk i is
// operand row m = i / kRowChunks, dims d0 = 8 (i % kRowChunks) ..), thread t taking chunks t, t +
// kThreads, ...: finish(m, d0, x) with the chunk's values as floats, zeros for operand rows past
// rows_total or with row_of(m) < 0 (their query row: row0 + row_of(m)). The loads of up to eight
// of a thread's chunks are all issued before any chunk is finished: finish's shared-memory stores
// order memory, so chunk by chunk every load would wait for the previous chunk's round trip. (The
// fused step's rotated q reads the length and positions first: it goes chunk by chunk.)
// between() runs once, after the first batch's loads are issued and before any chunk is finished:
// work that needs no q (the first tile copies) starts during q's round trip instead of after it.
struct NoWork {
  __device__ __forceinline__ void operator()() const {}
};
template <class T, int kOperandRows, int kRowChunks, class RowOf, class Finish, class Between = NoWork>
__device__ __forceinline__ void for_q_chunks(const GqaParams& p, int batch, int kv_head, int row0, int rows_total,
                                             const RowOf& row_of, const Finish& finish,
                                             const Between& between = Between{}) {
  constexpr int kChunks = kOperandRows * kRowChunks;
  constexpr int kIters = (kChunks + T::kThreads - 1) / T::kThreads;
  constexpr int kBatch = kIters < 8 ? kIters : 8;
  static_assert(kIters % kBatch == 0, "whole batches");
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int k0 = 0; k0 < kIters; k0 += kBatch) {
    unsigned words[kBatch][4];
    int rows[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = tid + T::kThreads * (k0 + k);
      const int r = row_of(i / kRowChunks);
      rows[k] = r < 0 || i >= kChunks ? rows_total : row0 + r;
#pragma unroll
      for (int j = 0; j < 4; ++j) words[k][j] = 0u;
      if (!T::kFused && rows[k] < rows_total) {
        const unsigned short* q = q_elem<T>(p, batch, kv_head, rows[k], 8 * (i % kRowChunks));
#pragma unroll
        for (int j = 0; j < 4; ++j) words[k][j] = *reinterpret_cast<const unsigned*>(q + 2 * j);
      }
    }
    if (k0 == 0) between();
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = tid + T::kThreads * (k0 + k);
      if (kChunks % T::kThreads != 0 && i >= kChunks) break;
      const int d0 = 8 * (i % kRowChunks);
      float x[8];
      if (rows[k] < rows_total) {
        load_q_chunk<T>(p, batch, kv_head, rows[k], d0, words[k], x);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] = 0.f;
      }
      finish(i / kRowChunks, d0, x);
    }
  }
}

// Operand rows 0 .. kOperandRows - 1 at shared addresses q_hi and q_lo; operand row m holds query
// row row0 + row_of(m) of the CTA (rows past rows_total, and row_of(m) < 0, hold zeros), and
// q_inv[m] its inverse scale. `negate`: store -q (the e4m3 sign bits flipped), for a caller that
// folds the sign of its logit scale into q. Every thread of the CTA takes part; the caller
// synchronises. `between` as for_q_chunks.
template <class T, int kOperandRows, class RowOf, class Between = NoWork>
__device__ __forceinline__ void load_q_two_term(const GqaParams& p, int batch, int kv_head, int row0,
                                                int rows_total, unsigned q_hi, unsigned q_lo,
                                                float* q_inv, const RowOf& row_of, bool negate = false,
                                                const Between& between = Between{}) {
  const unsigned sign = negate ? 0x80808080u : 0u;
  static_assert(kOperandRows * 16 % T::kThreads == 0, "every lane of a warp takes part in the row's shuffles");
  for_q_chunks<T, kOperandRows, 16>(p, batch, kv_head, row0, rows_total, row_of, [&](int m, int d0, const float (&x)[8]) {
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
    // The 16 threads of a row are 16 consecutive lanes.
#pragma unroll
    for (int s = 1; s < 16; s <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    const float sc = q_row_scale(amax, 7);
    unsigned hi[2], lo[2];
    kv::split_e4m3_f32(x[0] * sc, x[1] * sc, x[2] * sc, x[3] * sc, hi[0], lo[0]);
    kv::split_e4m3_f32(x[4] * sc, x[5] * sc, x[6] * sc, x[7] * sc, hi[1], lo[1]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ::deca::sm90::sts32(q_hi + swz128(m, d0 + 4 * j), hi[j] ^ sign);
      ::deca::sm90::sts32(q_lo + swz128(m, d0 + 4 * j), lo[j] ^ sign);
    }
    if (d0 == 0) q_inv[m] = 1.f / sc;  // exact: a power of two
  }, between);
}

// The 16-bit caches' q: one term of the cache's type (bf16 / fp16, round to nearest), operand
// row m = query row row0 + row_of(m) as above, 2 x head_dim bytes per row in column blocks of
// 128 B at q_base (blocked128 with kOperandRows rows: at head_dim 128 the plan's q_hi and q_lo
// areas). No row scale: the 16-bit wgmma takes q as it is. `negate`: store -q (sign bits
// flipped). The caller synchronises. `between` as for_q_chunks.
template <class T, int kOperandRows, class RowOf, class Between = NoWork>
__device__ __forceinline__ void load_q_16bit(const GqaParams& p, int batch, int kv_head, int row0, int rows_total,
                                             unsigned q_base, const RowOf& row_of, bool negate = false,
                                             const Between& between = Between{}) {
  const unsigned sign = negate ? 0x80008000u : 0u;
  constexpr int kRowChunks = T::kHeadDim / 8;  // 16-byte chunks of a row: 8 (d64), 16 (d128) or 32 (d256)
  for_q_chunks<T, kOperandRows, kRowChunks>(p, batch, kv_head, row0, rows_total, row_of,
                                            [&](int m, int d0, const float (&x)[8]) {
    uint4 v;
    v.x = ptx::pack2<T::kF16>(x[0], x[1]) ^ sign;
    v.y = ptx::pack2<T::kF16>(x[2], x[3]) ^ sign;
    v.z = ptx::pack2<T::kF16>(x[4], x[5]) ^ sign;
    v.w = ptx::pack2<T::kF16>(x[6], x[7]) ^ sign;
    ::deca::sm90::sts128(q_base + blocked128(m, 2 * d0, kOperandRows), v);
  }, between);
}

}  // namespace deca::gqa::sm90
