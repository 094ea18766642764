// The fused decode step's arithmetic (docs/semantics.md, "Fused decode step"), one definition for
// the CPU reference and both GQA kernels so that the cache bytes they write are identical.
//
// A pair (x, y) at frequency i of position pos, with c = cos_sin[pos][i], s =
// cos_sin[pos][rotary_dim / 2 + i] (exact floats of the cache's dtype), becomes
//   x' = x c - y s,   y' = y c + x s
// each product rounded to fp32, then the sum (no fused multiply-add: the host and the device
// round alike). The rotated value is rounded to q's dtype (as a separate rotary kernel would
// store it); a cache stores that value converted (16-bit) or quantized: round(value / scale),
// division rounded to fp32, e4m3 to nearest even saturating at +-448, int8 to nearest even
// clamped to +-127, NaN as 0.
#pragma once

#include "kernels/common/kv_kind.cuh"

namespace deca::gqa {

// Pair members of frequency i: GPT-NeoX (style 1) halves, GPT-J (style 2) neighbours.
DECA_HD constexpr int rope_first(int style, int i) { return style == 1 ? i : 2 * i; }
DECA_HD constexpr int rope_second(int style, int half, int i) { return style == 1 ? i + half : 2 * i + 1; }

// A product rounded to fp32 on its own. On the host, separate statements are not enough: GCC
// contracts across them (-ffp-contract=fast, its default for C++) wherever the target has FMA
// (aarch64, x86 with -mfma), fusing x c - y s into one rounding; the volatile keeps the product.
DECA_HD inline float rope_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  const volatile float r = a * b;
  return r;
#endif
}

DECA_HD inline float rope_x(float x, float y, float c, float s) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(rope_mul(x, c), rope_mul(y, s));
#else
  const float xc = rope_mul(x, c);
  const float ys = rope_mul(y, s);
  return xc - ys;
#endif
}

DECA_HD inline float rope_y(float x, float y, float c, float s) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(rope_mul(y, c), rope_mul(x, s));
#else
  const float yc = rope_mul(y, c);
  const float xs = rope_mul(x, s);
  return yc + xs;
#endif
}

// An int8 cache's code for value / scale (already divided): nearest even, clamped, NaN as 0.
DECA_HD inline signed char int8_code(float x) {
  if (x != x) return 0;
#if defined(__CUDA_ARCH__)
  const float r = rintf(x);
#else
  const float r = __builtin_rintf(x);
#endif
  return static_cast<signed char>(r > 127.f ? 127.f : (r < -127.f ? -127.f : r));
}

}  // namespace deca::gqa
