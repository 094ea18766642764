// Merging split-KV pieces by their LSE, one warp per output row: the device block behind the MLA
// sparse combine and the generic `combine` op. Pieces hold outputs already normalised by their
// own sum, so piece j weighs exp(lse_j - m) with m the largest LSE; the sink (a logit that joins
// the denominator only) adds exp(sink - m) below the line. A piece with lse = -inf saw no key and
// is skipped outright, so whatever its partial row holds (zeros, garbage, NaN) cannot leak in
// through 0 * x; a row whose pieces are all -inf outputs zeros and LSE -inf, sink or not.
#pragma once

namespace deca::merge {

// The weights of a row's pieces, computed redundantly by every lane (pieces are few and their
// LSEs one broadcast load each): m, the sum, the output factor 1 / (sum + sink term), the LSE.
struct RowWeights {
  float m;
  float inv_denom;
  float lse;  // natural log, sink excluded
  bool empty;
};

__device__ __forceinline__ RowWeights row_weights(const float* lse, long long stride, int count,
                                                  const float* sink) {
  const float neg_inf = -__int_as_float(0x7f800000);
  float m = neg_inf;
  for (int j = 0; j < count; ++j) {
    const float l = lse[j * stride];
    if (l != neg_inf && !(l <= m)) m = l;
  }
  RowWeights w;
  w.m = m;
  w.empty = m == neg_inf;
  if (w.empty) {
    w.inv_denom = 0.f;
    w.lse = neg_inf;
    return w;
  }
  float sum = 0.f;
  for (int j = 0; j < count; ++j) {
    const float l = lse[j * stride];
    if (l != neg_inf) sum += __expf(l - m);
  }
  w.lse = m + __logf(sum);
  const float denom = sum + (sink != nullptr ? __expf(*sink - m) : 0.f);
  w.inv_denom = __frcp_rn(denom);  // no IEEE-division slow path (a call that spills)
  return w;
}

// The weight of one piece (0 for an empty piece: its row is never read).
__device__ __forceinline__ float piece_weight(const RowWeights& w, float lse) {
  const float neg_inf = -__int_as_float(0x7f800000);
  return lse == neg_inf ? 0.f : __expf(lse - w.m) * w.inv_denom;
}

}  // namespace deca::merge
