// precompile_mla_decode without a GPU: for an explicit compute capability it returns the decode
// kernel's name a plan gets on such a device and leaves the scheduler's, the decode kernel's and
// both combines' cubins in the on-disk cache (what a server's plan_mla_decode then loads instead
// of running NVRTC).
#include <gtest/gtest.h>

#include <string>

#include "cuda/mla_spec.hpp"
#include "deca/mla.hpp"
#include "jit/precompile_check.hpp"

namespace deca::cuda {
namespace {

MlaConfig sparse(int heads) {
  MlaConfig c;
  c.num_heads = heads;
  c.sparse = true;
  c.topk = 2048;
  c.max_batch = 64;
  c.checked = false;
  c.device = Device::cuda(0);  // not consulted: the capability is given
  return c;
}

TEST(MlaPrecompile, LeavesTheRunsKernelsInTheDiskCache) {
  const std::filesystem::path dir = jit::testing::cache_dir_to_check();
  for (int cc : {90, 80}) {
    const MlaConfig config = sparse(16);
    const std::string name =
        jit::testing::timed_precompile([&] { return precompile_mla_decode(config, cc); });
    const MlaKernelKey decode = mla_decode_key(cc, mla_plan_variant(cc, config), config);
    EXPECT_EQ(name, decode.name());
    EXPECT_EQ(name.rfind(cc == 90 ? "mla_sparse_decode_sm90_" : "mla_sparse_decode_portable_", 0), 0u) << name;
    if (dir.empty()) continue;
    for (MlaKernelRole role : {MlaKernelRole::kSchedule, MlaKernelRole::kDecode, MlaKernelRole::kCombine}) {
      MlaKernelKey k = decode;
      if (role != MlaKernelRole::kDecode) {
        k = MlaKernelKey{};
        k.arch = cc;
        k.role = role;
      }
      jit::testing::expect_cached(dir, k.spec());
      // Both combines: which one a plan takes depends on the device's SM count.
      if (role == MlaKernelRole::kCombine) {
        k.combine_split = true;
        jit::testing::expect_cached(dir, k.spec());
      }
    }
  }
}

}  // namespace
}  // namespace deca::cuda
