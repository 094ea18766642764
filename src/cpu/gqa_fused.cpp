// The fused decode step's reference (docs/semantics.md, "Fused decode step"): the steps in the
// order the specification states them. 1. q rotated and rounded to q's dtype (into a copy: the
// caller's q is not written); 2. k_new rotated and rounded likewise, then k_new and v_new stored
// into their cache slots (converted, or quantized with the cache's scales); 3. the plain decode
// over the cache, the copy as q.
#include <cstdint>
#include <vector>

#include "cpu/convert.hpp"
#include "cpu/element_io.hpp"
#include "cpu/reference.hpp"
#include "deca/tensor.hpp"
#include "kernels/gqa/rope.cuh"

namespace deca::cpu {

namespace {

// Rotates row x (head_dim floats) at `pos`, then rounds every element to `dtype` (bf16 | fp16).
void rotate_round(const GqaParams& p, int pos, int dtype, std::vector<float>& x) {
  const int half = p.rotary_dim / 2;
  const std::int64_t row = static_cast<std::int64_t>(pos) * p.cos_sin_stride;
  for (int i = 0; i < half; ++i) {
    const float c = load_element(p.cos_sin, p.cos_sin_dtype, row + i);
    const float s = load_element(p.cos_sin, p.cos_sin_dtype, row + half + i);
    const int a = gqa::rope_first(p.rope_style, i);
    const int b = gqa::rope_second(p.rope_style, half, i);
    const float xa = x[a];
    const float xb = x[b];
    x[a] = gqa::rope_x(xa, xb, c, s);
    x[b] = gqa::rope_y(xa, xb, c, s);
  }
  for (float& v : x) {
    v = dtype == static_cast<int>(DType::kFP16) ? fp16_bits_to_float(float_to_fp16_bits(v))
                                                 : bf16_bits_to_float(float_to_bf16_bits(v));
  }
}

// Stores `value` (a q-dtype value) into a cache element: converted, or quantized with `scale`.
void store_cache(void* cache, int dtype, std::int64_t offset, float value, float scale) {
  switch (static_cast<DType>(dtype)) {
    case DType::kFP8E4M3:
      static_cast<std::uint8_t*>(cache)[offset] = float_to_fp8e4m3_bits(value / scale);
      break;
    case DType::kINT8: static_cast<std::int8_t*>(cache)[offset] = gqa::int8_code(value / scale); break;
    default: store_element(cache, dtype, offset, value); break;
  }
}

void load_row(const void* base, int dtype, std::int64_t offset, std::vector<float>& x) {
  for (std::size_t d = 0; d < x.size(); ++d) x[d] = load_element(base, dtype, offset + static_cast<std::int64_t>(d));
}

}  // namespace

void gqa_decode_fused(const GqaParams& p) {
  const int D = p.head_dim;
  const std::int64_t q_elems = static_cast<std::int64_t>(p.batch) * p.q_len * p.num_q_heads * D;
  std::vector<std::uint16_t> q_rot(static_cast<std::size_t>(q_elems), 0);
  std::vector<float> x(static_cast<std::size_t>(D));
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.seq_lens[b];
    if (len == 0) continue;  // an empty request: nothing rotated, nothing written
    const int* pages = p.page_table + static_cast<std::int64_t>(b) * p.page_table_stride;
    for (int i = 0; i < p.q_len; ++i) {
      const int t = len - p.q_len + i;
      const int pos = p.positions ? p.positions[b * p.positions_stride_batch + i] : t;
      for (int h = 0; h < p.num_q_heads; ++h) {
        load_row(p.q, p.q_dtype, b * p.q_stride_batch + i * p.q_stride_token + h * p.q_stride_head, x);
        rotate_round(p, pos, p.q_dtype, x);
        std::uint16_t* dst = q_rot.data() + ((static_cast<std::int64_t>(b) * p.q_len + i) * p.num_q_heads + h) * D;
        for (int d = 0; d < D; ++d) {
          dst[d] = p.q_dtype == static_cast<int>(DType::kFP16) ? float_to_fp16_bits(x[d]) : float_to_bf16_bits(x[d]);
        }
      }
      const std::int64_t page = pages[t / p.page_size];
      const std::int64_t slot = t % p.page_size;
      for (int h = 0; h < p.num_kv_heads; ++h) {
        const float ks = p.k_scales ? p.k_scales[h] : p.k_scale;
        const float vs = p.v_scales ? p.v_scales[h] : p.v_scale;
        load_row(p.k_new, p.q_dtype, b * p.k_new_stride_batch + i * p.k_new_stride_token + h * p.k_new_stride_head, x);
        rotate_round(p, pos, p.q_dtype, x);
        const std::int64_t ko = page * p.k_stride_page + slot * p.k_stride_slot + h * p.k_stride_head;
        for (int d = 0; d < D; ++d) store_cache(const_cast<void*>(p.k_cache), p.kv_dtype, ko + d, x[d], ks);
        load_row(p.v_new, p.q_dtype, b * p.v_new_stride_batch + i * p.v_new_stride_token + h * p.v_new_stride_head, x);
        const std::int64_t vo = page * p.v_stride_page + slot * p.v_stride_slot + h * p.v_stride_head;
        for (int d = 0; d < D; ++d) store_cache(const_cast<void*>(p.v_cache), p.kv_dtype, vo + d, x[d], vs);
      }
    }
  }
  GqaParams plain = p;
  plain.q = q_rot.data();
  plain.q_stride_head = D;
  plain.q_stride_token = static_cast<long long>(p.num_q_heads) * D;
  plain.q_stride_batch = static_cast<long long>(p.q_len) * plain.q_stride_token;
  gqa_decode(plain);
}

}  // namespace deca::cpu
