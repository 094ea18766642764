// precompile_gqa_decode without a GPU: for an explicit compute capability it returns the name a
// plan gets on such a device and leaves that exact specialization's cubin in the on-disk cache
// (the entry a server's plan_gqa_decode then loads instead of running NVRTC).
#include <gtest/gtest.h>

#include <string>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/precompile_check.hpp"

namespace deca::cuda {
namespace {

GqaConfig l70_fp8() {
  GqaConfig c;
  c.num_q_heads = 64, c.num_kv_heads = 8, c.head_dim = 128, c.page_size = 64;
  c.kv_dtype = DType::kFP8E4M3;
  c.max_batch = 128, c.max_seq_len = 4096;
  c.device = Device::cuda(0);  // not consulted: the capability is given
  return c;
}

TEST(GqaPrecompile, LeavesTheSpecializationInTheDiskCache) {
  const std::filesystem::path dir = jit::testing::cache_dir_to_check();
  for (int cc : {90, 80}) {
    const GqaConfig config = l70_fp8();
    const std::string name =
        jit::testing::timed_precompile([&] { return precompile_gqa_decode(config, cc); });
    const jit::JitSpec spec = make_gqa_key(config, cc).spec();
    EXPECT_EQ(name, spec.name);
    EXPECT_EQ(name.rfind("gqa_sm" + std::to_string(cc) + "_d128_g8_", 0), 0u) << name;
    if (dir.empty()) continue;
    const jit::DiskEntry entry = jit::testing::expect_cached(dir, spec);
    EXPECT_NE(entry.log.find("ptxas"), std::string::npos) << "the NVRTC log (ptxas -v) is kept";
  }
}

}  // namespace
}  // namespace deca::cuda
