// Scalar number-format conversions used by the CPU reference and the quantisers. The public
// wrappers (deca/quant.hpp) forward here; the hot loops of the reference call these inline
// versions or the 256-entry fp8 table directly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace deca::cpu {

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_bits_to_float(std::uint16_t bits) {
  return bits_to_float(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest even on the 16 dropped bits; NaN is kept a (quiet) NaN of the same sign,
// because the rounding add could otherwise carry a NaN payload into infinity.
inline std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t bits = float_to_bits(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float fp16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_fp16_bits(float value);
float fp8e4m3_bits_to_float(std::uint8_t bits);
std::uint8_t float_to_fp8e4m3_bits(float value);

// All 256 e4m3 codes decoded once (0x7F and 0xFF are NaN).
const float* fp8e4m3_table();

// Largest finite values of the quantized formats.
inline constexpr float kFp8E4M3Max = 448.f;
inline constexpr float kInt8Max = 127.f;

}  // namespace deca::cpu
