// The CUDA side of gqa_decode's validation. Checks fail before any launch, so host buffers with
// CUDA device tags suffice: nothing is read from or written to them. Tests that need a real
// plan on a GPU skip themselves where none is present.
#include <gtest/gtest.h>

#include "api/api_fixtures.hpp"
#include "cuda/backend.hpp"
#include "jit/scoped_env.hpp"

namespace deca::test {
namespace {

void tag_all(GqaDecodeArgs& a, Device d) {
  for (TensorView* t : {&a.q, &a.k_cache, &a.v_cache, &a.page_table, &a.seq_lens, &a.out, &a.lse,
                        &a.tree_mask, &a.sinks, &a.k_scales, &a.v_scales}) {
    if (t->defined()) t->device = d;
  }
}

TEST(GqaCudaArgs, PlanForAMissingDeviceIsRejectedAtRun) {
  GqaCase c;
  c.build();
  GqaPlan plan;
  plan.config = c.config;
  plan.config.device = Device::cuda(64);
  tag_all(c.args, plan.config.device);
  const GqaDecodeArgs a = c.args;
  EXPECT_TRUE(rejected([&] { gqa_decode(plan, a); },
                       {"gqa_decode: plan.config.device", "got cuda:64"}, {&c.out, &c.lse}));
}

class GqaCudaPlanned : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: CUDA-plan checks skipped";
    c.config.device = Device::cuda(0);
    c.config.max_seq_len = 4096;
    c.config.head_dim = 64;
    c.config.page_size = 16;
    // Fixed splits of a long promised length: the plan needs a workspace.
    c.config.split_mode = SplitMode::kFixed;
    c.config.split_tokens = 64;
    c.build();
    tag_all(c.args, c.config.device);
    plan = c.plan();
    ASSERT_GT(plan.workspace_bytes, 0u);
  }
  ::testing::AssertionResult run_rejects(std::initializer_list<std::string> needles) {
    const GqaDecodeArgs a = c.args;
    const GqaPlan p = plan;
    return rejected([&] { gqa_decode(p, a); }, needles, {&c.out, &c.lse});
  }
  GqaCase c;
  GqaPlan plan;
};

TEST_F(GqaCudaPlanned, WorkspaceMissing) {
  EXPECT_TRUE(run_rejects({"workspace", "plan.workspace_bytes", "got nullptr"}));
}
TEST_F(GqaCudaPlanned, WorkspaceTooSmall) {
  c.args.workspace = c.out.raw();
  c.args.workspace_bytes = plan.workspace_bytes - 1;
  EXPECT_TRUE(run_rejects({"workspace_bytes", ">= " + std::to_string(plan.workspace_bytes),
                           "got " + std::to_string(plan.workspace_bytes - 1)}));
}
TEST_F(GqaCudaPlanned, TensorOnAnotherCudaDevice) {
  c.args.v_cache.device = Device::cuda(1);
  EXPECT_TRUE(run_rejects({"v_cache", "device cuda:0", "got cuda:1"}));
}
TEST_F(GqaCudaPlanned, HostTensorForCudaPlan) {
  c.args.seq_lens.device = Device::cpu();
  EXPECT_TRUE(run_rejects({"seq_lens", "device cuda:0", "got cpu"}));
}

// A fused plan's workspace is written while k_new, v_new, cos_sin_cache and positions are read:
// one that shares their bytes is refused like one that shares q's. The workspace and k_new are
// views of one buffer, so the workspace's span overlaps k_new and no other argument.
class GqaCudaFusedPlanned : public GqaCudaPlanned {
 protected:
  void SetUp() override {
    c.config.rope_style = RopeStyle::kNeox;
    GqaCudaPlanned::SetUp();
  }
};
TEST_F(GqaCudaFusedPlanned, WorkspaceMayNotOverlapAFusedInput) {
  const Device dev = c.config.device;
  const int hk = c.config.num_kv_heads, d = c.config.head_dim;
  const std::int64_t new_elems = static_cast<std::int64_t>(c.batch) * c.q_len * hk * d;
  HostTensor shared(DType::kBF16, {static_cast<std::int64_t>(plan.workspace_bytes / 2) + new_elems});
  HostTensor v_new(DType::kBF16, {c.batch, c.q_len, hk, d});
  HostTensor cos_sin(DType::kFP32, {64, d});
  c.args.k_new = view_as(shared, {c.batch, c.q_len, hk, d}, {c.q_len * hk * d, hk * d, d, 1});
  c.args.v_new = v_new.view();
  c.args.cos_sin_cache = cos_sin.view();
  for (TensorView* t : {&c.args.k_new, &c.args.v_new, &c.args.cos_sin_cache}) t->device = dev;
  c.args.workspace = shared.raw();
  c.args.workspace_bytes = plan.workspace_bytes;
  EXPECT_TRUE(run_rejects({"gqa_decode: workspace", "k_new"}));
}

// The environment variables that chose retired GQA kernel variants (src/cuda/tuning.cpp) are
// refused when a plan is made, naming the variable and what replaced it: a stale setting must not
// change nothing silently.
TEST(GqaCudaArgs, RetiredTuningVariablesAreRefusedAtPlanTime) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: plan-time check skipped";
  GqaCase c;
  c.config.device = Device::cuda(0);
  c.config.max_seq_len = 4096;
  for (const char* var : {"DECA_GQA_SM90_BALANCED", "DECA_GQA_SM90_WG", "DECA_GQA_SM90_OVERLAP",
                          "DECA_GQA_SM90_ROWS_M", "DECA_GQA_SM90_STAGES", "DECA_GQA_FP8_MMA",
                          "DECA_GQA_CTAS", "DECA_GQA_FIXEDCOST_VARIANT"}) {
    jit::testing::ScopedEnv env(var, "1");
    EXPECT_TRUE(rejected([&] { plan_gqa_decode(c.config); },
                         {std::string("plan_gqa_decode: environment ") + var, "expected unset",
                          "retired", "got \"1\""},
                         {}))
        << var;
  }
}

}  // namespace
}  // namespace deca::test
