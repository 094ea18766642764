// 8-bit KV values -> packed 16-bit pairs for mma.sync, in registers, with integer bit operations.
//
// fp8 e4m3 is `s eeee mmm` (bias 7). Moving the sign to bit 15 and `eeee mmm` to bits 10..4 of a
// 16-bit lane gives the bf16 whose value is the e4m3 value times 2^-120, for normal and subnormal
// inputs alike (both formats scale their subnormals the same way); moving them to bits 13..7 gives
// the fp16 value times 2^-8. The missing power of two is folded into the K scale (softmax side)
// and the V scale (output side): no per-element multiply. e4m3fn's NaN code (s 1111 111) becomes
// +-480 (bf16 path) instead of NaN: a KV cache holds no NaN by contract.
//
// int8 -> fp16: 0x6400 | (x ^ 0x80) is the fp16 value 1024 + x + 128 exactly; one packed subtract
// of 1152 finishes two values. int8 -> bf16 has no such trick (bf16 keeps 8 significant bits), so
// it goes through the fp32 magic number 2^23 and one packed convert.
#pragma once

#include "kernels/common/kv_kind.cuh"
#include "kernels/common/ptx.cuh"

namespace deca::kv {

// Converts two 8-bit values, byte `lo` and byte `hi` of the 8-byte pool {b:a} (a = bytes 0..3),
// into one packed pair (lo in the low half).
template <int kKind, bool kFp16>
__device__ __forceinline__ unsigned pair(unsigned a, unsigned b, unsigned lo, unsigned hi) {
  if constexpr (kKind == kKvFp8) {
    // Both bytes into the high byte of their 16-bit lane; the low bytes are masked away below.
    const unsigned w = ptx::prmt(a, b, (lo << 4) | (hi << 12));
    const unsigned mag = w & 0x7F007F00u;
    if constexpr (kFp16) {
      return (mag >> 1) | (w & 0x80008000u);
    } else {
      return (mag >> 4) | (w & 0x80008000u);
    }
  } else {
    static_assert(kKind == kKvInt8, "pair(): 8-bit kinds only");
    // Byte `lo` into result byte 0, `hi` into byte 2 (the low byte of each 16-bit lane).
    const unsigned w = ptx::prmt(a, b, lo | (hi << 8));
    if constexpr (kFp16) {
      const unsigned biased = (w & 0x00FF00FFu) ^ 0x64806480u;  // 0x64 | x^0x80 per lane
      const unsigned k1152 = 0x64806480u;                        // fp16 1152.0 in both lanes
      unsigned r;
      asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(biased), "r"(k1152));
      return r;
    } else {
      const float f0 = __uint_as_float(0x4B000000u | ((w & 0xFFu) ^ 0x80u)) - 8388736.f;
      const float f1 = __uint_as_float(0x4B000000u | (((w >> 16) & 0xFFu) ^ 0x80u)) - 8388736.f;
      return ptx::pack2<false>(f0, f1);
    }
  }
}

}  // namespace deca::kv
