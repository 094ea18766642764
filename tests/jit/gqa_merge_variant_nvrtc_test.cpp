// The split merge from shared memory (DECA_GQA_FIXEDCOST_VARIANT=1, GqaKernelKey::merge_variant,
// kernels/gqa/epilogue.cuh merge_from_shared) without a GPU: the override reaches the kernel's
// name and source only when set (the default kernels' source, cache key and code stay as they
// were), and NVRTC compiles it for sm_90a without spills in every kernel family that ends in the
// shared epilogue, within the registers of the CTAs per SM their shared memory is sized for: the
// fp8 and 16-bit Hopper kernels (rows on N and on M, checked, head_dim 64 and 256, two stages) and
// the portable kernel (16-bit, int8).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"
#include "jit/compile_check.hpp"
#include "jit/gqa_sm90_config.hpp"
#include "jit/scoped_env.hpp"

namespace deca::cuda {
namespace {

constexpr auto config = &testing::sm90_config;

TEST(GqaSm90NvrtcMerge, OverrideNamesTheKernelOnlyWhenSet) {
  GqaConfig c = config(64, 8, 128, 1, DType::kBF16);
  c.device = Device::cuda(0);  // not consulted: the capability is given
  const std::string plain = make_gqa_key(c, 90, 132, 0, true).name();
  {
    const jit::testing::ScopedEnv env("DECA_GQA_FIXEDCOST_VARIANT", nullptr);
    EXPECT_EQ(precompile_gqa_decode(c, 90), plain);
  }
  {
    const jit::testing::ScopedEnv env("DECA_GQA_FIXEDCOST_VARIANT", "0");
    EXPECT_EQ(precompile_gqa_decode(c, 90), plain);
  }
  {
    const jit::testing::ScopedEnv env("DECA_GQA_FIXEDCOST_VARIANT", "1");
    EXPECT_EQ(precompile_gqa_decode(c, 90), plain + "_pm");
  }
  {
    const jit::testing::ScopedEnv env("DECA_GQA_FIXEDCOST_VARIANT", "2");
    EXPECT_THROW(precompile_gqa_decode(c, 90), Error);
  }
  GqaKernelKey k = make_gqa_key(c, 90);
  EXPECT_EQ(k.spec().source.find("kMergeVariant"), std::string::npos);
  k.merge_variant = 1;
  EXPECT_NE(k.spec().source.find("static constexpr int kMergeVariant = 1;"), std::string::npos);
}

TEST(GqaSm90NvrtcMerge, SpecializationsCompileWithoutSpills) {
  std::vector<GqaKernelKey> keys;
  auto add = [&](GqaConfig c, bool hopper_16bit) {
    c.device = Device::cuda(0);
    GqaKernelKey k = make_gqa_key(c, 90, 132, 0, hopper_16bit);
    k.merge_variant = 1;
    keys.push_back(k);
  };
  add(config(64, 8, 128, 1, DType::kBF16), true);      // l70 bf16: the A/B rows' kernel
  add(config(64, 8, 128, 1, DType::kFP8E4M3), true);   // l70 fp8
  GqaConfig rows64 = config(64, 8, 128, 8, DType::kFP8E4M3);  // rows on M, checked, tree
  rows64.checked = true, rows64.tree_mask = true;
  add(rows64, true);
  GqaConfig wide = config(16, 8, 256, 1, DType::kBF16);  // head_dim 256, two stages
  wide.max_batch = 64;
  add(wide, true);
  GqaConfig narrow = config(64, 8, 64, 1, DType::kBF16);  // head_dim 64, window
  narrow.window = 128;
  add(narrow, true);
  GqaConfig st2 = config(64, 8, 128, 1, DType::kBF16);  // l70-b99-4k: two stages, three CTAs per SM
  st2.max_batch = 99, st2.page_size = 32;
  add(st2, true);
  add(config(64, 8, 128, 1, DType::kBF16), false);   // the portable kernel, 16-bit
  add(config(64, 8, 128, 2, DType::kINT8), true);    // the portable kernel, int8 (two_term_qk)
  for (const GqaKernelKey& k : keys) {
    EXPECT_NE(k.name().find("_pm"), std::string::npos) << k.name();
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::testing::compile_and_check(spec);
    jit::testing::expect_no_spills(r, spec.name);
    EXPECT_LE(r.ptxas.registers * k.shape().threads * k.shape().min_ctas, 65536) << spec.name;
  }
}

}  // namespace
}  // namespace deca::cuda
