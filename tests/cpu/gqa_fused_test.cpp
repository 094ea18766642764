// The fused decode step's reference (src/cpu/gqa_fused.cpp) against "rotate, append, then decode"
// done separately (tests/common/fused_gqa_case.hpp's own arithmetic, then the plain reference):
// the pools byte for byte (every other request's slot and spare page untouched) and the outputs
// bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/fused_gqa_case.hpp"
#include "common/paged_gqa_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"

namespace deca::test {
namespace {

struct FusedCpuCase {
  std::string name;
  GqaCaseSpec spec;
  FusedSpec fused;
};

std::vector<FusedCpuCase> fused_cases() {
  std::vector<FusedCpuCase> v;
  auto add = [&](const std::string& name, auto&& edit) {
    FusedCpuCase c;
    c.name = name;
    c.spec.batch = 3;
    c.spec.num_q_heads = 6;
    c.spec.num_kv_heads = 2;
    c.spec.head_dim = 64;
    c.spec.page_size = 16;
    // Page boundaries: a new token at slot 0 (17), at the page's last slot (32), the first
    // token of a request (1 = q_len).
    c.spec.seq_lens = {17, 32, 1};
    edit(c);
    v.push_back(c);
  };
  add("neox_bf16", [](FusedCpuCase&) {});
  add("gptj_bf16", [](FusedCpuCase& c) { c.fused.style = RopeStyle::kGptj; });
  add("neox_partial32", [](FusedCpuCase& c) { c.fused.rotary_dim = 32; });
  add("gptj_partial16_fp16", [](FusedCpuCase& c) {
    c.fused.style = RopeStyle::kGptj;
    c.fused.rotary_dim = 16;
    c.spec.q_dtype = c.spec.out_dtype = DType::kFP16;
    c.spec.kv_dtype = DType::kFP16;
  });
  add("bf16_cos_sin_positions", [](FusedCpuCase& c) {
    c.fused.cos_sin_dtype = DType::kBF16;
    c.fused.positions = true;
  });
  add("fp8_per_tensor", [](FusedCpuCase& c) { c.spec.kv_dtype = DType::kFP8E4M3; });
  add("fp8_per_head_hnd", [](FusedCpuCase& c) {
    c.spec.kv_dtype = DType::kFP8E4M3;
    c.spec.per_head_scales = true;
    c.spec.layout = KvLayout::kHND;
  });
  add("int8_per_head", [](FusedCpuCase& c) {
    c.spec.kv_dtype = DType::kINT8;
    c.spec.per_head_scales = true;
  });
  add("int8_per_tensor_one_allocation", [](FusedCpuCase& c) {
    c.spec.kv_dtype = DType::kINT8;
    c.spec.kv_one_allocation = true;
  });
  add("q4_tree_window_sinks", [](FusedCpuCase& c) {
    c.spec.q_len = 4;
    c.spec.seq_lens = {19, 4, 33};
    c.spec.tree_mask = true;
    c.spec.window = 9;
    c.spec.sinks = true;
    c.spec.softcap = 20.f;
  });
  add("fp8_out", [](FusedCpuCase& c) {
    c.spec.out_dtype = DType::kFP8E4M3;
    c.spec.out_scale = 0.5f;
    c.spec.kv_dtype = DType::kFP8E4M3;
  });
  add("q3_empty_request", [](FusedCpuCase& c) {
    c.spec.q_len = 3;
    c.spec.seq_lens = {0, 16, 18};
  });
  return v;
}

class GqaFusedReference : public ::testing::TestWithParam<FusedCpuCase> {};

TEST_P(GqaFusedReference, EqualsRotateAppendDecode) {
  const FusedCpuCase& fc = GetParam();
  auto rng = make_rng(std::hash<std::string>{}(fc.name));
  GqaCase c = build_gqa_case(fc.spec, rng);
  const FusedInputs in = make_fused_inputs(c, fc.fused, rng);
  const Unfused u = rotate_and_append(c, in);

  // Separately: the plain decode over the appended pools with the rotated q.
  GqaCase plain = build_gqa_case(fc.spec, rng);  // same shapes; its buffers replaced below
  plain.q = u.q_rot;
  plain.k_pool = u.k_pool;
  if (!fc.spec.kv_one_allocation) plain.v_pool = u.v_pool;
  plain.page_table = c.page_table;
  plain.seq_lens = c.seq_lens;
  if (fc.spec.tree_mask) plain.tree_mask = c.tree_mask;
  if (fc.spec.sinks) plain.sinks = c.sinks;
  if (fc.spec.per_head_scales) {
    plain.k_scales = c.k_scales;
    plain.v_scales = c.v_scales;
  }
  plain.k_scale = c.k_scale;
  plain.v_scale = c.v_scale;
  plain.lens = c.lens;
  plain.bind();
  cpu::gqa_decode(plain.params);

  const HostTensor q_before = c.q;
  cpu::gqa_decode_fused(c.params);
  EXPECT_TRUE(same_bytes(c.q, q_before)) << "the fused step wrote q";
  EXPECT_TRUE(same_bytes(c.k_pool, u.k_pool)) << "K pool differs from rotate + append";
  if (!fc.spec.kv_one_allocation) EXPECT_TRUE(same_bytes(c.v_pool, u.v_pool)) << "V pool differs";
  EXPECT_TRUE(same_bytes(c.out, plain.out)) << "output differs from the separate steps' decode";
  if (fc.spec.lse) EXPECT_TRUE(same_bytes(c.lse, plain.lse)) << "LSE differs";
}

INSTANTIATE_TEST_SUITE_P(Styles, GqaFusedReference, ::testing::ValuesIn(fused_cases()),
                         [](const auto& info) { return info.param.name; });

// One request of `len` keys, one KV head of 32 dims: the hand-made cases below.
GqaCaseSpec one_request(int num_q_heads, int len) {
  GqaCaseSpec s;
  s.batch = 1;
  s.num_q_heads = num_q_heads;
  s.num_kv_heads = 1;
  s.head_dim = 32;
  s.seq_lens = {len};
  return s;
}

// Rotation by position 0 is the identity (cos 1, sin 0): the fused step at a position-0 token
// stores k_new as given.
TEST(GqaFusedReferenceHand, PositionZeroStoresKeyUnrotated) {
  const GqaCaseSpec s = one_request(2, 1);
  auto rng = make_rng(7);
  GqaCase c = build_gqa_case(s, rng);
  const FusedInputs in = make_fused_inputs(c, FusedSpec{}, rng);
  cpu::gqa_decode_fused(c.params);
  const std::int64_t pg = c.page_table.data<int>()[0];
  for (int d = 0; d < s.head_dim; ++d) {
    ASSERT_EQ(c.k_pool.get(gqa_cache_offset(c, pg, 0, 0, d)), in.k_new.get(d)) << "dim " << d;
    ASSERT_EQ(c.v_pool.get(gqa_cache_offset(c, pg, 0, 0, d)), in.v_new.get(d)) << "dim " << d;
  }
}

// The rotation's products are each rounded to fp32 before the difference (no fused multiply-add),
// whatever the host compiler contracts. With x = y = 1 + 2^-7 (bf16) and c = s = 1 + 2^-17, the
// exact x c = 1 + 2^-7 + 2^-17 + 2^-24 rounds (a tie, to even) to 1 + 2^-7 + 2^-17: x c - y s is
// exactly 0 from the rounded products, +-2^-24 (bf16 0x3380 / 0xB380) if either is fused.
TEST(GqaFusedReferenceHand, RotationProductsRoundedBeforeTheSum) {
  const GqaCaseSpec s = one_request(1, 2);  // the new token at position 1
  auto rng = make_rng(11);
  GqaCase c = build_gqa_case(s, rng);
  FusedInputs in = make_fused_inputs(c, FusedSpec{}, rng);
  const float x = 1.f + std::ldexp(1.f, -7);
  const float cs = 1.f + std::ldexp(1.f, -17);
  const int half = s.head_dim / 2;
  in.k_new.set(0, x);     // NeoX pair 0: dims 0 and half
  in.k_new.set(half, x);
  in.cos_sin.set(1 * s.head_dim + 0, cs);     // position 1, frequency 0: cos
  in.cos_sin.set(1 * s.head_dim + half, cs);  // and sin
  cpu::gqa_decode_fused(c.params);
  const std::int64_t pg = c.page_table.data<int>()[0];
  const std::uint16_t k0 = c.k_pool.data<std::uint16_t>()[gqa_cache_offset(c, pg, 1, 0, 0)];
  EXPECT_EQ(k0, 0u) << "x c - y s fused into one rounding (bits " << k0 << ")";
}

}  // namespace
}  // namespace deca::test
