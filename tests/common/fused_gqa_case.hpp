// The fused decode step's test case (docs/semantics.md, "Fused decode step"): a paged GQA case
// (paged_gqa_case.hpp) plus this step's k_new / v_new before rotary embedding, a cos/sin cache as
// vLLM holds it and optional explicit positions. The new tokens' slots are poisoned in the pools
// (the fused call must write them), and `rotate_and_append` does "rotate, then append" the
// separate way, with the test's own arithmetic, for comparison: the rotated q and the pools
// the fused call must leave (every other byte, other requests' slots and spare pages included,
// as it was).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/paged_gqa_case.hpp"
#include "deca/gqa.hpp"

namespace deca::test {

struct FusedSpec {
  RopeStyle style = RopeStyle::kNeox;
  int rotary_dim = 0;  // 0 = head_dim
  bool positions = false;  // explicit positions (shifted by `position_shift` from the slots)
  int position_shift = 3;
  DType cos_sin_dtype = DType::kFP32;
};

struct FusedInputs {
  FusedSpec spec;
  int rotary_dim = 0;
  HostTensor k_new, v_new, cos_sin, positions;
};

inline int fused_position(const GqaCase& c, const FusedInputs& in, int b, int i) {
  const int t = c.lens[b] - c.spec.q_len + i;
  return in.spec.positions ? in.positions.data<int>()[b * c.spec.q_len + i] : t;
}

// Points the params' fused fields at the host inputs (a GPU test re-points the pointers).
inline void bind_fused(GqaParams& p, const GqaCase& c, const FusedInputs& in) {
  const auto& s = c.spec;
  p.rope_style = static_cast<int>(in.spec.style);
  p.rotary_dim = in.rotary_dim;
  p.k_new = in.k_new.raw();
  p.v_new = in.v_new.raw();
  p.k_new_stride_head = p.v_new_stride_head = s.head_dim;
  p.k_new_stride_token = p.v_new_stride_token = static_cast<long long>(s.num_kv_heads) * s.head_dim;
  p.k_new_stride_batch = p.v_new_stride_batch = static_cast<long long>(s.q_len) * p.k_new_stride_token;
  p.cos_sin = in.cos_sin.raw();
  p.cos_sin_stride = in.rotary_dim;
  p.cos_sin_dtype = static_cast<int>(in.spec.cos_sin_dtype);
  p.max_position = static_cast<int>(in.cos_sin.shape()[0]);
  p.positions = in.spec.positions ? in.positions.data<int>() : nullptr;
  p.positions_stride_batch = s.q_len;
}

// The fused step's contract on the lengths (docs/semantics.md, "Fused decode step"): a request's
// new tokens are its last q_len keys, so each length is 0 (nothing appended) or at least q_len.
// The helpers below write the new tokens' slots on the host (a shorter length would put them at
// negative slots, outside the pools), and a GPU run would only report the length through its
// checked record: a case outside the contract is refused here, before either.
inline void expect_fused_lengths(const GqaCase& c) {
  for (int b = 0; b < c.spec.batch; ++b) {
    const int len = c.lens[b];
    if (len != 0 && len < c.spec.q_len) {
      throw std::invalid_argument("fused test case: seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
                                  ": expected 0 or a length >= q_len (" + std::to_string(c.spec.q_len) + ")");
    }
  }
}

// The fused inputs of case `c` (built with build_gqa_case), its new slots poisoned, its params
// bound. The cos/sin cache is the usual base-10000 one, sized past the largest position.
inline FusedInputs make_fused_inputs(GqaCase& c, const FusedSpec& f, std::mt19937_64& rng) {
  expect_fused_lengths(c);
  const auto& s = c.spec;
  FusedInputs in;
  in.spec = f;
  in.rotary_dim = f.rotary_dim ? f.rotary_dim : s.head_dim;
  std::normal_distribution<float> normal(0.f, s.value_range);
  in.k_new = HostTensor(s.q_dtype, {s.batch, s.q_len, s.num_kv_heads, s.head_dim});
  in.v_new = HostTensor(s.q_dtype, {s.batch, s.q_len, s.num_kv_heads, s.head_dim});
  for (std::int64_t i = 0; i < in.k_new.numel(); ++i) in.k_new.set(i, normal(rng));
  for (std::int64_t i = 0; i < in.v_new.numel(); ++i) in.v_new.set(i, normal(rng));
  int longest = 1;
  for (int l : c.lens) longest = std::max(longest, l);
  const int max_position = longest + f.position_shift + 1;
  const int half = in.rotary_dim / 2;
  in.cos_sin = HostTensor(f.cos_sin_dtype, {max_position, in.rotary_dim});
  for (int pos = 0; pos < max_position; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(10000.0, -2.0 * i / in.rotary_dim);
      in.cos_sin.set(static_cast<std::int64_t>(pos) * in.rotary_dim + i, static_cast<float>(std::cos(angle)));
      in.cos_sin.set(static_cast<std::int64_t>(pos) * in.rotary_dim + half + i, static_cast<float>(std::sin(angle)));
    }
  }
  in.positions = HostTensor(DType::kINT32, {s.batch, s.q_len});
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      // Explicit positions differ from the slots (shifted, per request) so that a kernel that
      // ignored them would be caught.
      in.positions.data<int>()[b * s.q_len + i] = c.lens[b] - s.q_len + i + (f.positions ? b % (f.position_shift + 1) : 0);
    }
  }
  // Poison the new tokens' slots: the fused call must write them.
  const std::int64_t cols = c.page_table.shape()[1];
  const std::int64_t v_shift = s.kv_one_allocation ? gqa_page_elems(s) : 0;
  HostTensor& v_store = s.kv_one_allocation ? c.k_pool : c.v_pool;
  const std::size_t esz = dtype_size(s.kv_dtype);
  for (int b = 0; b < s.batch; ++b) {
    if (c.lens[b] == 0) continue;
    for (int t = c.lens[b] - s.q_len; t < c.lens[b]; ++t) {
      const std::int64_t pg = c.page_table.data<int>()[b * cols + t / s.page_size];
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const std::int64_t o = gqa_cache_offset(c, pg, t % s.page_size, h, 0);
        std::memset(static_cast<char*>(c.k_pool.raw()) + o * esz, poison_byte(s.kv_dtype), s.head_dim * esz);
        std::memset(static_cast<char*>(v_store.raw()) + (o + v_shift) * esz, poison_byte(s.kv_dtype), s.head_dim * esz);
      }
    }
  }
  bind_fused(c.params, c, in);
  return in;
}

// Row x (head_dim floats) rotated at pos as the specification states it (products and sums in
// fp32, no fused multiply-add), then rounded to `dtype`.
inline void test_rotate(const FusedInputs& in, int pos, DType dtype, std::vector<float>& x) {
  const int half = in.rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float c = in.cos_sin.get(static_cast<std::int64_t>(pos) * in.rotary_dim + i);
    const float s = in.cos_sin.get(static_cast<std::int64_t>(pos) * in.rotary_dim + half + i);
    const bool neox = in.spec.style == RopeStyle::kNeox;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const volatile float xc = x[a] * c, ys = x[b] * s, yc = x[b] * c, xs = x[a] * s;
    x[a] = xc - ys;
    x[b] = yc + xs;
  }
  for (float& v : x) v = round_to(dtype, v);
}

struct Unfused {
  HostTensor q_rot, k_pool, v_pool;  // the rotated q and the pools after the append
};

// "Rotate, then append", separately: what a rotary kernel and a cache append would leave.
inline Unfused rotate_and_append(const GqaCase& c, const FusedInputs& in) {
  const auto& s = c.spec;
  Unfused u;
  u.q_rot = HostTensor(s.q_dtype, c.q.shape());
  u.k_pool = c.k_pool;
  if (!s.kv_one_allocation) u.v_pool = c.v_pool;
  HostTensor& v_store = s.kv_one_allocation ? u.k_pool : u.v_pool;
  const std::int64_t v_shift = s.kv_one_allocation ? gqa_page_elems(s) : 0;
  const std::int64_t cols = c.page_table.shape()[1];
  std::vector<float> x(s.head_dim);
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      const bool live = c.lens[b] > 0;
      const int pos = live ? fused_position(c, in, b, i) : 0;
      for (int h = 0; h < s.num_q_heads; ++h) {
        const std::int64_t o = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h) * s.head_dim;
        for (int d = 0; d < s.head_dim; ++d) x[d] = c.q.get(o + d);
        if (live) test_rotate(in, pos, s.q_dtype, x);
        for (int d = 0; d < s.head_dim; ++d) u.q_rot.set(o + d, x[d]);
      }
      if (!live) continue;
      const int t = c.lens[b] - s.q_len + i;
      const std::int64_t pg = c.page_table.data<int>()[b * cols + t / s.page_size];
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const std::int64_t n = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_kv_heads + h) * s.head_dim;
        const std::int64_t o = gqa_cache_offset(c, pg, t % s.page_size, h, 0);
        for (int d = 0; d < s.head_dim; ++d) x[d] = in.k_new.get(n + d);
        test_rotate(in, pos, s.q_dtype, x);
        for (int d = 0; d < s.head_dim; ++d) u.k_pool.set(o + d, stored_value(s.kv_dtype, x[d], c.k_scale_of(h)));
        for (int d = 0; d < s.head_dim; ++d) {
          v_store.set(o + v_shift + d, stored_value(s.kv_dtype, in.v_new.get(n + d), c.v_scale_of(h)));
        }
      }
    }
  }
  return u;
}

inline bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

}  // namespace deca::test
