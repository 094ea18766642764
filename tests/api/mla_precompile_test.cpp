// precompile_mla_decode: the config is validated as a plan's is (dense and sparse), the compute
// capability must be one NVRTC targets (>= 8.0), and without one the config must name a present
// CUDA device. These are rejected before NVRTC runs; tests/jit/ checks what a
// successful call leaves in the cache.
#include <gtest/gtest.h>

#include "api/api_fixtures.hpp"
#include "deca/mla.hpp"

namespace deca::test {
namespace {

::testing::AssertionResult precompile_rejects(const MlaConfig& config, int cc,
                                              std::initializer_list<std::string> needles) {
  return rejected([&] { precompile_mla_decode(config, cc); }, needles, {});
}

MlaConfig sparse_config() {
  return MlaConfig{.num_heads = 16, .sparse = true, .max_batch = 4, .topk = 128};
}

TEST(MlaPrecompile, ConfigFieldsAreValidated) {
  MlaConfig c = sparse_config();
  c.page_size = 0;
  EXPECT_TRUE(precompile_rejects(c, 90, {"precompile_mla_decode: config.page_size", "got 0"}));
  c = sparse_config();
  c.topk = 0;
  EXPECT_TRUE(precompile_rejects(c, 90, {"precompile_mla_decode: config.topk", "got 0"}));
}

TEST(MlaPrecompile, DenseConfigsAreValidatedToo) {
  MlaConfig c = sparse_config();
  c.sparse = false;
  c.topk = 0;
  c.max_seq_len = 0;
  EXPECT_TRUE(precompile_rejects(c, 90, {"precompile_mla_decode: config.max_seq_len", "got 0"}));
  c.max_seq_len = 4096;
  c.topk = 64;
  EXPECT_TRUE(precompile_rejects(c, 90, {"precompile_mla_decode: config.topk", "got 64"}));
}

// Below Ampere or unknown; none with a CPU config (nothing to compile for) or a missing device.
TEST(MlaPrecompile, CapabilityIsChecked) {
  expect_precompile_capability_checks("precompile_mla_decode", [](int cc, Device device) {
    MlaConfig c = sparse_config();
    c.device = device;
    precompile_mla_decode(c, cc);
  });
}

// A CUDA device index that cannot exist: with an explicit capability the call does not look at
// it, and still validates the config.
TEST(MlaPrecompile, WithCapabilityTheDeviceIsNotUsed) {
  MlaConfig c = sparse_config();
  c.device = Device::cuda(4096);
  c.num_heads = 0;
  EXPECT_TRUE(precompile_rejects(c, 90, {"config.num_heads", "got 0"}));
}

}  // namespace
}  // namespace deca::test
