// The fused decode step's arguments (GqaConfig::rope_style, GqaDecodeArgs::k_new ..
// positions): every malformed one is rejected with a message naming it, before anything is
// written (outputs poisoned and checked, the caches compared).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "api/api_fixtures.hpp"

namespace deca::test {
namespace {

class GqaFusedArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    c.config.rope_style = RopeStyle::kNeox;
    c.build();
    const int hk = c.config.num_kv_heads, d = c.config.head_dim;
    k_new = HostTensor(DType::kBF16, {c.batch, c.q_len, hk, d});
    v_new = HostTensor(DType::kBF16, {c.batch, c.q_len, hk, d});
    for (std::int64_t i = 0; i < k_new.numel(); ++i) k_new.set(i, 0.25f * static_cast<float>(i % 5));
    for (std::int64_t i = 0; i < v_new.numel(); ++i) v_new.set(i, -0.5f * static_cast<float>(i % 3));
    cos_sin = HostTensor(DType::kFP32, {16, d});
    for (std::int64_t i = 0; i < cos_sin.numel(); ++i) cos_sin.data<float>()[i] = (i % d) < d / 2 ? 1.f : 0.f;
    positions = HostTensor(DType::kINT32, {c.batch, c.q_len});
    for (int b = 0; b < c.batch; ++b) positions.data<int>()[b] = c.lens[b] - 1;
    c.args.k_new = k_new.view();
    c.args.v_new = v_new.view();
    c.args.cos_sin_cache = cos_sin.view();
  }
  // Rejected, and neither cache written.
  ::testing::AssertionResult rejects(std::initializer_list<std::string> needles) {
    const HostTensor k_before = c.k, v_before = c.v;
    ::testing::AssertionResult r = c.rejects(needles);
    if (!r) return r;
    if (std::memcmp(k_before.raw(), c.k.raw(), c.k.bytes()) != 0 ||
        std::memcmp(v_before.raw(), c.v.raw(), c.v.bytes()) != 0) {
      return ::testing::AssertionFailure() << "a rejected call wrote the cache";
    }
    return r;
  }
  GqaCase c;
  HostTensor k_new, v_new, cos_sin, positions;
};

TEST_F(GqaFusedArgs, ValidCallWritesTheNewSlots) {
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
  // cos 1, sin 0: the key is stored as given, at its slot (request 0, position 4: page
  // page_table[0][1], slot 0).
  const int page = c.page_table.data<int>()[1];
  const std::int64_t slot0 = static_cast<std::int64_t>(page) * 4 * c.config.num_kv_heads * c.config.head_dim;
  for (int d = 0; d < c.config.head_dim; ++d) ASSERT_EQ(c.k.get(slot0 + d), k_new.get(d)) << d;
  c.args.positions = positions.view();
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
}

TEST_F(GqaFusedArgs, PlanRejectsBadRopeConfig) {
  c.config.rotary_dim = 24;
  EXPECT_TRUE(c.plan_rejects({"plan_gqa_decode: config.rotary_dim", "multiple of 16", "got 24"}));
  c.config.rotary_dim = 48;
  EXPECT_TRUE(c.plan_rejects({"config.rotary_dim", "16..head_dim (32)", "got 48"}));
  c.config.rotary_dim = 0;
  c.config.rope_style = static_cast<RopeStyle>(7);
  EXPECT_TRUE(c.plan_rejects({"config.rope_style", "kNeox", "value 7"}));
  c.config.rope_style = RopeStyle::kNone;
  c.config.rotary_dim = 16;
  EXPECT_TRUE(c.plan_rejects({"config.rotary_dim", "0 without a rope_style", "got 16"}));
}

TEST_F(GqaFusedArgs, MissingOrUnwantedTensors) {
  c.args.k_new = TensorView{};
  EXPECT_TRUE(rejects({"gqa_decode: k_new", "rope_style"}));
  c.args.k_new = k_new.view();
  c.args.cos_sin_cache = TensorView{};
  EXPECT_TRUE(rejects({"gqa_decode: cos_sin_cache"}));
  c.args.cos_sin_cache = cos_sin.view();
  // A plain plan takes none of them.
  c.config.rope_style = RopeStyle::kNone;
  EXPECT_TRUE(rejects({"gqa_decode: k_new", "expected absent"}));
}

TEST_F(GqaFusedArgs, ShapesAndDtypes) {
  HostTensor fp16(DType::kFP16, {c.batch, c.q_len, c.config.num_kv_heads, c.config.head_dim});
  c.args.v_new = fp16.view();
  EXPECT_TRUE(rejects({"gqa_decode: v_new", "plan.config.q_dtype", "fp16"}));
  c.args.v_new = v_new.view();
  HostTensor heads(DType::kBF16, {c.batch, c.q_len, c.config.num_q_heads, c.config.head_dim});
  c.args.k_new = heads.view();
  EXPECT_TRUE(rejects({"gqa_decode: k_new", "num_kv_heads"}));
  c.args.k_new = k_new.view();
  HostTensor narrow(DType::kFP32, {16, 16});
  c.args.cos_sin_cache = narrow.view();
  EXPECT_TRUE(rejects({"gqa_decode: cos_sin_cache", "rotary_dim", "expected 32", "got 16"}));
  c.args.cos_sin_cache = cos_sin.view();
  HostTensor pos_u32(DType::kUINT32, {c.batch, c.q_len});
  c.args.positions = pos_u32.view();
  EXPECT_TRUE(rejects({"gqa_decode: positions", "int32"}));
}

TEST_F(GqaFusedArgs, PositionsPastTheCosSinCache) {
  positions.data<int>()[1] = 16;
  c.args.positions = positions.view();
  EXPECT_TRUE(rejects({"gqa_decode: positions[1][0]", "[0, 16)", "got 16"}));
  c.args.positions = TensorView{};
  c.args.cos_sin_cache = view_as(cos_sin, {8, 32}, {32, 1});
  EXPECT_TRUE(rejects({"gqa_decode: seq_lens[1] - q_len + 0", "[0, 8)", "got 8"}));
}

// A length below q_len (a request's new tokens are its last q_len keys: they would go to negative
// slots) is refused on the CPU, naming the entry as the checked GPU run reports it; nothing written.
TEST_F(GqaFusedArgs, SeqLenBelowQLen) {
  c.q_len = 3;
  c.lens = {5, 1};
  SetUp();
  EXPECT_TRUE(rejects({"gqa_decode: seq_lens[1]", ">= q_len (3)", "got 1"}));
  c.lens = {5, 3};
  SetUp();
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
}

TEST_F(GqaFusedArgs, CacheMayNotOverlapAnInput) {
  // k_new a view into the K cache's bytes: the append would write what it reads.
  c.args.k_new = view_as(c.k, {c.batch, c.q_len, c.config.num_kv_heads, c.config.head_dim},
                         {64, 64, 32, 1});
  EXPECT_TRUE(rejects({"gqa_decode", "k_cache", "k_new"}));
}

}  // namespace
}  // namespace deca::test
