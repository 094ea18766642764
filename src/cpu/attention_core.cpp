#include "cpu/attention_core.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace deca::cpu {

bool row_logits(const double* q, const GatheredKV& kv, int lo, int hi, const unsigned char* visible,
                const RowMath& math, std::vector<double>& logit) {
  const int n = kv.num_keys;
  lo = std::max(lo, 0);
  hi = std::min(hi, n);
  if (lo >= hi) return false;

  logit.assign(static_cast<std::size_t>(hi - lo), 0.0);
  for (int d = 0; d < kv.dk; ++d) {
    const double qd = q[d];
    const float* k = kv.kt.data() + static_cast<std::size_t>(d) * n + lo;
    for (int t = 0; t < hi - lo; ++t) logit[t] += qd * static_cast<double>(k[t]);
  }
  bool any = false;
  for (int t = lo; t < hi; ++t) {
    if (visible && !visible[t]) continue;
    any = true;
    double x = math.logit_scale * logit[t - lo];
    if (math.softcap > 0.0) x = math.softcap * std::tanh(x / math.softcap);
    logit[t - lo] = x;
  }
  return any;
}

void attend_row(const double* q, const GatheredKV& kv, int lo, int hi,
                const unsigned char* visible, const RowMath& math, double* out, double* lse,
                std::vector<double>& scratch) {
  std::fill(out, out + kv.dv, 0.0);
  *lse = -std::numeric_limits<double>::infinity();
  if (!row_logits(q, kv, lo, hi, visible, math, scratch)) return;
  lo = std::max(lo, 0);
  hi = std::min(hi, kv.num_keys);
  double* logit = scratch.data();
  double m = -std::numeric_limits<double>::infinity();
  for (int t = lo; t < hi; ++t) {
    if (visible && !visible[t]) continue;
    m = std::max(m, logit[t - lo]);
  }

  // m is finite unless a logit is +-inf or NaN (a NaN in the cache); those propagate as they
  // would in any kernel rather than being hidden.
  double sum = 0.0;
  for (int t = lo; t < hi; ++t) {
    if (visible && !visible[t]) continue;
    const double p = std::exp(logit[t - lo] - m);
    logit[t - lo] = p;
    sum += p;
    const float* v = kv.v.data() + static_cast<std::size_t>(t) * kv.dv;
    for (int d = 0; d < kv.dv; ++d) out[d] += p * static_cast<double>(v[d]);
  }
  *lse = m + std::log(sum);
  const double denom = sum + (math.has_sink ? std::exp(math.sink - m) : 0.0);
  const double factor = math.value_scale / denom;
  for (int d = 0; d < kv.dv; ++d) out[d] *= factor;
}

}  // namespace deca::cpu
