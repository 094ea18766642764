#include "cpu/skip_softmax.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace deca::cpu {

int skip_span(int pos, int window, int later_drafts) {
  const int causal = pos + 1;
  return (window > 0 && window < causal ? window : causal) + later_drafts;
}

int drop_skipped_tiles(const std::vector<double>& logit, int lo, int hi, double factor, int span,
                       unsigned char* visible) {
  // exp(m_t - m_run) < factor / span, in the log domain: m_run = -inf gives -inf on the right,
  // which nothing is below.
  const double threshold = std::log(factor) - std::log(static_cast<double>(span));
  double m_run = -std::numeric_limits<double>::infinity();
  int dropped = 0;
  const int first = lo / kSkipRefTile * kSkipRefTile;
  for (int t0 = first; t0 < hi; t0 += kSkipRefTile) {
    const int a = std::max(t0, lo);
    const int b = std::min(t0 + kSkipRefTile, hi);
    double m_t = -std::numeric_limits<double>::infinity();
    bool any = false;
    for (int t = a; t < b; ++t) {
      if (!visible[t]) continue;
      any = true;
      const double x = logit[t - lo];
      if (x > m_t || std::isnan(x)) m_t = x;  // a NaN stays: the tile is kept and NaN shows
    }
    if (!any) continue;
    if (m_t < m_run + threshold) {
      std::fill(visible + a, visible + b, static_cast<unsigned char>(0));
      ++dropped;
    } else {
      m_run = std::max(m_run, m_t);
    }
  }
  return dropped;
}

void attend_row_skip(const double* q, const GatheredKV& kv, int lo, int hi, unsigned char* visible,
                     const RowMath& math, double factor, int span, double* out, double* lse,
                     std::vector<double>& scratch) {
  lo = std::max(lo, 0);
  hi = std::min(hi, kv.num_keys);
  if (row_logits(q, kv, lo, hi, visible, math, scratch)) {
    drop_skipped_tiles(scratch, lo, hi, factor, span, visible);
  }
  attend_row(q, kv, lo, hi, visible, math, out, lse, scratch);
}

}  // namespace deca::cpu
