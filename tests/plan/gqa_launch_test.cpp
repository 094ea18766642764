// How GQA kernels are launched (gqa_launch_options, src/cuda/gqa_spec.cpp), without a GPU: on
// sm_90 every plan's kernel (Hopper or portable, fused, checked, skip-softmax, rows on M) and the
// fused step's rotate / append kernel go with programmatic dependent launch; below sm_90 none
// does (the attribute does not exist there), and no GQA launch asks for a cluster.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/gqa_sm90_config.hpp"

namespace deca::cuda {
namespace {

struct Row {
  const char* what;
  GqaConfig config;
};

std::vector<Row> plan_rows() {
  std::vector<Row> rows;
  auto add = [&](const char* what, GqaConfig c) { rows.push_back({what, c}); };
  GqaConfig base = testing::sm90_config(64, 8, 128, 1, DType::kBF16);
  base.checked = false;
  add("bf16", base);
  GqaConfig c = base;
  c.kv_dtype = DType::kFP8E4M3;
  add("fp8", c);
  c.kv_dtype = DType::kINT8;
  add("int8", c);
  c = base;
  c.checked = true;
  add("bf16 checked", c);
  c = base;
  c.kv_dtype = DType::kFP8E4M3;
  c.skip_softmax_factor = 1.f;
  add("fp8 skip-softmax", c);
  c = base;
  c.rope_style = RopeStyle::kNeox;
  add("bf16 fused", c);
  c = base;
  c.max_q_len = 4;
  add("bf16 q_len 4 (rows on M)", c);
  c.skip_softmax_factor = 1.f;
  add("bf16 q_len 4 skip-softmax (rows on M)", c);
  c.kv_dtype = DType::kFP8E4M3, c.max_q_len = 8;
  add("fp8 q_len 8 skip-softmax (rows on M)", c);
  c = base;
  c.beam_width = 2;
  c.max_batch = 8;
  add("bf16 beams (portable)", c);
  c = base;
  c.head_dim = 80;
  add("head_dim 80 (portable)", c);
  return rows;
}

TEST(GqaLaunch, ProgrammaticDependentLaunchFromSm90On) {
  for (const Row& row : plan_rows()) {
    for (int arch : {80, 86, 89, 90}) {
      const GqaKernelKey key = make_gqa_key(row.config, arch, 132, 0, /*hopper_16bit=*/true);
      // The launch follows the arch the kernel is compiled for, so that where the attribute is
      // set, the kernel's griddepcontrol instructions are there too (compiled out below sm_90).
      ASSERT_EQ(key.arch, arch) << row.what;
      const jit::LaunchOptions o = gqa_launch_options(key.arch);
      EXPECT_EQ(o.pdl, arch >= 90) << row.what << " on sm_" << arch << " (" << key.name() << ")";
      EXPECT_EQ(o.cluster.x, 0u) << row.what << " on sm_" << arch;
      EXPECT_EQ(gqa_rope_append_spec(row.config, arch).arch, arch) << row.what;
    }
  }
}

// Newer archs keep it: the attribute and griddepcontrol are sm_90+ features, not sm_90's alone.
TEST(GqaLaunch, LaterArchsKeepIt) {
  for (int arch : {100, 120}) EXPECT_TRUE(gqa_launch_options(arch).pdl) << arch;
}

}  // namespace
}  // namespace deca::cuda
