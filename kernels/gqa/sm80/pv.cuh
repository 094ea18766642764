// The portable GQA kernel's O += P V (decode.cuh) for one chunk of kChunk tokens, P the chunk's
// softmax weights in the S fragments (softmax.cuh), on the path of the cache's type: 16-bit V as
// is; 8-bit V widened to fp16 from ldmatrix.trans loads; or fp8 V kept 8-bit against P's two
// e4m3 terms (sm_89+). `vs`: the stage's V tile; `local0`: the chunk's first token row in it.
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// fp8 V on the e4m3 mma: O += (P_hi + P_lo) V, 32 tokens per m16n8k32 (16 when a warp's chunk is
// 16: the upper k half is zero on both sides). A's k order is the S fragment's own: k 4c..4c+3
// holds tokens 2c, 2c+1 of n8 tiles 0 and 1 (k + 16: tiles 2 and 3), so P needs no shuffle. V:
// ldmatrix.trans on 8-bit rows gives thread (g, c), per 8-token matrix, the bytes (2g, 2g+1) of
// tokens 2c and 2c+1; one prmt per B register picks one dim of four tokens.
template <class T, int kN8, int kOTiles>
__device__ __forceinline__ void pv_two_term_e4m3(const float (&s_acc)[kN8][4], unsigned vs, int local0,
                                                 int lane, float (&o_acc)[kOTiles][4]) {
#pragma unroll
  for (int st = 0; st < (T::kChunk + 31) / 32; ++st) {
    constexpr bool kHalf = T::kChunk % 32 != 0;
    const int j0 = 4 * st;
    unsigned ph[4], pl[4];
    auto split_p = [](float x0, float x1, float x2, float x3, unsigned& hi, unsigned& lo) {
      kv::split_e4m3_f16(x0, x1, x2, x3, hi, lo);
    };
    split_p(s_acc[j0][0], s_acc[j0][1], s_acc[j0 + 1][0], s_acc[j0 + 1][1], ph[0], pl[0]);
    split_p(s_acc[j0][2], s_acc[j0][3], s_acc[j0 + 1][2], s_acc[j0 + 1][3], ph[1], pl[1]);
    if constexpr (kHalf) {
      ph[2] = ph[3] = pl[2] = pl[3] = 0u;
    } else {
      split_p(s_acc[j0 + 2][0], s_acc[j0 + 2][1], s_acc[j0 + 3][0], s_acc[j0 + 3][1], ph[2], pl[2]);
      split_p(s_acc[j0 + 2][2], s_acc[j0 + 2][3], s_acc[j0 + 3][2], s_acc[j0 + 3][3], ph[3], pl[3]);
    }
    const int tok0 = local0 + st * 32;
#pragma unroll
    for (int blk = 0; blk < T::kHeadDim / 16; ++blk) {
      unsigned r0, r1, r2 = 0u, r3 = 0u;
      if constexpr (kHalf) {
        const int tok = tok0 + ((lane / 8) % 2) * 8 + lane % 8;
        ptx::ldmatrix_x2_trans(vs + tok * T::kRowStride + blk * 16, r0, r1);
      } else {
        const int tok = tok0 + lane;  // matrix lane / 8 = tokens 8 (lane / 8) ..
        ptx::ldmatrix_x4_trans(vs + tok * T::kRowStride + blk * 16, r0, r1, r2, r3);
      }
      const unsigned even0 = ptx::prmt(r0, r1, 0x6420u), odd0 = ptx::prmt(r0, r1, 0x7531u);
      const unsigned even1 = kHalf ? 0u : ptx::prmt(r2, r3, 0x6420u);
      const unsigned odd1 = kHalf ? 0u : ptx::prmt(r2, r3, 0x7531u);
      ptx::mma_e4m3_16832(o_acc[2 * blk], ph, even0, even1);
      ptx::mma_e4m3_16832(o_acc[2 * blk], pl, even0, even1);
      ptx::mma_e4m3_16832(o_acc[2 * blk + 1], ph, odd0, odd1);
      ptx::mma_e4m3_16832(o_acc[2 * blk + 1], pl, odd0, odd1);
    }
  }
}

// 8-bit V widened to fp16: two 16-token k steps per ldmatrix.x4.trans (one when the chunk is 16):
// per 8-token matrix thread (g, c) gets bytes (2g, 2g+1) of tokens 2c, 2c+1; one prmt per
// register gives one dim of tokens 2c, 2c+1, 2c+8, 2c+9, which widen to the k16 B pair.
template <class T, int kN8, int kOTiles>
__device__ __forceinline__ void pv_widen_ldsm(const float (&s_acc)[kN8][4], unsigned vs, int local0,
                                              int lane, float (&o_acc)[kOTiles][4]) {
  constexpr bool kFp16 = T::kComputeFp16;
#pragma unroll
  for (int st = 0; st < T::kChunk / 16; st += 2) {
    const bool pair = st + 1 < T::kChunk / 16;
    unsigned a0[4], a1[4];
    a0[0] = ptx::pack2<kFp16>(s_acc[2 * st][0], s_acc[2 * st][1]);
    a0[1] = ptx::pack2<kFp16>(s_acc[2 * st][2], s_acc[2 * st][3]);
    a0[2] = ptx::pack2<kFp16>(s_acc[2 * st + 1][0], s_acc[2 * st + 1][1]);
    a0[3] = ptx::pack2<kFp16>(s_acc[2 * st + 1][2], s_acc[2 * st + 1][3]);
    if (pair) {
      a1[0] = ptx::pack2<kFp16>(s_acc[2 * st + 2][0], s_acc[2 * st + 2][1]);
      a1[1] = ptx::pack2<kFp16>(s_acc[2 * st + 2][2], s_acc[2 * st + 2][3]);
      a1[2] = ptx::pack2<kFp16>(s_acc[2 * st + 3][0], s_acc[2 * st + 3][1]);
      a1[3] = ptx::pack2<kFp16>(s_acc[2 * st + 3][2], s_acc[2 * st + 3][3]);
    }
    const int tok0 = local0 + st * 16;
#pragma unroll
    for (int blk = 0; blk < T::kHeadDim / 16; ++blk) {
      unsigned r0, r1, r2 = 0u, r3 = 0u;
      if (pair) {
        ptx::ldmatrix_x4_trans(vs + (tok0 + lane) * T::kRowStride + blk * 16, r0, r1, r2, r3);
      } else {
        const int tok = tok0 + ((lane / 8) % 2) * 8 + lane % 8;
        ptx::ldmatrix_x2_trans(vs + tok * T::kRowStride + blk * 16, r0, r1);
      }
      unsigned b0, b1;
      kv::widen4<T::kKvKind>(ptx::prmt(r0, r1, 0x6420u), b0, b1);
      ptx::mma_16816<kFp16>(o_acc[2 * blk], a0, b0, b1);
      kv::widen4<T::kKvKind>(ptx::prmt(r0, r1, 0x7531u), b0, b1);
      ptx::mma_16816<kFp16>(o_acc[2 * blk + 1], a0, b0, b1);
      if (pair) {
        kv::widen4<T::kKvKind>(ptx::prmt(r2, r3, 0x6420u), b0, b1);
        ptx::mma_16816<kFp16>(o_acc[2 * blk], a1, b0, b1);
        kv::widen4<T::kKvKind>(ptx::prmt(r2, r3, 0x7531u), b0, b1);
        ptx::mma_16816<kFp16>(o_acc[2 * blk + 1], a1, b0, b1);
      }
    }
  }
}

// 16-bit V as stored: 16 tokens per k step.
template <class T, int kN8, int kOTiles>
__device__ __forceinline__ void pv_16bit(const float (&s_acc)[kN8][4], unsigned vs, int local0, int lane,
                                         float (&o_acc)[kOTiles][4]) {
  constexpr bool kFp16 = T::kComputeFp16;
#pragma unroll
  for (int st = 0; st < T::kChunk / 16; ++st) {
    unsigned a[4];
    a[0] = ptx::pack2<kFp16>(s_acc[2 * st][0], s_acc[2 * st][1]);
    a[1] = ptx::pack2<kFp16>(s_acc[2 * st][2], s_acc[2 * st][3]);
    a[2] = ptx::pack2<kFp16>(s_acc[2 * st + 1][0], s_acc[2 * st + 1][1]);
    a[3] = ptx::pack2<kFp16>(s_acc[2 * st + 1][2], s_acc[2 * st + 1][3]);
    const int tok0 = local0 + st * 16;
#pragma unroll
    for (int o = 0; o < kOTiles; o += 2) {
      // x4.trans: (tokens 0-7, dims o*8..), (tokens 8-15, same), then dims +8.
      const int m = lane / 8;
      const int tok = tok0 + (m % 2) * 8 + lane % 8;
      const unsigned addr = vs + tok * T::kRowStride + (o * 8 + (m / 2) * 8) * 2;
      unsigned b0, b1, b2, b3;
      ptx::ldmatrix_x4_trans(addr, b0, b1, b2, b3);
      ptx::mma_16816<kFp16>(o_acc[o], a, b0, b1);
      ptx::mma_16816<kFp16>(o_acc[o + 1], a, b2, b3);
    }
  }
}

template <class T, int kN8, int kOTiles>
__device__ __forceinline__ void pv_chunk(const float (&s_acc)[kN8][4], unsigned vs, int local0, int lane,
                                         float (&o_acc)[kOTiles][4]) {
  if constexpr (T::kPvTwoTerm) {
    pv_two_term_e4m3<T>(s_acc, vs, local0, lane, o_acc);
  } else if constexpr (T::kLdsm8) {
    pv_widen_ldsm<T>(s_acc, vs, local0, lane, o_acc);
  } else {
    pv_16bit<T>(s_acc, vs, local0, lane, o_acc);
  }
}

}  // namespace deca::gqa
