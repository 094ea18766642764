// 8-bit KV values -> packed fp16 pairs for mma.sync, in registers (kernels/common/kv_kind.cuh
// says why fp16).
//
// fp8 e4m3 on sm_89+: cvt.rn.f16x2.e4m3x2 widens two values in one instruction, exactly. On
// sm_80/86 (no such cvt) the bit trick: `s eeee mmm` moved to the sign and bits 13..7 of a 16-bit
// lane is the fp16 value times 2^-8, for normal and subnormal inputs alike; the 2^8 is folded
// into the K scale (softmax side) and the V scale (output side). e4m3fn's NaN code (s 1111 111)
// becomes NaN through cvt and +-480 through the trick: a KV cache holds no NaN by contract.
//
// int8: 0x6400 | (x ^ 0x80) is the fp16 value 1024 + x + 128 exactly; one packed subtract of
// 1152 finishes two values.
#pragma once

#include "kernels/common/kv_kind.cuh"
#include "kernels/common/ptx.cuh"

namespace deca::kv {

// Power of two the widened values carry, multiplied back through the scales.
template <int kKind>
__device__ constexpr float widen_factor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return 1.f;
#else
  return kKind == kKvFp8 ? 256.f : 1.f;
#endif
}

// Two consecutive bytes (`half` 0: bytes 0-1, 1: bytes 2-3) of `w` -> fp16 pair (byte order kept).
template <int kKind>
__device__ __forceinline__ unsigned widen2(unsigned w, int half) {
  if constexpr (kKind == kKvFp8) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const unsigned short two = static_cast<unsigned short>(half ? (w >> 16) : (w & 0xFFFFu));
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(two));
    return r;
#else
    const unsigned t = ptx::prmt(w, 0u, half ? 0x3020u : 0x1000u);  // bytes into lane high halves
    return ((t & 0x7F007F00u) >> 1) | (t & 0x80008000u);
#endif
  } else {
    static_assert(kKind == kKvInt8, "widen2: 8-bit kinds only");
    const unsigned t = ptx::prmt(w, 0u, half ? 0x7372u : 0x7170u);  // bytes into lane low halves
    const unsigned biased = (t & 0x00FF00FFu) ^ 0x64806480u;         // 0x64 | x^0x80 per lane
    unsigned r;
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(biased), "r"(0x64806480u));  // - 1152
    return r;
  }
}

// All four bytes of `w` -> two fp16 pairs: lo = (byte 0, byte 1), hi = (byte 2, byte 3). The
// e4m3 path splits the register into its 16-bit halves inside the asm, which costs nothing,
// where a C++ shift would cost an instruction per pair.
template <int kKind>
__device__ __forceinline__ void widen4(unsigned w, unsigned& lo, unsigned& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (kKind == kKvFp8) {
    asm("{\n"
        "  .reg .b16 l, h;\n"
        "  mov.b32 {l, h}, %2;\n"
        "  cvt.rn.f16x2.e4m3x2 %0, l;\n"
        "  cvt.rn.f16x2.e4m3x2 %1, h;\n"
        "}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
    return;
  }
#endif
  lo = widen2<kKind>(w, 0);
  hi = widen2<kKind>(w, 1);
}

// ---- Two-term e4m3 operands (sm_89+) ----------------------------------------------------------
// An operand that is not 8-bit (q, the softmax weights P) meets an e4m3 cache on the e4m3 tensor
// cores as x = hi + lo, hi = e4m3(x), lo = e4m3(x - hi): both products go into one fp32
// accumulator, and the sum keeps ~7 significant bits where one e4m3 term keeps 4
// (tools/sim_two_term.py: 0.18 % relative RMS against 3.5 % for one term). The caller scales x
// into e4m3 range first (q per row by a power of two into [128, 256), P by 256).
//
// Four floats -> hi and lo, each four e4m3 bytes in order (x0 in byte 0). For P, once per
// token and row of every tile: the residual is formed in fp16 (x is rounded to 11 bits first,
// far below what the low term keeps), five instructions per pair: pack, cvt down, cvt back up
// (exact), subtract (exact: hi is within a factor 2 of x), cvt down.
__device__ __forceinline__ void split_e4m3_f16(float x0, float x1, float x2, float x3,
                                               unsigned& hi, unsigned& lo) {
  asm("{\n"
      "  .reg .b16 h0, h1, l0, l1;\n"
      "  .reg .b32 f0, f1, r0, r1;\n"
      "  cvt.rn.f16x2.f32 f0, %3, %2;\n"
      "  cvt.rn.f16x2.f32 f1, %5, %4;\n"
      "  cvt.rn.satfinite.e4m3x2.f16x2 h0, f0;\n"
      "  cvt.rn.satfinite.e4m3x2.f16x2 h1, f1;\n"
      "  cvt.rn.f16x2.e4m3x2 r0, h0;\n"
      "  cvt.rn.f16x2.e4m3x2 r1, h1;\n"
      "  sub.rn.f16x2 r0, f0, r0;\n"
      "  sub.rn.f16x2 r1, f1, r1;\n"
      "  cvt.rn.satfinite.e4m3x2.f16x2 l0, r0;\n"
      "  cvt.rn.satfinite.e4m3x2.f16x2 l1, r1;\n"
      "  mov.b32 %0, {h0, h1};\n"
      "  mov.b32 %1, {l0, l1};\n"
      "}\n"
      : "=r"(hi), "=r"(lo)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
}

// The same with the residual in fp32, for q (once per CTA, so exactness is free): x keeps its
// full bf16/fp16 precision up to what the two terms hold.
__device__ __forceinline__ void split_e4m3_f32(float x0, float x1, float x2, float x3,
                                               unsigned& hi, unsigned& lo) {
  unsigned short h[2], l[2];
  const float x[4] = {x0, x1, x2, x3};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(h[i]) : "f"(x[2 * i + 1]), "f"(x[2 * i]));
    float b0, b1;
    asm("{\n"
        "  .reg .b32 r;\n"
        "  .reg .b16 u, v;\n"
        "  cvt.rn.f16x2.e4m3x2 r, %2;\n"
        "  mov.b32 {u, v}, r;\n"
        "  cvt.f32.f16 %0, u;\n"
        "  cvt.f32.f16 %1, v;\n"
        "}\n"
        : "=f"(b0), "=f"(b1)
        : "h"(h[i]));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
        : "=h"(l[i])
        : "f"(x[2 * i + 1] - b1), "f"(x[2 * i] - b0));
  }
  hi = static_cast<unsigned>(h[0]) | (static_cast<unsigned>(h[1]) << 16);
  lo = static_cast<unsigned>(l[0]) | (static_cast<unsigned>(l[1]) << 16);
}

// ---- Two-term int8 q (IMMA, sm_80+) -----------------------------------------------------------
// An int8 cache meets q on the int8 tensor cores (mma.sync m16n8k32 .s8.s8.s32, native IMMA.16832
// on sm_80 to sm_90): x (scaled to |x| <= 127) = hi + lo * 2^-7, hi = round(x),
// lo = round((x - hi) * 2^7), |lo| <= 64. The products are exact int32 sums; the low one is
// folded into the high one as (lo . b + 64) >> 7, the only rounding (half a unit of the high
// term: tools/sim_two_term.py, 0.17 % relative RMS with bf16 output, as the widening).
//
// Sums leave the integer pipe through the float magic number 1.5 * 2^23: its bits plus an int32
// x with |x| < 2^22 are the float 1.5 * 2^23 + x exactly, so one float subtract converts (full
// rate, where I2F is a quarter-rate conversion). An accumulator starts at kMagicBits (or the
// shifted low sum plus kMagicBits) and the bound keeps |x| < 2^22: QK <= 127 * 128 * 256 + 2^14.
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.f;  // 1.5 * 2^23

__device__ __forceinline__ float magic_to_float(int biased) {
  return __fsub_rn(__int_as_float(biased), kMagic);
}

// Four floats (|x| <= 127) -> hi and lo, four int8 bytes each in order (x0 in byte 0). For q,
// once per CTA.
__device__ __forceinline__ void split_s8_f32(float x0, float x1, float x2, float x3,
                                             unsigned& hi, unsigned& lo) {
  const float x[4] = {x0, x1, x2, x3};
  hi = lo = 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = __float2int_rn(x[i]);
    const int l = __float2int_rn((x[i] - static_cast<float>(h)) * 128.f);  // x - h is exact
    hi |= (static_cast<unsigned>(h) & 0xFFu) << (8 * i);
    lo |= (static_cast<unsigned>(l) & 0xFFu) << (8 * i);
  }
}

}  // namespace deca::kv
