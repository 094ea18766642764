// Visiting every element of a strided TensorView in row-major order, for the host-side
// quantisers (which accept any strides).
#pragma once

#include <cstdint>

#include "deca/tensor.hpp"

namespace deca::cpu {

// Calls fn(offset) for each element, offset in elements from view.data, in row-major order of
// the logical index.
template <typename Fn>
void for_each_offset(const TensorView& view, Fn&& fn) {
  if (view.numel() == 0) return;
  std::int64_t index[kMaxRank] = {};
  std::int64_t offset = 0;
  while (true) {
    fn(offset);
    int d = view.rank - 1;
    for (; d >= 0; --d) {
      ++index[d];
      offset += view.stride[d];
      if (index[d] < view.shape[d]) break;
      offset -= view.stride[d] * view.shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Two views of the same shape walked together.
template <typename Fn>
void for_each_offset_pair(const TensorView& a, const TensorView& b, Fn&& fn) {
  if (a.numel() == 0) return;
  std::int64_t index[kMaxRank] = {};
  std::int64_t oa = 0, ob = 0;
  while (true) {
    fn(oa, ob);
    int d = a.rank - 1;
    for (; d >= 0; --d) {
      ++index[d];
      oa += a.stride[d];
      ob += b.stride[d];
      if (index[d] < a.shape[d]) break;
      oa -= a.stride[d] * a.shape[d];
      ob -= b.stride[d] * b.shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace deca::cpu
