// Reading and writing one element of a tensor whose dtype is known only at run time (the
// params structs carry dtypes as deca::DType ints).
#pragma once

#include <cstdint>

#include "cpu/convert.hpp"
#include "deca/tensor.hpp"

namespace deca::cpu {

// The stored value as a float (exact for every dtype deca stores: fp8, int8, bf16, fp16, fp32).
inline float load_element(const void* base, int dtype, std::int64_t offset) {
  switch (static_cast<DType>(dtype)) {
    case DType::kBF16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kFP16: return fp16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kFP8E4M3: return fp8e4m3_table()[static_cast<const std::uint8_t*>(base)[offset]];
    case DType::kINT8: return static_cast<const std::int8_t*>(base)[offset];
    case DType::kUINT8: return static_cast<const std::uint8_t*>(base)[offset];
    case DType::kINT32: return static_cast<float>(static_cast<const std::int32_t*>(base)[offset]);
    default: return static_cast<const float*>(base)[offset];
  }
}

// Rounds value (to nearest even) into the output dtype: bf16, fp16, fp8 e4m3 (saturating) or
// fp32. The double is rounded to float first; the second rounding can differ from a direct one
// only on exact float ties, far below any tolerance a test of a kernel would use.
inline void store_element(void* base, int dtype, std::int64_t offset, double value) {
  const float f = static_cast<float>(value);
  switch (static_cast<DType>(dtype)) {
    case DType::kBF16: static_cast<std::uint16_t*>(base)[offset] = float_to_bf16_bits(f); break;
    case DType::kFP16: static_cast<std::uint16_t*>(base)[offset] = float_to_fp16_bits(f); break;
    case DType::kFP8E4M3: static_cast<std::uint8_t*>(base)[offset] = float_to_fp8e4m3_bits(f); break;
    default: static_cast<float*>(base)[offset] = f; break;
  }
}

}  // namespace deca::cpu
