// What both GQA decode kernels (decode.cuh, sm90/decode.cuh) derive the same way from the
// params: a request's length (range-tested in checked mode), the keys a split covers, and the
// power-of-two scale that brings a q row into an 8-bit or fp16 operand's range.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/gqa/params.cuh"

namespace deca::gqa {

// Where this CTA's keys start and end: tile-aligned ranges so that only the request's last tile is
// partial (and zero-filled past the end).
struct KeyRange {
  int begin;  // first key (tile aligned), inclusive
  int end;    // one past the last key
};

// First key any row of a request can see, tile aligned: the window bounds it from below.
// `seq_min`: the shortest sequence of the request's rows (its length without beams).
template <class T>
__device__ __forceinline__ int first_visible_key(const GqaParams& p, int seq_min) {
  int first = 0;
  if constexpr (T::kWindow) {
    const int p0 = seq_min - p.q_len;  // position of the first new token of the shortest beam
    first = p0 - p.window + 1;
    if (first < 0) first = 0;
  }
  return (first / T::kTile) * T::kTile;
}

// `seq_min` / `seq_len`: the shortest and longest sequence of the CTA's rows (equal without beams).
template <class T>
__device__ __forceinline__ KeyRange split_range(const GqaParams& p, int seq_min, int seq_len, int split) {
  const int first = first_visible_key<T>(p, seq_min);
  KeyRange r;
  if (p.split_tokens > 0) {
    // Fixed split size from key 0: a request's partition depends on its own length only.
    r.begin = split * p.split_tokens;
    r.end = r.begin + p.split_tokens;
    if (r.begin < first) r.begin = first;
  } else {
    const int tiles = (seq_len - first + T::kTile - 1) / T::kTile;
    const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
    r.begin = first + split * per_split * T::kTile;
    r.end = r.begin + per_split * T::kTile;
  }
  if (r.end > seq_len) r.end = seq_len;
  return r;
}

// Power of two that brings a row whose largest |q| is `amax` to [2^top, 2^(top+1)) (8-bit caches
// only): top 14 for fp16 (no overflow, and the small elements keep their bits), 7 for e4m3
// (max 448: the rounded largest term stays finite). 1 for an all-zero row.
__device__ __forceinline__ float q_row_scale(float amax, int top) {
  if (!(amax > 0.f) || amax > 3.0e38f) return 1.f;
  const int e = static_cast<int>((__float_as_uint(amax) >> 23) & 0xFF) - 127;  // floor(log2)
  int k = top - e;
  k = k < -126 ? -126 : (k > 127 ? 127 : k);
  return __uint_as_float(static_cast<unsigned>(k + 127) << 23);
}

// Request b's length. Checked mode: a length that is neither 0 nor in [q_len, min(max_pages *
// page_size, max_seq_len)] is recorded and read as 0 (an empty request: zeros, LSE -inf); a longer
// one would walk past its page_table row.
template <class T>
__device__ __forceinline__ int load_seq_len(const GqaParams& p, int b) {
  const int len = p.seq_lens[b];
  if constexpr (T::kChecked) {
    long long hi = static_cast<long long>(p.max_pages) * T::kPageSize;
    if (p.max_seq_len > 0 && p.max_seq_len < hi) hi = p.max_seq_len;
    if (len != 0 && (len < p.q_len || len > hi)) {
      check_report(static_cast<CheckRecord*>(p.check), kCheckSeqLen, b, 0, 0, len, hi);
      return 0;
    }
  }
  return len;
}

// Checked mode's per-CTA slots (see "bad_item" in the kernel); instantiated only when called, so
// an unchecked kernel declares no extra shared memory.
template <int N>
__device__ __forceinline__ int* checked_item_slots() {
  __shared__ int slots[N];
  return slots;
}

// Whether key t is visible to a query row at position `pos` whose request's draft keys start at
// `drafts`: causal (t <= pos), or with a tree mask every key before the drafts and the drafts the
// row's mask bits (`tree`) allow; inside the window when there is one.
template <class T>
__device__ __forceinline__ bool row_sees_key(const GqaParams& p, int t, int pos, int drafts,
                                             const unsigned* tree) {
  bool visible;
  if constexpr (T::kTree) {
    const int jd = t - drafts;
    visible = jd < 0 || ((tree[jd / 32] >> (jd % 32)) & 1u);
  } else {
    visible = t <= pos;
  }
  if constexpr (T::kWindow) visible = visible && t > pos - p.window;
  return visible;
}

}  // namespace deca::gqa
