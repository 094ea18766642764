// The LSE conventions for rows without a valid key (MlaConfig::lse_of_empty_row): a run with
// +inf against the same run with -inf writes the same output bytes and the same LSE bits, except
// that every -inf of the default run is +inf. Shared by the CPU reference's and the GPU tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "common/host_tensor.hpp"

namespace deca::test {

// Returns the number of rows without a valid key (the default run's -inf LSEs).
inline int expect_lse_conventions_agree(const std::string& what, const HostTensor& out_neg,
                                        const HostTensor& lse_neg, const HostTensor& out_pos,
                                        const HostTensor& lse_pos) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(std::memcmp(out_neg.raw(), out_pos.raw(), out_neg.bytes()), 0) << what << ": out";
  int empty = 0;
  for (std::int64_t n = 0; n < lse_neg.numel(); ++n) {
    const float a = lse_neg.data<float>()[n];
    const float b = lse_pos.data<float>()[n];
    if (a == -kInf) {
      ++empty;
      EXPECT_EQ(b, kInf) << what << ": lse " << n;
    } else {
      EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << what << ": lse " << n << ": " << a << " vs " << b;
    }
  }
  return empty;
}

}  // namespace deca::test
