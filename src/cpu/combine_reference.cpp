// Split-KV combine reference: merges per-split normalised outputs by their LSE (docs/semantics.md,
// "Combine"). Each split's output is already divided by its own sum, so weighting
// it by exp(lse_s) restores its share of the full softmax.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/element_io.hpp"
#include "cpu/parallel.hpp"
#include "cpu/reference.hpp"

namespace deca::cpu {

void combine(const CombineParams& p) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  parallel_for(static_cast<std::int64_t>(p.batch) * p.q_len, [&](std::int64_t item, int) {
    const int b = static_cast<int>(item / p.q_len);
    const int i = static_cast<int>(item % p.q_len);
    std::vector<double> acc(p.dim_v);
    for (int h = 0; h < p.num_heads; ++h) {
      const std::int64_t lo = b * p.pl_stride_batch + i * p.pl_stride_token + h * p.pl_stride_head;
      const std::int64_t po = b * p.po_stride_batch + i * p.po_stride_token + h * p.po_stride_head;
      // A split with lse = -inf saw no key: it is skipped outright, so whatever its partial
      // output holds (zeros, garbage, NaN) cannot leak in through 0 * x.
      double m = neg_inf;
      for (int s = 0; s < p.num_splits; ++s) {
        const double l = p.partial_lse[s * p.pl_stride_split + lo];
        if (l != neg_inf && !(l <= m)) m = l;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double lse = neg_inf;
      if (m != neg_inf) {
        double sum = 0.0;
        for (int s = 0; s < p.num_splits; ++s) {
          const double l = p.partial_lse[s * p.pl_stride_split + lo];
          if (l == neg_inf) continue;
          const double w = std::exp(l - m);
          sum += w;
          const float* o = p.partial_out + s * p.po_stride_split + po;
          for (int d = 0; d < p.dim_v; ++d) acc[d] += w * static_cast<double>(o[d]);
        }
        lse = m + std::log(sum);
        const double denom = sum + (p.attn_sink ? std::exp(p.attn_sink[h] - m) : 0.0);
        for (int d = 0; d < p.dim_v; ++d) acc[d] /= denom;
      }
      const std::int64_t oo = b * p.out_stride_batch + i * p.out_stride_token + h * p.out_stride_head;
      for (int d = 0; d < p.dim_v; ++d) store_element(p.out, p.out_dtype, oo + d, acc[d]);
      if (p.lse) {
        p.lse[b * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] =
            static_cast<float>(lse);
      }
    }
  });
}

}  // namespace deca::cpu
