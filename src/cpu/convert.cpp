#include "cpu/convert.hpp"

#include <array>

namespace deca::cpu {

namespace {

// Rounds |a| (finite, not NaN) to a binary format with `mant_bits` stored mantissa bits and a
// minimum normal exponent `min_exp`, returning the magnitude code (exponent and mantissa fields
// without the sign). The codes of such formats are monotonic and continuous across the
// subnormal/normal and exponent boundaries, so a rounding carry (mantissa 2^mant_bits) lands
// on the next code by plain addition. All scalings are by powers of two and so exact in float;
// nearbyint in the default rounding mode is round-to-nearest-even.
std::uint32_t round_magnitude(float a, int mant_bits, int min_exp) {
  if (a < std::ldexp(1.f, min_exp)) {
    return static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, mant_bits - min_exp)));
  }
  int exp2;
  std::frexp(a, &exp2);  // a = f * 2^exp2, f in [0.5, 1)
  const int e = exp2 - 1;  // a in [2^e, 2^(e+1))
  const auto q = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, mant_bits - e)));
  const std::uint32_t biased = static_cast<std::uint32_t>(e - min_exp + 1);
  return (biased << mant_bits) + (q - (1u << mant_bits));
}

}  // namespace

float fp16_bits_to_float(std::uint16_t bits) {
  const float sign = (bits & 0x8000u) ? -1.f : 1.f;
  const int e = (bits >> 10) & 0x1F;
  const int m = bits & 0x3FF;
  if (e == 0x1F) return m ? std::nanf("") * sign : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  return sign * std::ldexp(static_cast<float>(1024 + m), e - 25);
}

std::uint16_t float_to_fp16_bits(float value) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7E00u);
  const float a = std::fabs(value);
  // 65520 is the midpoint between the largest half (65504) and 2^16: ties go to the even
  // code, which is infinity.
  if (a >= 65520.f) return static_cast<std::uint16_t>(sign | 0x7C00u);
  return static_cast<std::uint16_t>(sign | round_magnitude(a, 10, -14));
}

float fp8e4m3_bits_to_float(std::uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.f : 1.f;
  const int e = (bits >> 3) & 0xF;
  const int m = bits & 0x7;
  if (e == 0xF && m == 0x7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);
}

// e4m3fn has no infinity: everything at or beyond the largest finite value saturates to it
// (what cvt.satfinite does on the GPU); NaN maps to the NaN code.
std::uint8_t float_to_fp8e4m3_bits(float value) {
  const std::uint8_t sign = std::signbit(value) ? 0x80u : 0u;
  if (std::isnan(value)) return static_cast<std::uint8_t>(sign | 0x7Fu);
  const float a = std::fabs(value);
  if (a >= kFp8E4M3Max) return static_cast<std::uint8_t>(sign | 0x7Eu);
  return static_cast<std::uint8_t>(sign | round_magnitude(a, 3, -6));
}

const float* fp8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_bits_to_float(static_cast<std::uint8_t>(i));
    return t;
  }();
  return table.data();
}

}  // namespace deca::cpu
