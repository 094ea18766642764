// precompile_gqa_decode: the config is validated as a plan's is, the compute capability must be
// one NVRTC targets (>= 8.0), and without one the config must name a present CUDA device. These
// are rejected before NVRTC runs; tests/jit/ checks what a successful call leaves in the cache.
#include <gtest/gtest.h>

#include "api/api_fixtures.hpp"
#include "jit/scoped_env.hpp"

namespace deca::test {
namespace {

::testing::AssertionResult precompile_rejects(const GqaConfig& config, int cc,
                                              std::initializer_list<std::string> needles) {
  return rejected([&] { precompile_gqa_decode(config, cc); }, needles, {});
}

// The small valid config of the API tests (CPU device).
GqaConfig valid_config() { return GqaCase{}.config; }

TEST(GqaPrecompile, ConfigFieldsAreValidated) {
  GqaConfig c = valid_config();
  c.num_q_heads = 6;
  c.num_kv_heads = 4;
  EXPECT_TRUE(precompile_rejects(c, 90,
                                 {"precompile_gqa_decode: config.num_q_heads",
                                  "multiple of num_kv_heads (4)", "got 6"}));
  c = valid_config();
  c.head_dim = 40;
  EXPECT_TRUE(precompile_rejects(c, 90, {"config.head_dim", "got 40"}));
  c = valid_config();
  c.kv_dtype = DType::kFP32;
  EXPECT_TRUE(precompile_rejects(c, 80, {"config.kv_dtype", "fp8_e4m3", "got fp32"}));
}

// Below Ampere or unknown; none with a CPU config (nothing to compile for) or a missing device.
TEST(GqaPrecompile, CapabilityIsChecked) {
  expect_precompile_capability_checks("precompile_gqa_decode", [](int cc, Device device) {
    GqaConfig c = valid_config();
    c.device = device;
    precompile_gqa_decode(c, cc);
  });
}

// A CUDA device index that cannot exist: with an explicit capability the call does not look at
// it, and still validates the config.
TEST(GqaPrecompile, WithCapabilityTheDeviceIsNotUsed) {
  GqaConfig c = valid_config();
  c.device = Device::cuda(4096);
  c.num_q_heads = 5;
  c.num_kv_heads = 2;
  EXPECT_TRUE(precompile_rejects(c, 90, {"config.num_q_heads", "got 5"}));
}

// The environment variables that chose retired kernel variants (src/cuda/tuning.cpp) are refused
// before anything is compiled, naming the variable and what replaced it (plan_gqa_decode refuses
// them too: tests/api/gqa_cuda_args_test.cpp, on a GPU).
TEST(GqaPrecompile, RetiredTuningVariablesAreRefused) {
  const struct {
    const char* var;
    const char* value;
    const char* instead;
  } rows[] = {{"DECA_GQA_SM90_BALANCED", "1", "DECA_GQA_SPLITS"},
              {"DECA_GQA_SM90_WG", "2", "one warpgroup"},
              {"DECA_GQA_SM90_OVERLAP", "1", "after the previous tile's PV"},
              {"DECA_GQA_SM90_ROWS_M", "0", "rows-on-M"},
              {"DECA_GQA_SM90_STAGES", "2", "from its grid"},
              {"DECA_GQA_FP8_MMA", "widen", "per arch"},
              {"DECA_GQA_CTAS", "3", "2 CTAs per SM"},
              {"DECA_GQA_FIXEDCOST_VARIANT", "1", "lost to the streaming merge"}};
  for (const auto& r : rows) {
    jit::testing::ScopedEnv env(r.var, r.value);
    EXPECT_TRUE(precompile_rejects(valid_config(), 90,
                                   {std::string("precompile_gqa_decode: environment ") + r.var,
                                    "expected unset", r.instead,
                                    std::string("got \"") + r.value + "\""}))
        << r.var;
  }
}

}  // namespace
}  // namespace deca::test
