// NVRTC compiles every MLA sparse decode kernel (scheduler, portable decode, combine, the generic
// combine op) for sm_90a and sm_80 without a GPU (this runs in CI): each cubin exports its entry
// and does not spill. Prints compile time, registers and spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "cuda/mla_spec.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::cuda {
namespace {

TEST(MlaNvrtc, EveryKernelCompilesForSm90aAndSm80WithoutSpilling) {
  const MlaKernelRole roles[] = {MlaKernelRole::kSchedule, MlaKernelRole::kDecode,
                                 MlaKernelRole::kCombine, MlaKernelRole::kGenericCombine};
  for (int arch : {90, 80}) {
    for (MlaKernelRole role : roles) {
      MlaKernelKey key;
      key.arch = arch;
      key.role = role;
      const jit::JitSpec spec = key.spec();
      const jit::CompileResult r = jit::compile(spec);
      ASSERT_FALSE(r.cubin.empty()) << spec.name;
      ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
      EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
      std::printf("[nvrtc] %-36s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
                  r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes, r.ptxas.stack_bytes);
      EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
    }
  }
}

// The warp-specialized sm90 decode kernel, once enabled (src/cuda/mla_spec.hpp), compiles for
// sm_90a and exports its entry. Register and spill figures are printed for the record; its own
// budget (setmaxnreg per warpgroup) is that kernel's business.
TEST(MlaNvrtc, Sm90DecodeCompilesWhenEnabled) {
  if (!kMlaSm90KernelEnabled) GTEST_SKIP() << "the sm90 MLA kernel is not enabled in this build";
  MlaKernelKey key;
  key.arch = 90;
  key.variant = "sm90";
  const jit::JitSpec spec = key.spec();
  const jit::CompileResult r = jit::compile(spec);
  ASSERT_FALSE(r.cubin.empty()) << spec.name;
  EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-36s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
              r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes, r.ptxas.stack_bytes);
}

TEST(MlaNvrtc, NamesAreDistinctCacheKeys) {
  MlaKernelKey a;
  MlaKernelKey b = a;
  b.arch = 80;
  MlaKernelKey c = a;
  c.role = MlaKernelRole::kCombine;
  EXPECT_EQ(a.name(), "mla_sparse_decode_portable_sm90");
  EXPECT_EQ(b.name(), "mla_sparse_decode_portable_sm80");
  EXPECT_EQ(c.name(), "mla_sparse_combine_sm90");
  EXPECT_EQ(a.spec().entry, "deca_mla_sparse_decode");
}

TEST(MlaNvrtc, PortableOnAnythingButSm90) {
  EXPECT_EQ(mla_decode_variant(80), "portable");
  EXPECT_EQ(mla_decode_variant(89), "portable");
  EXPECT_EQ(mla_decode_variant(100), "portable");
  if (!kMlaSm90KernelEnabled) EXPECT_EQ(mla_decode_variant(90), "portable");
}

}  // namespace
}  // namespace deca::cuda
