// The params fields of q, out and lse for contiguous host tensors, which the GQA, MLA and
// combine test cases lay out alike: q [batch, q_len, heads, q_dim], out [batch, q_len, heads, out_dim],
// lse [batch, q_len, heads] (null unless the case has one).
#pragma once

#include <cstdint>

#include "common/host_tensor.hpp"

namespace deca::test {

template <class Params>
void bind_contiguous_out_lse(Params& p, int heads, int q_len, HostTensor& out, int out_dim,
                             HostTensor& lse, bool has_lse) {
  p.out = out.raw();
  p.out_stride_head = out_dim;
  p.out_stride_token = p.out_stride_head * heads;
  p.out_stride_batch = p.out_stride_token * q_len;
  p.lse = has_lse ? lse.data<float>() : nullptr;
  p.lse_stride_head = 1;
  p.lse_stride_token = heads;
  p.lse_stride_batch = static_cast<std::int64_t>(heads) * q_len;
}

template <class Params>
void bind_contiguous_q_out_lse(Params& p, int heads, int q_len, HostTensor& q, int q_dim,
                               HostTensor& out, int out_dim, HostTensor& lse, bool has_lse) {
  p.q = q.raw();
  p.q_stride_head = q_dim;
  p.q_stride_token = p.q_stride_head * heads;
  p.q_stride_batch = p.q_stride_token * q_len;
  bind_contiguous_out_lse(p, heads, q_len, out, out_dim, lse, has_lse);
}

}  // namespace deca::test
