// The fused decode step's first two steps as kernels of their own (src/cuda/gqa_rope_append.cpp):
// what an engine runs before a plain decode (a rotary kernel, then a cache append), with the fused
// kernels' arithmetic (kernels/gqa/fused.cuh), so that "rotate, append, decode" in three launches
// and the fused launch leave the same bytes. deca-bench --fused times the three launches against
// the one. A generated prologue defines `struct Cfg` (kHeadDim, kQDtype, kKvDtype, kPageSize,
// kRopeStyle, kRotaryDim) and includes this file.
//   mode 0: q rotated into q_out [batch, q_len, num_q_heads, head_dim] (contiguous, q's dtype);
//   mode 1: k_new rotated, k_new and v_new written to their cache slots.
// Grid: x = batch * q_len tokens, y = blocks of 128 (head, pair) items of the token.
#pragma once

#include "kernels/gqa/fused.cuh"
#include "kernels/gqa/params.cuh"

namespace deca::gqa {

template <class C>
struct RopeAppendTraits {
  static constexpr int kHeadDim = C::kHeadDim;
  static constexpr int kQDtype = C::kQDtype;
  static constexpr int kKvDtype = C::kKvDtype;
  static constexpr int kPageSize = C::kPageSize;
  static constexpr int kRopeStyle = C::kRopeStyle;
  static constexpr int kRotaryDim = C::kRotaryDim;
  static constexpr bool kChecked = false;
};

}  // namespace deca::gqa

extern "C" __global__ void __launch_bounds__(128)
    deca_gqa_rope_append(const __grid_constant__ deca::GqaParams p, unsigned short* q_out, int mode) {
  using T = deca::gqa::RopeAppendTraits<Cfg>;
  namespace fused = deca::gqa::fused;
  constexpr int kPairs = T::kHeadDim / 2;
  // Programmatic dependent launch: q, k_new / v_new, seq_lens and the cache may be the previous
  // kernel's, so the wait comes first. The body is a few dependent loads and stores with nothing
  // bandwidth-bound for the next grid to compete with: it may start launching at once.
  deca::ptx::griddep_wait();
  deca::ptx::griddep_launch_dependents();
  const int b = blockIdx.x / p.q_len;
  const int i = blockIdx.x % p.q_len;
  const int item = blockIdx.y * 128 + threadIdx.x;
  const int len = p.seq_lens[b];
  const int h = item / kPairs;
  const int j = item % kPairs;
  if (mode == 0) {
    if (h >= p.num_q_heads) return;
    const long long row = b * p.q_stride_batch + i * p.q_stride_token + h * p.q_stride_head;
    const fused::PairDims d = fused::pair_dims<T>(j);
    const float2 v = fused::rotated_pair<T>(p, p.q, row, len > 0 ? fused::token_pos<T>(p, b, i, len) : 0,
                                            len > 0 ? d : fused::PairDims{d.a, d.b, false}, j);
    unsigned short* dst = q_out + ((static_cast<long long>(b) * p.q_len + i) * p.num_q_heads + h) * T::kHeadDim;
    dst[d.a] = fused::q_bits<T>(v.x);
    dst[d.b] = fused::q_bits<T>(v.y);
  } else {
    if (h >= p.num_kv_heads || len == 0) return;
    (void)fused::code_new_pair<T>(p, b, i, len, h, j, true);
  }
}
