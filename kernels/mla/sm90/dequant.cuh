// FP8 e4m3 x per-128 fp32 scale -> bf16 for the sm90a MLA sparse decode kernel's producers,
// rounded exactly as the CPU reference rounds: the hardware conversions, the integer placement
// (Cfg::kDequant 1) and the tensor-core f16 -> f32 step (Cfg::kDequant 2).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/knobs.cuh"
#include "kernels/mla/sm90/layout.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// Four e4m3 (one word) times `scale`, rounded to bf16 once: bf16(float(e4m3) * scale) as the
// reference computes it (e4m3 -> f16 -> f32 are exact; the product rounds in f32, then to bf16).
// kHalves: the high pair read as the register's upper half (e4m3x4_to_f16x4) instead of by a
// shift (an instruction per four values fewer; both pairs are then widened at once, which with
// the unit split's registers made one producer's pipes spill, so the rows take it alone).
template <bool kHalves = false>
__device__ __forceinline__ uint2 dequant4(unsigned w, float scale) {
  const uint2 h = kHalves ? e4m3x4_to_f16x4(w)
                          : make_uint2(e4m3x2_to_f16x2(static_cast<unsigned short>(w & 0xFFFF)),
                                       e4m3x2_to_f16x2(static_cast<unsigned short>(w >> 16)));
  const float2 a = f16x2_to_f32x2(h.x);
  const float2 b = f16x2_to_f32x2(h.y);
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

// Eight e4m3 (two words) as one 16-byte bf16 unit: dequant4_int with `s` = scale * 2^120
// (kInt), else dequant4 with `s` = scale.
template <bool kInt, bool kHalves = false>
__device__ __forceinline__ uint4 dequant8_as(uint2 raw, float s) {
  const uint2 a = kInt ? dequant4_int(raw.x, s) : dequant4<kHalves>(raw.x, s);
  const uint2 b = kInt ? dequant4_int(raw.y, s) : dequant4<kHalves>(raw.y, s);
  return make_uint4(a.x, a.y, b.x, b.y);
}
// Whether the integer placement takes a group with this scale (Cfg::kDequant = 1, scale < 2^8,
// where scale * 2^120 cannot overflow), and that product.
template <class Cfg>
__device__ __forceinline__ bool integer_route(float scale) {
  return DequantOf<Cfg>::value == 1 && scale < 256.f;
}
__device__ __forceinline__ float scale_hi(float scale) { return mul_rn_noftz(scale, 0x1p120f); }

// Eight e4m3 (two words) times `scale` as one 16-byte bf16 unit (dequant4's rounding; the
// whole-row pieces').
template <class Cfg>
__device__ __forceinline__ uint4 dequant8(uint2 raw, float scale) {
  return integer_route<Cfg>(scale) ? dequant8_as<true>(raw, scale_hi(scale)) : dequant8_as<false, true>(raw, scale);
}

// Sixteen e4m3 of `raw` times `scale` as two 16-byte bf16 units (dequant4's rounding); one route
// decision for both halves.
template <class Cfg>
__device__ __forceinline__ void dequant16(uint4 raw, float scale, uint4& lo, uint4& hi) {
  if constexpr (DequantOf<Cfg>::value == 2) {
    dequant16_mma(raw, scale, mma_select_b(static_cast<int>(threadIdx.x & 31)), lo, hi);
  } else if (integer_route<Cfg>(scale)) {
    const float sh = scale_hi(scale);
    lo = dequant8_as<true>(make_uint2(raw.x, raw.y), sh);
    hi = dequant8_as<true>(make_uint2(raw.z, raw.w), sh);
  } else {
    lo = dequant8_as<false>(make_uint2(raw.x, raw.y), scale);
    hi = dequant8_as<false>(make_uint2(raw.z, raw.w), scale);
  }
}

}  // namespace deca::mla::sm90
