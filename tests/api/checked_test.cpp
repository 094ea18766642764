// Checked mode's host side (issue 9): the default (on in the tests, DECA_CHECKED=0|1 from the
// environment), the flag's effect on CPU plans (none: the CPU backend checks every index on the
// host), and check_gqa_run / check_mla_run's own argument errors, raised before any CUDA call.
// The GPU side (planted bad ids, the record, the error text) is tests/gpu/*_checked_gpu_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "deca/checked.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"
#include "deca/mla.hpp"
#include "jit/scoped_env.hpp"

namespace deca {
namespace {

using jit::testing::ScopedEnv;

std::string error_of(void (*f)(const void*), const void* arg) {
  try {
    f(arg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CheckedMode, OnByDefaultInTheTestsAndSetFromTheEnvironment) {
  EXPECT_TRUE(checked_by_default()) << "tests/common/checked_on.cpp sets DECA_CHECKED=1";
  EXPECT_TRUE(GqaConfig{}.checked);
  EXPECT_TRUE(MlaConfig{}.checked);
  {
    ScopedEnv off("DECA_CHECKED", "0");
    EXPECT_FALSE(checked_by_default());
    EXPECT_FALSE(GqaConfig{}.checked);
    EXPECT_FALSE(MlaConfig{}.checked);
  }
  {
    ScopedEnv on("DECA_CHECKED", "1");
    EXPECT_TRUE(GqaConfig{}.checked);
  }
  {
    // Anything else: the build's default (this test binary links a release or debug libdeca).
    ScopedEnv other("DECA_CHECKED", "yes");
#ifdef NDEBUG
    EXPECT_FALSE(checked_by_default());
#else
    EXPECT_TRUE(checked_by_default());
#endif
  }
}

GqaConfig cpu_gqa(bool checked) {
  GqaConfig c;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_seq_len = 128;
  c.checked = checked;
  return c;
}

TEST(CheckedMode, CpuPlansAreTheSameCheckedOrNot) {
  const GqaPlan a = plan_gqa_decode(cpu_gqa(true)), b = plan_gqa_decode(cpu_gqa(false));
  EXPECT_TRUE(a.config.checked);
  EXPECT_EQ(a.workspace_bytes, 0u);
  EXPECT_EQ(a.workspace_bytes, b.workspace_bytes);
  EXPECT_EQ(a.kernel_name, b.kernel_name);
  // Nothing to read on the CPU: no workspace needed.
  EXPECT_NO_THROW(check_gqa_run(a, nullptr));
  MlaConfig m;
  m.num_heads = 16, m.sparse = true, m.topk = 64, m.checked = true;
  const MlaPlan mp = plan_mla_decode(m);
  EXPECT_EQ(mp.workspace_bytes, 0u);
  EXPECT_NO_THROW(check_mla_run(mp, nullptr));
}

// A CUDA plan made by hand (no GPU needed: the errors come before any CUDA call).
GqaPlan cuda_gqa_plan(bool checked, std::size_t workspace_bytes) {
  GqaPlan p;
  p.config = cpu_gqa(checked);
  p.config.device = Device::cuda(0);
  p.workspace_bytes = workspace_bytes;
  return p;
}

TEST(CheckedMode, CheckGqaRunNamesItsArguments) {
  EXPECT_EQ(error_of([](const void*) { check_gqa_run(cuda_gqa_plan(true, 256), nullptr); }, nullptr),
            "check_gqa_run: workspace: expected the workspace the checked runs used, got nullptr");
  int dummy = 0;
  EXPECT_EQ(error_of([](const void* ws) { check_gqa_run(cuda_gqa_plan(true, 100), ws); }, &dummy),
            "check_gqa_run: plan.workspace_bytes: expected >= 256 (a checked plan keeps its "
            "record in the workspace's last bytes), got 100");
  // An unchecked plan has no record: nothing is read, whatever the workspace.
  EXPECT_EQ(error_of([](const void*) { check_gqa_run(cuda_gqa_plan(false, 0), nullptr); }, nullptr),
            "");
}

TEST(CheckedMode, CheckMlaRunNamesItsArguments) {
  static MlaPlan plan;
  plan.config.num_heads = 16, plan.config.sparse = true, plan.config.topk = 64;
  plan.config.device = Device::cuda(0);
  plan.config.checked = true;
  plan.workspace_bytes = 4096;
  EXPECT_EQ(error_of([](const void*) { check_mla_run(plan, nullptr); }, nullptr),
            "check_mla_run: workspace: expected the workspace the checked runs used, got nullptr");
  plan.workspace_bytes = 8;
  int dummy = 0;
  EXPECT_EQ(error_of([](const void* ws) { check_mla_run(plan, ws); }, &dummy),
            "check_mla_run: plan.workspace_bytes: expected >= 256 (a checked plan keeps its "
            "record in the workspace's last bytes), got 8");
  plan.config.checked = false;
  EXPECT_EQ(error_of([](const void*) { check_mla_run(plan, nullptr); }, nullptr), "");
  plan.config.checked = true;
  plan.config.sparse = false;  // a checked dense CUDA plan keeps a record too
  plan.config.topk = 0;
  plan.workspace_bytes = 4096;
  EXPECT_EQ(error_of([](const void*) { check_mla_run(plan, nullptr); }, nullptr),
            "check_mla_run: workspace: expected the workspace the checked runs used, got nullptr");
  plan.config.device = Device::cpu();  // the CPU backend checks on the host: no record
  EXPECT_EQ(error_of([](const void*) { check_mla_run(plan, nullptr); }, nullptr), "");
}

}  // namespace
}  // namespace deca
