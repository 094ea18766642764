// FP8 e4m3 x per-128 fp32 scale -> bf16 for the sm90a MLA sparse decode wide kernel's producers,
// rounded exactly as the CPU reference rounds.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// Four e4m3 (one word) times `scale`, rounded to bf16 once: bf16(float(e4m3) * scale) as the
// reference computes it (e4m3 -> f16 -> f32 are exact; the product rounds in f32, then to bf16).
// The high pair is read as the register's upper half (e4m3x4_to_f16x4), not by a shift: an
// instruction per four values fewer.
__device__ __forceinline__ uint2 dequant4(unsigned w, float scale) {
  const uint2 h = e4m3x4_to_f16x4(w);
  const float2 a = f16x2_to_f32x2(h.x);
  const float2 b = f16x2_to_f32x2(h.y);
  return make_uint2(f32x2_to_bf16x2(a.x * scale, a.y * scale), f32x2_to_bf16x2(b.x * scale, b.y * scale));
}

// Eight e4m3 (two words) times `scale` as one 16-byte bf16 unit.
__device__ __forceinline__ uint4 dequant8(uint2 raw, float scale) {
  const uint2 a = dequant4(raw.x, scale);
  const uint2 b = dequant4(raw.y, scale);
  return make_uint4(a.x, a.y, b.x, b.y);
}

}  // namespace deca::mla::sm90
