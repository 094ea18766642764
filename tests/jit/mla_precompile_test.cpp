// precompile_mla_decode without a GPU: for an explicit compute capability it returns the decode
// kernel's name a plan gets on such a device and leaves the scheduler's, the decode kernel's and
// the combine's cubins in the on-disk cache (what a server's plan_mla_decode then loads instead
// of running NVRTC).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "cuda/mla_spec.hpp"
#include "deca/mla.hpp"
#include "jit/cache_key.hpp"
#include "jit/disk_cache.hpp"
#include "jit/elf_symbols.hpp"

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
  const std::filesystem::path dir = jit::DiskCache::default_dir();
  for (int cc : {90, 80}) {
    const MlaConfig config = sparse(16);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string name = precompile_mla_decode(config, cc);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const MlaKernelKey decode = mla_decode_key(cc, mla_plan_variant(cc, config), config);
    EXPECT_EQ(name, decode.name());
    EXPECT_EQ(name.rfind(cc == 90 ? "mla_sparse_decode_sm90_" : "mla_sparse_decode_portable_", 0), 0u) << name;
    std::printf("[precompile] %s: %.0f ms\n", name.c_str(), ms);
    if (dir.empty()) {
      std::printf("[precompile] no cache directory (DECA_CACHE_DIR, XDG_CACHE_HOME, HOME unset): "
                  "the disk entries are not checked\n");
      continue;
    }
    jit::DiskCache disk(dir);
    for (MlaKernelRole role : {MlaKernelRole::kSchedule, MlaKernelRole::kDecode, MlaKernelRole::kCombine}) {
      MlaKernelKey k = decode;
      if (role != MlaKernelRole::kDecode) {
        k = MlaKernelKey{};
        k.arch = cc;
        k.role = role;
      }
      const jit::JitSpec spec = k.spec();
      jit::DiskEntry entry;
      ASSERT_EQ(disk.read(jit::cache_key(spec).str(), &entry), jit::DiskRead::hit) << spec.name;
      EXPECT_TRUE(jit::testing::elf_has_symbol(entry.cubin, spec.entry)) << spec.name;
    }
  }
}

}  // namespace
}  // namespace deca::cuda
