// An independent GQA decode computation for the tests: dense per-request K/V (the case's
// logical arrays, never the pages), visibility from the speculation tree's parent links (not
// the mask bits), full softmax in long double.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "common/paged_gqa_case.hpp"

namespace deca::test {

struct GqaExpected {
  std::vector<long double> out;  // [batch][q_len][num_q_heads][head_dim], real values
  std::vector<long double> lse;  // [batch][q_len][num_q_heads]
};

inline bool is_ancestor_or_self(const std::vector<int>& parent, int j, int i) {
  for (int n = i; n >= 0; n = parent[n]) {
    if (n == j) return true;
  }
  return false;
}

inline GqaExpected brute_force_gqa(const GqaCase& c) {
  const auto& s = c.spec;
  const int group = s.num_q_heads / s.num_kv_heads;
  const long double scale = c.params.softmax_scale;
  GqaExpected e;
  e.out.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_q_heads * s.head_dim, 0.0L);
  e.lse.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_q_heads,
               -std::numeric_limits<long double>::infinity());
  for (int b = 0; b < s.batch; ++b) {
    const int len = c.lens[b];
    const int first_draft = len - s.q_len;
    for (int i = 0; i < s.q_len; ++i) {
      const int pos = first_draft + i;
      std::vector<int> keys;
      for (int t = 0; t < len; ++t) {
        bool see = s.tree_mask && t >= first_draft
                       ? is_ancestor_or_self(c.tree_parent[b], t - first_draft, i)
                       : t <= pos;
        if (s.window > 0 && pos - t >= s.window) see = false;
        if (see) keys.push_back(t);
      }
      for (int h = 0; h < s.num_q_heads; ++h) {
        const int kvh = h / group;
        const std::size_t row = (static_cast<std::size_t>(b) * s.q_len + i) * s.num_q_heads + h;
        if (keys.empty()) continue;
        std::vector<long double> logit;
        for (int t : keys) {
          long double dot = 0;
          for (int d = 0; d < s.head_dim; ++d) {
            const long double k = static_cast<long double>(
                c.k_logical[b][(static_cast<std::size_t>(t) * s.num_kv_heads + kvh) * s.head_dim + d]) *
                c.k_scale_of(kvh);
            dot += static_cast<long double>(c.q_at(b, i, h, d)) * k;
          }
          long double x = scale * dot;
          if (s.softcap > 0) x = s.softcap * std::tanh(x / s.softcap);
          logit.push_back(x);
        }
        long double mx = logit[0];
        for (long double x : logit) mx = std::max(mx, x);
        long double z = 0;
        for (long double x : logit) z += std::exp(x - mx);
        e.lse[row] = mx + std::log(z);
        long double denom = z;
        if (s.sinks) denom += std::exp(static_cast<long double>(c.sinks.data<float>()[h]) - mx);
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const long double w = std::exp(logit[n] - mx) / denom;
          for (int d = 0; d < s.head_dim; ++d) {
            const long double v = static_cast<long double>(
                c.v_logical[b][(static_cast<std::size_t>(keys[n]) * s.num_kv_heads + kvh) * s.head_dim + d]) *
                c.v_scale_of(kvh);
            e.out[row * s.head_dim + d] += w * v;
          }
        }
      }
    }
  }
  return e;
}

// Tolerance of one stored output element: a unit in the last place of the dtype (the two
// computations may round a value lying on a rounding boundary differently), at least the
// dtype's smallest subnormal step.
inline double output_tolerance(DType dtype, double value) {
  switch (dtype) {
    case DType::kBF16: return std::fabs(value) * 0x1p-7 + 0x1p-126;
    case DType::kFP16: return std::fabs(value) * 0x1p-10 + 0x1p-24;
    case DType::kFP8E4M3: return std::fabs(value) * 0x1p-3 + 0x1p-9;
    default: return std::fabs(value) * 1e-6 + 1e-30;
  }
}

// Compares the case's output and LSE with the brute force; returns the number of mismatches
// (reporting the first few through gtest).
inline int expect_matches_brute_force(const GqaCase& c, const GqaExpected& e) {
  const auto& s = c.spec;
  const bool fp8 = s.out_dtype == DType::kFP8E4M3;
  int bad = 0;
  for (std::size_t n = 0; n < e.out.size(); ++n) {
    const double want = static_cast<double>(e.out[n]) / (fp8 ? s.out_scale : 1.f);
    const double got = c.out.get(static_cast<std::int64_t>(n));
    if (!(std::fabs(got - want) <= output_tolerance(s.out_dtype, want))) {
      if (++bad <= 5) ADD_FAILURE() << "out[" << n << "]: got " << got << ", want " << want;
    }
  }
  if (s.lse) {
    for (std::size_t n = 0; n < e.lse.size(); ++n) {
      const double want = static_cast<double>(e.lse[n]);
      const double got = c.lse.data<float>()[n];
      const bool ok = std::isinf(want) ? got == want
                                       : std::fabs(got - want) <= 2e-6 * std::max(1.0, std::fabs(want));
      if (!ok && ++bad <= 5) ADD_FAILURE() << "lse[" << n << "]: got " << got << ", want " << want;
    }
  }
  return bad;
}

}  // namespace deca::test
