// The float-sum side of the MLA brute-force checks: one query row's softmax over explicit key
// rows in long double (the semantics written out, no library code), and the comparison of a
// run's out / lse with it. The cases decode their keys from the stored bytes themselves.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/host_tensor.hpp"

namespace deca::test {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr int kMlaBruteDimV = 512;

struct MlaExpected {
  std::vector<long double> out;  // [rows][512]
  std::vector<long double> lse;  // [rows]
};

// Full softmax of one row: logits scale * q . k over q.size() dims, V = each key's first 512
// values; the sink (when given) joins the denominator only. No keys: out untouched (zeros),
// lse -inf.
inline void mla_softmax_row(const std::vector<float>& q,
                            const std::vector<std::vector<long double>>& keys, long double scale,
                            const float* sink, long double* out, long double* lse) {
  *lse = -kInf;
  if (keys.empty()) return;
  std::vector<long double> logit;
  for (const auto& k : keys) {
    long double dot = 0;
    for (std::size_t d = 0; d < q.size(); ++d) dot += static_cast<long double>(q[d]) * k[d];
    logit.push_back(scale * dot);
  }
  const long double mx = *std::max_element(logit.begin(), logit.end());
  long double z = 0;
  for (long double x : logit) z += std::exp(x - mx);
  *lse = mx + std::log(z);
  const long double denom = z + (sink ? std::exp(static_cast<long double>(*sink) - mx) : 0.0L);
  for (std::size_t n = 0; n < keys.size(); ++n) {
    const long double w = std::exp(logit[n] - mx) / denom;
    for (int d = 0; d < kMlaBruteDimV; ++d) out[d] += w * keys[n][d];
  }
}

// out (bf16, contiguous [rows][512]) within bf16 rounding of the expected values; lse within
// float rounding (-inf exactly). Returns the number of mismatches (the first 5 reported).
inline int expect_mla_close(const HostTensor& out, const HostTensor& lse, bool check_lse,
                            const MlaExpected& e) {
  int bad = 0;
  for (std::size_t n = 0; n < e.out.size(); ++n) {
    const double want = static_cast<double>(e.out[n]), got = out.get(static_cast<std::int64_t>(n));
    if (!(std::fabs(got - want) <= std::fabs(want) * 0x1p-7 + 1e-30) && ++bad <= 5) {
      ADD_FAILURE() << "out[" << n << "]: got " << got << ", want " << want;
    }
  }
  for (std::size_t n = 0; check_lse && n < e.lse.size(); ++n) {
    const double want = static_cast<double>(e.lse[n]), got = lse.data<float>()[n];
    const bool ok = std::isinf(want) ? got == want
                                     : std::fabs(got - want) <= 2e-6 * std::max(1.0, std::fabs(want));
    if (!ok && ++bad <= 5) ADD_FAILURE() << "lse[" << n << "]: got " << got << ", want " << want;
  }
  return bad;
}

}  // namespace deca::test
