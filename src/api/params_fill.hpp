// The params fields every decode op lays out alike. q and out are [batch, q_len, heads, dim] and
// lse is [batch, q_len, heads] in GQA, MLA and combine, and the params structs name their fields
// the same, so one template fills each of them.
#pragma once

#include <cmath>

#include "deca/tensor.hpp"

namespace deca::api {

template <class Params>
void fill_q(Params& p, const TensorView& q) {
  p.q = q.data;
  p.q_stride_batch = q.stride[0];
  p.q_stride_token = q.stride[1];
  p.q_stride_head = q.stride[2];
}

// lse is filled only when the plan (or the call) has one; otherwise p.lse stays null.
template <class Params>
void fill_out_lse(Params& p, const TensorView& out, const TensorView& lse, bool has_lse) {
  p.out = out.data;
  p.out_stride_batch = out.stride[0];
  p.out_stride_token = out.stride[1];
  p.out_stride_head = out.stride[2];
  if (has_lse) {
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_batch = lse.stride[0];
    p.lse_stride_token = lse.stride[1];
    p.lse_stride_head = lse.stride[2];
  }
}

// softmax_scale 0 asks for the usual 1 / sqrt(head_dim).
inline float softmax_scale_or_default(float v, int head_dim) {
  return v != 0.f ? v : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

}  // namespace deca::api
