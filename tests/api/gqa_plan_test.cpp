// plan_gqa_decode: every config field is checked with a message naming it, the expectation and
// the value; a valid CPU config gives the trivial CPU plan.
#include <gtest/gtest.h>

#include <limits>

#include "api/api_fixtures.hpp"

namespace deca::test {
namespace {

class GqaPlanConfig : public ::testing::Test {
 protected:
  GqaCase c;
};

TEST_F(GqaPlanConfig, CpuPlanIsTrivial) {
  const GqaPlan plan = c.plan();
  EXPECT_EQ(plan.num_splits, 1);
  EXPECT_EQ(plan.split_tokens, 0);
  EXPECT_EQ(plan.workspace_bytes, 0u);
  EXPECT_EQ(plan.kernel_name, "");
  EXPECT_EQ(plan.config.num_q_heads, c.config.num_q_heads);
}

// A plan carries the config plan_gqa_decode validated: a run checks only its arguments then. A
// plan whose config was edited afterwards, or that was built by hand, has its config checked on
// the run, with the messages naming plan.config.
TEST_F(GqaPlanConfig, RunChecksTheConfigOnlyOfPlansNotMadeOrEditedSincePlanning) {
  c.build();
  GqaPlan plan = c.plan();
  EXPECT_TRUE(plan.validated);
  EXPECT_TRUE(plan.validated_config == c.config);
  EXPECT_NO_THROW(gqa_decode(plan, c.args));
  plan.config.head_dim = 40;  // edited after planning
  EXPECT_FALSE(plan.config == plan.validated_config);
  EXPECT_TRUE(rejected([&] { gqa_decode(plan, c.args); },
                       {"gqa_decode: plan.config.head_dim", "multiple of 16 in 16..256", "got 40"}, {}));
  GqaPlan by_hand;  // never planned
  by_hand.config = c.config;
  by_hand.config.softcap = -1.f;
  EXPECT_FALSE(by_hand.validated);
  EXPECT_TRUE(rejected([&] { gqa_decode(by_hand, c.args); },
                       {"gqa_decode: plan.config.softcap", "finite value >= 0", "got -1"}, {}));
  by_hand.config.softcap = 0.f;
  EXPECT_NO_THROW(gqa_decode(by_hand, c.args));  // a valid hand-built plan runs
}

TEST_F(GqaPlanConfig, HeadCountsPositive) {
  c.config.num_kv_heads = 0;
  EXPECT_TRUE(c.plan_rejects({"plan_gqa_decode: config.num_kv_heads", "expected > 0", "got 0"}));
  c.config.num_kv_heads = 2;
  c.config.num_q_heads = -4;
  EXPECT_TRUE(c.plan_rejects({"config.num_q_heads", "> 0", "got -4"}));
}
TEST_F(GqaPlanConfig, HeadCountsMustDivide) {
  c.config.num_q_heads = 6;
  c.config.num_kv_heads = 4;
  EXPECT_TRUE(c.plan_rejects({"config.num_q_heads", "multiple of num_kv_heads (4)", "got 6"}));
}
TEST_F(GqaPlanConfig, HeadDimUnsupported) {
  for (int d : {0, 8, 40, 100, 272}) {
    c.config.head_dim = d;
    EXPECT_TRUE(c.plan_rejects(
        {"config.head_dim", "multiple of 16 in 16..256", "got " + std::to_string(d)}));
  }
  for (int d : {16, 64, 80, 256}) {
    c.config.head_dim = d;
    EXPECT_NO_THROW(c.plan()) << d;
  }
}
TEST_F(GqaPlanConfig, PageSizeRange) {
  for (int ps : {0, (1 << 22) + 1, -1}) {
    c.config.page_size = ps;
    EXPECT_TRUE(c.plan_rejects({"config.page_size", "1..4194304", "got " + std::to_string(ps)}));
  }
  c.config.page_size = 1;
  EXPECT_NO_THROW(c.plan());
  c.config.page_size = 1 << 22;  // a contiguous cache: one page per request
  EXPECT_NO_THROW(c.plan());
}
TEST_F(GqaPlanConfig, DtypesAllowed) {
  c.config.q_dtype = DType::kFP8E4M3;
  EXPECT_TRUE(c.plan_rejects({"config.q_dtype", "bf16 | fp16", "got fp8_e4m3"}));
  c.config.q_dtype = DType::kFP16;
  c.config.kv_dtype = DType::kFP32;
  EXPECT_TRUE(c.plan_rejects({"config.kv_dtype", "bf16 | fp16 | fp8_e4m3 | int8", "got fp32"}));
  c.config.kv_dtype = DType::kINT8;
  c.config.out_dtype = DType::kINT8;
  EXPECT_TRUE(c.plan_rejects({"config.out_dtype", "bf16 | fp16 | fp8_e4m3", "got int8"}));
}
TEST_F(GqaPlanConfig, LayoutValue) {
  c.config.layout = static_cast<KvLayout>(7);
  EXPECT_TRUE(c.plan_rejects({"config.layout", "kNHD or KvLayout::kHND", "value 7"}));
}
TEST_F(GqaPlanConfig, MaximaPositive) {
  c.config.max_batch = 0;
  EXPECT_TRUE(c.plan_rejects({"config.max_batch", "> 0", "got 0"}));
  c.config.max_batch = 2;
  c.config.max_q_len = -1;
  EXPECT_TRUE(c.plan_rejects({"config.max_q_len", "> 0", "got -1"}));
  c.config.max_q_len = 1;
  c.config.max_seq_len = 0;
  EXPECT_TRUE(c.plan_rejects({"config.max_seq_len", "> 0", "got 0"}));
}
TEST_F(GqaPlanConfig, WindowAndSoftcap) {
  c.config.window = -1;
  EXPECT_TRUE(c.plan_rejects({"config.window", ">= 0", "got -1"}));
  c.config.window = 0;
  c.config.softcap = -2.f;
  EXPECT_TRUE(c.plan_rejects({"config.softcap", "finite value >= 0", "got -2"}));
  c.config.softcap = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(c.plan_rejects({"config.softcap", "finite value >= 0", "got inf"}));
}
TEST_F(GqaPlanConfig, SkipSoftmaxFactor) {
  c.build();
  c.config.skip_softmax_factor = -0.5f;
  EXPECT_TRUE(c.plan_rejects({"plan_gqa_decode: config.skip_softmax_factor", "finite value >= 0", "got -0.5"}));
  c.config.skip_softmax_factor = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(c.plan_rejects({"config.skip_softmax_factor", "finite value >= 0", "got nan"}));
  c.config.skip_softmax_factor = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(c.plan_rejects({"config.skip_softmax_factor", "finite value >= 0", "got inf"}));
  c.config.skip_softmax_factor = 2.f;  // any finite factor plans; on the CPU it names no kernel
  const GqaPlan plan = plan_gqa_decode(c.config);
  EXPECT_EQ(plan.config.skip_softmax_factor, 2.f);
  EXPECT_EQ(plan.kernel_name, "");
  GqaPlan by_hand = plan;  // a factor edited into a planned config is checked at the run
  by_hand.config.skip_softmax_factor = -1.f;
  EXPECT_TRUE(rejected([&] { gqa_decode(by_hand, c.args); },
                       {"gqa_decode: plan.config.skip_softmax_factor", "finite value >= 0", "got -1"}, {}));
}
TEST_F(GqaPlanConfig, BeamWidth) {
  c.config.beam_width = 0;
  EXPECT_TRUE(c.plan_rejects({"config.beam_width", ">= 1", "got 0"}));
  c.config.beam_width = 3;
  c.config.max_batch = 4;
  EXPECT_TRUE(c.plan_rejects({"config.max_batch", "multiple of beam_width (3)", "got 4"}));
}
TEST_F(GqaPlanConfig, SplitSettings) {
  c.config.split_mode = SplitMode::kFixed;
  c.config.split_tokens = 0;
  EXPECT_TRUE(c.plan_rejects({"config.split_tokens", "> 0 with split_mode kFixed", "got 0"}));
  c.config.split_mode = SplitMode::kAuto;
  c.config.split_tokens = 256;
  EXPECT_TRUE(c.plan_rejects({"config.split_tokens", "0 with split_mode kAuto", "got 256"}));
  c.config.split_mode = static_cast<SplitMode>(5);
  EXPECT_TRUE(c.plan_rejects({"config.split_mode", "kAuto or SplitMode::kFixed", "value 5"}));
}
TEST_F(GqaPlanConfig, DeviceMustExist) {
  c.config.device = Device::cuda(64);
  EXPECT_TRUE(c.plan_rejects({"config.device", "got cuda:64"}));
  c.config.device = Device{DeviceKind::kCPU, 3};
  EXPECT_TRUE(c.plan_rejects({"config.device", "cpu (index 0)", "index 3"}));
}

}  // namespace
}  // namespace deca::test
