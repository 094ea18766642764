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
  // In tiles at one SM's share of the DRAM rate, fitted to the split sweep and the merge's phase
  // stamps (docs/perf-notes.md, "The split count, swept on the merged code"): a wave's fixed
  // cost; the merge, a constant and a slope in the split count; what two co-resident CTAs lose
  // to each other (bf16 and fp8 bracket this figure).
  constexpr double kFixed = 2.0;
  constexpr double kMergeBase = 1.2;
  constexpr double kMergePerSplit = 0.08;
  constexpr double kShared = 0.05;
  const double rate = in.cta_rate > 0 ? in.cta_rate : 1.0;
  // Where the unsplit grid already overflows one wave, the wave count's view measured better:
  // more, shorter CTAs even out the last wave and ragged lengths (the multi-wave rows of the
  // `gqa` preset ran slower unsplit), which the SM-share view does not see.
  const bool one_wave = in.units <= slots;
  int best = 1;
  double best_cost = 0;
  for (int s = 1; s <= cap; ++s) {
    const long long ctas = in.units * s;
    const double waves = std::ceil(static_cast<double>(ctas) / static_cast<double>(slots));
    const double per_cta = std::ceil(static_cast<double>(tiles) / s);
    double stream = waves * per_cta;
    if (one_wave) {
      const long long per_sm = (ctas + in.sm_count - 1) / in.sm_count;
      const long long resident = std::min<long long>(per_sm, std::max(in.ctas_per_sm, 1));
      const double sm_rate = std::min(static_cast<double>(resident) * rate, 1.0) *
                             (resident > 1 ? 1.0 - kShared : 1.0);
      stream = static_cast<double>(per_sm) * per_cta / sm_rate;
    }
    const double cost = stream + waves * kFixed + (s > 1 ? kMergeBase + kMergePerSplit * s : 0.0);
    if (s == 1 || cost < best_cost - 1e-9) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

double cta_rate(double cta_bytes_per_us, double peak_dram_bytes_per_us, int sm_count) {
  constexpr double kCopyOfPeak = 0.9;  // what device-to-device copies reach on H100 and H200
  if (cta_bytes_per_us <= 0 || peak_dram_bytes_per_us <= 0 || sm_count <= 0) return 1.0;
  return cta_bytes_per_us / (kCopyOfPeak * peak_dram_bytes_per_us / sm_count);
}

double gqa_cta_bytes_per_us(int kv_bytes) { return kv_bytes >= 2 ? 42.6e3 : 26.7e3; }

int fixed_split_tokens(int requested, int tile) {
  const int r = std::max(requested, 1);
  return (r + tile - 1) / tile * tile;
}

int fixed_num_splits(int max_keys, int split_tokens) {
  return std::max(1, (max_keys + split_tokens - 1) / split_tokens);
}

}  // namespace deca::plan
