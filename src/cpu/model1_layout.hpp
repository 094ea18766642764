// Where a MODEL1 token's bytes lie in its page (deca/mla.hpp, MlaCacheFormat::kModel1), for the
// packer and the reference: the 576-byte row (448 e4m3, then 64 bf16) at slot * 576, the 7 ue8m0
// scales (one per 64 NoPE values) and a pad byte at page_size * 576 + slot * 8.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace deca::cpu {

inline constexpr int kModel1Nope = 448;
inline constexpr int kModel1Tile = 64;
inline constexpr int kModel1Tiles = 7;
inline constexpr int kModel1RowBytes = 576;
inline constexpr int kModel1ScaleBytes = 8;

inline std::int64_t model1_row_offset(int slot) {
  return static_cast<std::int64_t>(slot) * kModel1RowBytes;
}
inline std::int64_t model1_scale_offset(int page_size, int slot) {
  return static_cast<std::int64_t>(page_size) * kModel1RowBytes +
         static_cast<std::int64_t>(slot) * kModel1ScaleBytes;
}

// ue8m0: 2^(byte - 127); byte 255 is NaN.
inline float ue8m0_to_float(std::uint8_t e) {
  return e == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.f, int{e} - 127);
}

}  // namespace deca::cpu
