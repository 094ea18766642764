// MODEL1's token (kMlaKvModel1, kernels/mla/params.cuh) as every MLA decode kernel reads it: where
// a token's row and scales lie in its page, and the ue8m0 scale's value. No includes beyond the
// params: host compiler (tests), nvcc and NVRTC alike.
#pragma once

#include "kernels/mla/params.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_MLA_M1_HD __host__ __device__
#else
#define DECA_MLA_M1_HD
#endif

namespace deca::mla {

inline constexpr int kModel1Dim = 512;        // d_qk = d_v
inline constexpr int kModel1NopeDims = 448;   // 7 tiles of 64 e4m3 values, one scale each
inline constexpr int kModel1RowBytes = 576;   // 448 e4m3, then 64 bf16 RoPE values
inline constexpr int kModel1ScaleBytes = 8;   // 7 ue8m0 scales and a pad byte

// Byte offsets inside a page of `page_size` tokens: slot's row, and its scales (after every row).
DECA_MLA_M1_HD constexpr long long model1_row_offset(int slot) {
  return static_cast<long long>(slot) * kModel1RowBytes;
}
DECA_MLA_M1_HD constexpr long long model1_scale_offset(int page_size, int slot) {
  return static_cast<long long>(page_size) * kModel1RowBytes + static_cast<long long>(slot) * kModel1ScaleBytes;
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// 2^(byte - 127) (float8_e8m0fnu): 0 is 2^-127 (a subnormal float), 255 is NaN.
__device__ __forceinline__ float e8m0_to_float(unsigned byte) {
  if (byte == 255u) return __int_as_float(0x7FC00000);
  return byte == 0u ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(byte << 23));
}
#endif

}  // namespace deca::mla
