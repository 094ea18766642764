// Skip-softmax test helpers (GqaConfig::skip_softmax_factor, docs/semantics.md "Skip-softmax"):
// peaked data, and the error bound the rule implies, checked element by element.
//
// Peaked data: per (request, kv head) a random unit direction u; every q row of the group is
// sqrt(head_dim) u plus the case's noise, and `heavy` keys (the first min(4, heavy), the rest at
// random positions) are gap * u plus the noise: their logits sit about `gap` above the bulk's
// N(0, 2), the shape of long-context attention that concentrates on a few tokens.
//
// The bound: a dropped key's weight is below (f / L) times that of the largest kept logit, so the
// dropped weight S is below f (n_dropped / L) <= f times the kept weight K. An output element
// then moves by S / (K + S + sink) times (the dropped keys' mean of that element minus the
// kept result), at most f / (1 + f) times the spread of that element over the row's values (and
// 0 with a sink); the LSE drops by log(1 + S / K) < log(1 + f).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/paged_gqa_case.hpp"
#include "common/test_seed.hpp"

namespace deca::test {

inline void make_peaked(GqaCase& c, std::mt19937_64& rng, int heavy, float gap) {
  const auto& s = c.spec;
  const int group = s.num_q_heads / s.num_kv_heads;
  const std::int64_t row = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  const bool quant = s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kINT8;
  const float qmax = s.kv_dtype == DType::kINT8 ? 127.f : 448.f;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> u(s.head_dim);
  for (int b = 0; b < s.batch; ++b) {
    const int len = c.lens[b];
    for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      double norm = 0;
      for (float& x : u) norm += (x = normal(rng)) * x;
      for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));
      const float root_d = std::sqrt(static_cast<float>(s.head_dim));
      for (int i = 0; i < s.q_len; ++i) {
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const std::int64_t o = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h) * s.head_dim;
          for (int d = 0; d < s.head_dim; ++d) c.q.set(o + d, c.q.get(o + d) + root_d * u[d]);
        }
      }
      std::uniform_int_distribution<int> any(0, std::max(len - 1, 0));
      const float limit = quant ? 0.999f * qmax * c.k_scale_of(kvh) : 1e30f;
      for (int j = 0; j < std::min(heavy, len); ++j) {
        const int t = j < 4 ? j : any(rng);
        const std::int64_t pg = c.page_table.data<int>()[b * c.page_table.shape()[1] + t / s.page_size];
        for (int d = 0; d < s.head_dim; ++d) {
          float& logical = c.k_logical[b][t * row + kvh * s.head_dim + d];
          const float real = quant ? logical * c.k_scale_of(kvh) : logical;
          const float x = std::clamp(real + gap * u[d], -limit, limit);
          logical = stored_value(s.kv_dtype, x, c.k_scale_of(kvh));
          c.k_pool.set(gqa_cache_offset(c, pg, t % s.page_size, kvh, d), logical);
        }
      }
    }
  }
}

// Drafts that see every draft, later ones included (a non-causal query through the tree mask),
// on data that puts row 0's later keys just under its threshold were L only the keys up to the
// row (pos + 1): every q row is sqrt(head_dim) e_0, so with the default scale a key's logit is its
// k[0]; key 0's is 0, every other key's just below log(f); V is -1 in keys [0, first_keys), +1
// after, so dropping the later keys would move row 0's output by far more than the bound. For a
// 16-bit cache (values exact) and spec.tree_mask.
inline void make_drafts_see_all(GqaCase& c, double f, int first_keys) {
  const auto& s = c.spec;
  const int words = (s.q_len + 31) / 32;
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      unsigned* row = c.tree_mask.data<unsigned>() + (static_cast<std::int64_t>(b) * s.q_len + i) * words;
      for (int j = 0; j < s.q_len; ++j) row[j / 32] |= 1u << (j % 32);
      for (int h = 0; h < s.num_q_heads; ++h) {
        const std::int64_t o = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h) * s.head_dim;
        for (int d = 0; d < s.head_dim; ++d) c.q.set(o + d, d == 0 ? std::sqrt(float(s.head_dim)) : 0.f);
      }
    }
    const std::int64_t kv_row = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
    const float below = round_to(s.kv_dtype, static_cast<float>(std::log(f) - 0.1));
    for (int t = 0; t < c.lens[b]; ++t) {
      const std::int64_t pg = c.page_table.data<int>()[b * c.page_table.shape()[1] + t / s.page_size];
      for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
        for (int d = 0; d < s.head_dim; ++d) {
          const float k = d == 0 && t > 0 ? below : 0.f, v = t < first_keys ? -1.f : 1.f;
          c.k_logical[b][t * kv_row + kvh * s.head_dim + d] = k;
          c.v_logical[b][t * kv_row + kvh * s.head_dim + d] = v;
          c.k_pool.set(gqa_cache_offset(c, pg, t % s.page_size, kvh, d), k);
          c.v_pool.set(gqa_cache_offset(c, pg, t % s.page_size, kvh, d), v);
        }
      }
    }
  }
}

// How outputs of a skip-softmax run (`out`, `lse`) sit against those of exact attention on the
// same case (`exact_out`, `exact_lse`; all [batch, q_len, heads, head_dim] / [.., heads]) for
// factor f: every element must lie within f / (1 + f) times its spread over the request's values
// (and 0 with sinks) plus `rel_tol` times the row's largest exact element (both sides' rounding
// and kernel error); every LSE within [-lse_tol, log(1 + f) + lse_tol] below the exact one, and
// infinite only where the exact one is (equal).
struct SkipBound {
  double worst = 0;      // the largest share of its bound an element or LSE used
  long long bad = 0;     // elements outside their bound
  long long lse_bad = 0; // LSE outside theirs
  long long first_bad_lse_row = -1;
};

inline SkipBound skip_bound(const GqaCase& c, const HostTensor& exact_out, const HostTensor& exact_lse,
                            const HostTensor& out, const HostTensor& lse, double f, double rel_tol,
                            double lse_tol) {
  const auto& s = c.spec;
  const int group = s.num_q_heads / s.num_kv_heads;
  const std::int64_t kv_row = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  const double share = f / (1.0 + f);
  SkipBound r;
  std::vector<double> lo(s.head_dim), hi(s.head_dim);
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.num_q_heads; ++h) {
      const int kvh = h / group;
      std::fill(lo.begin(), lo.end(), s.sinks ? 0.0 : 1e300);
      std::fill(hi.begin(), hi.end(), s.sinks ? 0.0 : -1e300);
      for (int t = 0; t < c.lens[b]; ++t) {
        for (int d = 0; d < s.head_dim; ++d) {
          const double v = c.v_logical[b][t * kv_row + kvh * s.head_dim + d] * c.v_scale_of(kvh);
          lo[d] = std::min(lo[d], v);
          hi[d] = std::max(hi[d], v);
        }
      }
      for (int i = 0; i < s.q_len; ++i) {
        const std::int64_t row = (static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h;
        double row_max = 0;
        for (int d = 0; d < s.head_dim; ++d) row_max = std::max(row_max, std::fabs(double(exact_out.get(row * s.head_dim + d))));
        for (int d = 0; d < s.head_dim; ++d) {
          const double a = out.get(row * s.head_dim + d), e = exact_out.get(row * s.head_dim + d);
          const double bound = (hi[d] > lo[d] ? share * (hi[d] - lo[d]) : 0.0) + rel_tol * row_max;
          const double err = std::fabs(a - e);
          if (!(err <= bound)) ++r.bad;
          if (bound > 0) r.worst = std::max(r.worst, err / bound);
        }
        if (!s.lse) continue;
        const double le = exact_lse.data<float>()[row], ls = lse.data<float>()[row];
        const bool inf = std::isinf(le) || std::isinf(ls);
        const double drop = le - ls, top = std::log1p(f) + lse_tol;
        const bool ok = inf ? le == ls : drop >= -lse_tol && drop <= top;
        if (!inf) r.worst = std::max(r.worst, std::max(-drop / lse_tol, drop / top));
        if (!ok && r.lse_bad++ == 0) r.first_bad_lse_row = row;
      }
    }
  }
  return r;
}

// skip_bound as test expectations. Returns the largest share of the bound an element used.
inline double expect_within_skip_bound(const GqaCase& c, const HostTensor& exact_out, const HostTensor& exact_lse,
                                       const HostTensor& out, const HostTensor& lse, double f, double rel_tol,
                                       double lse_tol) {
  const SkipBound r = skip_bound(c, exact_out, exact_lse, out, lse, f, rel_tol, lse_tol);
  EXPECT_EQ(r.lse_bad, 0) << "LSE outside [-" << lse_tol << ", log(1 + f) + " << lse_tol
                          << "] below the exact one, first in row " << r.first_bad_lse_row << " "
                          << seed_message();
  EXPECT_EQ(r.bad, 0) << "elements outside the skip-softmax bound (f = " << f << ", largest share of the bound "
                      << r.worst << ") " << seed_message();
  return r.worst;
}

}  // namespace deca::test
