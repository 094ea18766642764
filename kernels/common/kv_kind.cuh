// How a KV cache dtype reaches the tensor cores: kept 16-bit, or 8-bit widened in registers.
// Host code includes this too (the plan needs the tile shapes), so it holds no device code.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_HD __host__ __device__
#else
#define DECA_HD
#endif

namespace deca::kv {

enum Kind : int { kKv16 = 0, kKvFp8 = 1, kKvInt8 = 2 };

// DType values (deca::DType in include/deca/tensor.hpp).
enum DTypeCode : int { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP8 = 3, kINT8 = 4 };

DECA_HD constexpr int kind_of(int kv_dtype) {
  return kv_dtype == kFP8 ? kKvFp8 : (kv_dtype == kINT8 ? kKvInt8 : kKv16);
}

// The mma operand type: the cache's own when it is 16-bit (q is converted once), else q's.
DECA_HD constexpr bool compute_fp16(int q_dtype, int kv_dtype) {
  return kind_of(kv_dtype) == kKv16 ? kv_dtype == kFP16 : q_dtype == kFP16;
}

// Power of two the widened 8-bit values carry (kernels/common/kv_convert.cuh), multiplied back
// through the K and V scales: 2^120 for fp8 -> bf16, 2^8 for fp8 -> fp16, 1 otherwise.
DECA_HD constexpr float widen_factor(int kind, bool fp16) {
  return kind == kKvFp8 ? (fp16 ? 256.f : 1.329227995784916e36f) : 1.f;
}

}  // namespace deca::kv
