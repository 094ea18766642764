// The e4m3 wgmma tile probe (kernels/gqa/sm90/fp8_tile.cuh, docs/design-gqa-sm90.md) compiles for
// sm_90a without a GPU (this runs in CI): its 32 wgmma (QGMMA 64x8x32 e4m3) are not serialized,
// nothing spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "jit/elf_symbols.hpp"
#include "jit/gqa_sm90_tile_spec.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::test {
namespace {

TEST(GqaSm90TileNvrtc, Fp8TileProbeCompilesWithoutSpillsOrSerializedWgmma) {
  const jit::JitSpec spec = gqa_sm90_fp8_tile_spec();
  const jit::CompileResult r = jit::compile(spec);
  ASSERT_FALSE(r.cubin.empty()) << spec.name << ":\n" << r.log;
  ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log:\n" << r.log;
  EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-32s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
              r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes, r.ptxas.stack_bytes);
  EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
  EXPECT_EQ(r.ptxas.stack_bytes, 0) << spec.name;
  EXPECT_LE(r.ptxas.registers, 128) << spec.name;  // 128 threads, room for several CTAs
  // ptxas says so when it serializes wgmma (C7510 .. C7520 family: "wgmma ... serialized").
  EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
}

}  // namespace
}  // namespace deca::test
