// Conversions of the Hopper kernels (PTX ISA 9.7.9.21, cvt), one wrapper per instruction with its
// PTX syntax: e4m3 pairs and quads to f16 (exact, sm_89+), f16 to f32, f32 pairs to bf16.
#pragma once

#include <cuda/ptx>
#include <cuda/std/cstdint>

namespace deca::sm90 {

// ---- Conversions (PTX ISA 9.7.9.21, cvt) ---------------------------------------------------------
// cvt.rn.f16x2.e4m3x2 d, a; -- two e4m3 (low byte -> low half) to two f16, exact (sm_89+).
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short pair) {
  unsigned d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(pair));
  return d;
}
// The same for the four e4m3 of a word (byte i = value i): values 0, 1 and 2, 3 as two f16x2; the
// high pair is read as the register's upper half, without a shift.
__device__ __forceinline__ uint2 e4m3x4_to_f16x4(unsigned w) {
  unsigned lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
  return make_uint2(lo, hi);
}
// cvt.f32.f16 d, a; for both halves of an f16x2 (exact).
__device__ __forceinline__ float2 f16x2_to_f32x2(unsigned h2) {
  float lo, hi;
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(h2));
  return make_float2(lo, hi);
}
// cvt.rn.bf16x2.f32 d, hi, lo; -- `lo` lands in the low half.
__device__ __forceinline__ unsigned f32x2_to_bf16x2(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

}  // namespace deca::sm90
