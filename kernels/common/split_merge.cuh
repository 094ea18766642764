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

// The LSE and the output factor of a non-empty row from its largest LSE (w.m) and the sum of
// exp(lse_j - m) over its pieces.
__device__ __forceinline__ void finish_weights(RowWeights& w, float sum, const float* sink) {
  w.lse = w.m + __logf(sum);
  const float denom = sum + (sink != nullptr ? __expf(*sink - w.m) : 0.f);
  w.inv_denom = __frcp_rn(denom);  // no IEEE-division slow path (a call that spills)
}

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
  finish_weights(w, sum, sink);
  return w;
}

// row_weights spread over a warp, for rows of many pieces: lane t loads the LSEs of pieces t,
// t + 32, ... (one load each, all in flight) instead of every lane loading every LSE in turn.
// The maximum is the same (a maximum is exact in any order) and the sum adds the same terms in
// the same order, lane k's term shuffled to all at step k (an empty piece adds +0, which leaves
// a non-negative sum as it was), so the weights are bitwise row_weights'. Every lane of the warp
// must call it with the same arguments.
__device__ __forceinline__ RowWeights warp_row_weights(const float* lse, long long stride, int count,
                                                       const float* sink) {
  const float neg_inf = -__int_as_float(0x7f800000);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float m = neg_inf;
  for (int j = lane; j < count; j += 32) {
    const float l = lse[j * stride];
    if (l != neg_inf && !(l <= m)) m = l;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float l = __shfl_xor_sync(0xffffffffu, m, o);
    if (l != neg_inf && !(l <= m)) m = l;
  }
  // One value for the whole warp even where a NaN LSE made the butterfly's pairs disagree (the
  // sum is NaN then, as row_weights' is).
  m = __shfl_sync(0xffffffffu, m, 0);
  // row_weights' empty-row block, repeated: a helper shared with it changes the verified
  // combines' register allocation.
  RowWeights w;
  w.m = m;
  w.empty = m == neg_inf;
  if (w.empty) {
    w.inv_denom = 0.f;
    w.lse = neg_inf;
    return w;
  }
  float sum = 0.f;
  for (int base = 0; base < count; base += 32) {
    const int j = base + lane;
    const float l = j < count ? lse[j * stride] : neg_inf;
    const float e = l != neg_inf ? __expf(l - m) : 0.f;
    const int n = count - base < 32 ? count - base : 32;
    for (int k = 0; k < n; ++k) sum += __shfl_sync(0xffffffffu, e, k);
  }
  finish_weights(w, sum, sink);
  return w;
}

// The weight of one piece (0 for an empty piece: its row is never read).
__device__ __forceinline__ float piece_weight(const RowWeights& w, float lse) {
  const float neg_inf = -__int_as_float(0x7f800000);
  return lse == neg_inf ? 0.f : __expf(lse - w.m) * w.inv_denom;
}

}  // namespace deca::merge
