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

// Four words, one per token row (4 dims each), -> for each dim i two fp16 pairs over the rows:
// lo[i] = (w0.i, w1.i), hi[i] = (w2.i, w3.i). A 4 x 4 byte transpose in two rounds of prmt
// (8 instructions), then the widening.
template <int kKind, int kDims = 4>
__device__ __forceinline__ void widen_rows(unsigned w0, unsigned w1, unsigned w2, unsigned w3,
                                           unsigned (&lo)[kDims], unsigned (&hi)[kDims]) {
  const unsigned t0 = ptx::prmt(w0, w1, 0x5140u);  // [w0.0, w1.0, w0.1, w1.1]
  const unsigned t2 = ptx::prmt(w2, w3, 0x5140u);  // [w2.0, w3.0, w2.1, w3.1]
  widen4<kKind>(ptx::prmt(t0, t2, 0x5410u), lo[0], hi[0]);  // [w0.0, w1.0, w2.0, w3.0]
  widen4<kKind>(ptx::prmt(t0, t2, 0x7632u), lo[1], hi[1]);  // [w0.1, w1.1, w2.1, w3.1]
  if constexpr (kDims == 4) {
    const unsigned t1 = ptx::prmt(w0, w1, 0x7362u);  // [w0.2, w1.2, w0.3, w1.3]
    const unsigned t3 = ptx::prmt(w2, w3, 0x7362u);
    widen4<kKind>(ptx::prmt(t1, t3, 0x5410u), lo[2], hi[2]);
    widen4<kKind>(ptx::prmt(t1, t3, 0x7632u), lo[3], hi[3]);
  }
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

// ---- Two-term int8 operands (IMMA, sm_80+) ----------------------------------------------------
// An int8 cache meets q and the softmax weights P on the int8 tensor cores (mma.sync m16n8k32
// .s8.s8.s32, native IMMA.16832 on sm_80 to sm_90): x (scaled to |x| <= 127) = hi + lo * 2^-7,
// hi = round(x), lo = round((x - hi) * 2^7), |lo| <= 64. The products are exact int32 sums; the
// low one is folded into the high one as (lo . b + 64) >> 7, the only rounding (half a unit of
// the high term: tools/sim_two_term.py, 0.17 % relative RMS with bf16 output, as the widening).
//
// Sums leave the integer pipe through the float magic number 1.5 * 2^23: its bits plus an int32
// x with |x| < 2^22 are the float 1.5 * 2^23 + x exactly, so one float subtract converts (full
// rate, where I2F is a quarter-rate conversion). An accumulator starts at kMagicBits (or the
// shifted low sum plus kMagicBits) and every bound below keeps |x| < 2^22: QK <= 127 * 128 *
// 256 + 2^14, PV <= 127 * 128 * 32 per 32-token step.
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.f;  // 1.5 * 2^23

__device__ __forceinline__ float magic_to_float(int biased) {
  return __fsub_rn(__int_as_float(biased), kMagic);
}

// d = hi . b + ((lo . b + 64) >> 7) + kMagicBits: the two-term product against one 8-bit B
// fragment in one int32 tile (magic_to_float turns it into the float hi . b + lo . b * 2^-7).
__device__ __forceinline__ void mma_s8_two_term(int (&d)[4], const unsigned (&hi)[4],
                                                const unsigned (&lo)[4], unsigned b0, unsigned b1) {
  int t[4];
  ptx::mma_s8_16832(t, lo, b0, b1, 64, 64, 64, 64);
#pragma unroll
  for (int e = 0; e < 4; ++e) t[e] = (t[e] >> 7) + kMagicBits;
  ptx::mma_s8_16832(d, hi, b0, b1, t[0], t[1], t[2], t[3]);
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

// The same for P (0 <= x <= 127), once per token and row of every tile, without conversions:
// y = x + 1.5 * 2^23 holds round(x) in its low byte, z = x * 2^7 + 1.5 * 2^23 holds
// round(x * 2^7); lo = round(x * 2^7) - 2^7 * round(x), whose low byte is z's low byte with its
// top bit flipped when round(x) is odd. Two FP32 ops per value, then 8 byte-level ops per four.
__device__ __forceinline__ void split_s8_p(float x0, float x1, float x2, float x3, unsigned& hi,
                                           unsigned& lo) {
  const unsigned y0 = __float_as_uint(__fadd_rn(x0, kMagic)), y1 = __float_as_uint(__fadd_rn(x1, kMagic));
  const unsigned y2 = __float_as_uint(__fadd_rn(x2, kMagic)), y3 = __float_as_uint(__fadd_rn(x3, kMagic));
  const unsigned z0 = __float_as_uint(__fmaf_rn(x0, 128.f, kMagic));
  const unsigned z1 = __float_as_uint(__fmaf_rn(x1, 128.f, kMagic));
  const unsigned z2 = __float_as_uint(__fmaf_rn(x2, 128.f, kMagic));
  const unsigned z3 = __float_as_uint(__fmaf_rn(x3, 128.f, kMagic));
  // Low bytes of four words into one: [w0.0, w1.0, 0, 0] twice, then the halves side by side.
  hi = ptx::prmt(ptx::prmt(y0, y1, 0x0040u), ptx::prmt(y2, y3, 0x0040u), 0x5410u);
  const unsigned z = ptx::prmt(ptx::prmt(z0, z1, 0x0040u), ptx::prmt(z2, z3, 0x0040u), 0x5410u);
  lo = z ^ ((hi << 7) & 0x80808080u);
}

}  // namespace deca::kv
