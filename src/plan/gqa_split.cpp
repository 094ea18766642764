#include "plan/gqa_split.hpp"

#include <algorithm>
#include <cmath>

namespace deca::plan {

int ctas_per_sm(int regs_per_thread, int threads_per_cta, int smem_per_cta, const SmLimits& sm) {
  const int warps = (threads_per_cta + 31) / 32;
  const int regs_per_warp =
      (regs_per_thread * 32 + sm.reg_alloc_unit - 1) / sm.reg_alloc_unit * sm.reg_alloc_unit;
  const int by_regs = regs_per_warp > 0 ? sm.regs_per_sm / (regs_per_warp * warps) : sm.max_ctas_per_sm;
  const int by_smem = sm.smem_per_sm / (smem_per_cta + sm.smem_reserved_per_cta);
  const int by_threads = sm.max_threads_per_sm / threads_per_cta;
  const int n = std::min({by_regs, by_smem, by_threads, sm.max_ctas_per_sm});
  return std::max(n, 1);
}

int choose_num_splits(const SplitInputs& in) {
  const long long slots = static_cast<long long>(in.sm_count) * std::max(in.ctas_per_sm, 1);
  const int tiles = std::max(1, (in.max_keys + in.tile - 1) / in.tile);
  const int cap = std::max(1, std::min(in.max_splits, tiles));
  if (in.units <= 0 || slots <= 0) return 1;
  // Per-CTA fixed cost and per-split merge cost, in units of one tile's streaming time.
  constexpr double kFixed = 2.0;
  constexpr double kMergePerSplit = 0.02;
  int best = 1;
  double best_cost = 0;
  for (int s = 1; s <= cap; ++s) {
    const long long ctas = in.units * s;
    const double waves = std::ceil(static_cast<double>(ctas) / static_cast<double>(slots));
    const double per_cta = std::ceil(static_cast<double>(tiles) / s) + kFixed;
    const double cost = waves * per_cta + (s > 1 ? kMergePerSplit * s + 1.0 : 0.0);
    if (s == 1 || cost < best_cost - 1e-9) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

int fixed_split_tokens(int requested, int tile) {
  const int r = std::max(requested, 1);
  return (r + tile - 1) / tile * tile;
}

int fixed_num_splits(int max_keys, int split_tokens) {
  return std::max(1, (max_keys + split_tokens - 1) / split_tokens);
}

}  // namespace deca::plan
