// Skip-softmax test helpers (GqaConfig::skip_softmax_factor, docs/semantics.md "Skip-softmax"):
// peaked data, and the error bound the rule implies, checked element by element.
//
// Peaked data: per (request, kv head) a random unit direction u; every q row of the group is
// sqrt(head_dim) u plus the case's noise, and `heavy` keys (the first min(4, heavy) at the first
// keys every row sees, the rest at random positions) are gap * u plus the noise: their logits sit about `gap` above the bulk's
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
#include "cpu/skip_softmax.hpp"

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
      // The first heavy keys at the first keys every row sees (the window's start; attention
      // sinks at key 0 without a window), so that a split from there has its maximum early.
      const int first = s.window > 0 ? std::max(0, len - s.window) : 0;
      std::uniform_int_distribution<int> any(0, std::max(len - 1, 0));
      const float limit = quant ? 0.999f * qmax * c.k_scale_of(kvh) : 1e30f;
      for (int j = 0; j < std::min(heavy, len); ++j) {
        const int t = j < 4 ? std::min(first + j, len - 1) : any(rng);
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

// The logits of query row (b, i, h) against every key of request b (natural units, soft-capped),
// -inf where the row does not see the key (causal, window, tree mask: the CPU reference's rule).
inline void row_logits_of(const GqaCase& c, int b, int i, int h, std::vector<double>& out) {
  const auto& s = c.spec;
  const int group = s.num_q_heads / s.num_kv_heads, kvh = h / group, len = c.lens[b];
  const std::int64_t kv_row = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  const double scale = s.softmax_scale != 0.f ? s.softmax_scale : 1.0 / std::sqrt(double(s.head_dim));
  const std::int64_t qo = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h) * s.head_dim;
  const int draft_start = len - s.q_len, pos = draft_start + i;
  const unsigned* mask = s.tree_mask ? c.tree_mask.data<unsigned>() + (static_cast<std::int64_t>(b) * s.q_len + i) *
                                                                          ((s.q_len + 31) / 32)
                                     : nullptr;
  out.assign(static_cast<std::size_t>(std::max(len, 0)), -INFINITY);
  for (int t = 0; t < len; ++t) {
    bool see = mask && t >= draft_start ? ((mask[(t - draft_start) / 32] >> ((t - draft_start) % 32)) & 1u) != 0
                                        : t <= pos;
    if (s.window > 0 && t <= pos - s.window) see = false;
    if (!see) continue;
    double dot = 0;
    for (int d = 0; d < s.head_dim; ++d) dot += double(c.q.get(qo + d)) * c.k_logical[b][t * kv_row + kvh * s.head_dim + d];
    double x = dot * c.k_scale_of(kvh) * scale;
    if (s.softcap > 0.f) x = s.softcap * std::tanh(x / s.softcap);
    out[t] = x;
  }
}

// The largest |logit| (natural units) any row of the case sees. The Hopper fp8 kernel's logits
// carry an error that grows with their size (its e4m3 products and tensor-core accumulation), so
// its LSE tolerance scales with this (tests/gpu/gqa_gpu_runner.hpp lse_tolerance, the
// differential's). 0 for a case that keeps no logical arrays (shared_pool_pages).
inline double max_abs_logit(const GqaCase& c) {
  const auto& s = c.spec;
  double m = 0;
  if (c.k_logical.size() != static_cast<std::size_t>(s.batch)) return m;
  std::vector<double> x;
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.q_len; ++i)
      for (int h = 0; h < s.num_q_heads; ++h) {
        row_logits_of(c, b, i, h, x);
        for (double v : x)
          if (std::isfinite(v)) m = std::max(m, std::fabs(v));
      }
  return m;
}

// V rows the skip rule copies when applied as the kernels apply it (docs/semantics.md
// "Skip-softmax"): per (request, kv head), every query row of the kv head in one CTA (beam width
// 1), the keys cut into splits of `split_tokens` (0: one split), each split into `tile`-key tiles
// from its first key, m_ref restarting at -inf per split; a tile's V rows are copied when some
// row keeps it. L as the CPU reference's (cpu::skip_span). Counts {copied, total}.
// `seed` (the Hopper 16-bit kernel, kernels/gqa/sm90/skip.cuh): a split after the one holding the
// first visible tile of the CTA (the tile of key max(0, p0 - W + 1), p0 the first row's position)
// starts each row's m_ref at the row's largest logit in that tile instead.
struct SkipCopies {
  long long copied = 0, total = 0;
  double skipped_share() const { return total ? 1.0 - double(copied) / double(total) : 0.0; }
};

inline SkipCopies simulate_skip_copies(const GqaCase& c, double f, int tile, int split_tokens, bool seed = false) {
  const auto& s = c.spec;
  const int group = s.num_q_heads / s.num_kv_heads, rows = group * s.q_len;
  SkipCopies r;
  std::vector<std::vector<double>> x(static_cast<std::size_t>(rows));
  std::vector<double> thr(static_cast<std::size_t>(rows)), m_ref(static_cast<std::size_t>(rows));
  for (int b = 0; b < s.batch; ++b) {
    const int len = c.lens[b];
    for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
      for (int i = 0; i < s.q_len; ++i) {
        const int pos = len - s.q_len + i;
        const int span = cpu::skip_span(pos, s.window, s.tree_mask ? s.q_len - 1 - i : 0);
        for (int g = 0; g < group; ++g) {
          row_logits_of(c, b, i, kvh * group + g, x[i * group + g]);
          thr[i * group + g] = std::log(f) - std::log(double(std::max(span, 1)));
        }
      }
      const int split = split_tokens > 0 ? split_tokens : std::max(len, 1);
      const int seed_t0 = (s.window > 0 ? std::max(0, len - s.q_len - s.window + 1) : 0) / tile * tile;
      for (int s0 = 0; s0 < len; s0 += split) {
        std::fill(m_ref.begin(), m_ref.end(), -INFINITY);
        if (seed && seed_t0 < s0) {
          for (int row = 0; row < rows; ++row) {
            for (int t = seed_t0; t < std::min(seed_t0 + tile, len); ++t) m_ref[row] = std::max(m_ref[row], x[row][t]);
          }
        }
        for (int t0 = s0; t0 < std::min(s0 + split, len); t0 += tile) {
          const int t1 = std::min({t0 + tile, s0 + split, len});
          bool copy = false;
          for (int row = 0; row < rows; ++row) {
            double m_t = -INFINITY;
            for (int t = t0; t < t1; ++t) m_t = std::max(m_t, x[row][t]);
            if (!(m_t < m_ref[row] + thr[row])) copy = true, m_ref[row] = std::max(m_ref[row], m_t);
          }
          r.total += t1 - t0;
          if (copy) r.copied += t1 - t0;
        }
      }
    }
  }
  return r;
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
