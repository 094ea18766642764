// NVRTC compiles every portable MLA MODEL1 kernel (kMlaKvModel1, two caches: the scheduler, the
// decode kernel plain and checked, the combine) for sm_90a and sm_80 without a GPU: each cubin
// exports its entry and does not spill (the sm90 ones: tests/jit/mla_sm90_nvrtc_test.cpp). The
// plan's keys name the format, so a MODEL1 plan never finds a V3.2 kernel in the cache. Prints
// compile time, registers and spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cuda/mla_spec.hpp"
#include "deca/mla.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::cuda {
namespace {

MlaConfig model1_config(int heads, int page, int extra_page, bool checked) {
  MlaConfig c;
  c.num_heads = heads;
  c.sparse = true;
  c.kv_format = MlaCacheFormat::kModel1;
  c.topk = 128;
  c.page_size = page;
  c.extra_topk = 1024;
  c.extra_page_size = extra_page;
  c.checked = checked;
  return c;
}

void expect_compiles_without_spills(const jit::JitSpec& spec) {
  const jit::CompileResult r = jit::compile(spec);
  ASSERT_FALSE(r.cubin.empty()) << spec.name;
  ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
  EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-44s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
              r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes, r.ptxas.stack_bytes);
  EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
  EXPECT_EQ(r.ptxas.stack_bytes, 0) << spec.name;
}

TEST(MlaModel1Nvrtc, PortableKernelsCompileForSm90aAndSm80WithoutSpilling) {
  for (int arch : {90, 80}) {
    for (bool checked : {false, true}) {
      const MlaKernelKey dk = mla_decode_key(arch, "portable", model1_config(64, 64, 64, checked));
      EXPECT_EQ(dk.name(), std::string("mla_sparse_decode_portable_model1") + (checked ? "_chk" : "") +
                               "_sm" + std::to_string(arch));
      expect_compiles_without_spills(dk.spec());
    }
    for (MlaKernelRole role : {MlaKernelRole::kSchedule, MlaKernelRole::kCombine}) {
      MlaKernelKey k;
      k.arch = arch;
      k.role = role;
      k.kv_format = kMlaKvModel1;
      expect_compiles_without_spills(k.spec());
    }
  }
}

TEST(MlaModel1Nvrtc, KeysNameTheFormat) {
  MlaKernelKey schedule;
  schedule.role = MlaKernelRole::kSchedule;
  schedule.kv_format = kMlaKvModel1;
  EXPECT_EQ(schedule.name(), "mla_sparse_schedule_model1_sm90");
  EXPECT_NE(schedule.spec().source.find("schedule/entry_model1.cuh"), std::string::npos);
  MlaKernelKey combine;
  combine.role = MlaKernelRole::kCombine;
  combine.kv_format = kMlaKvModel1;
  EXPECT_EQ(combine.name(), "mla_sparse_combine_model1_sm90");
  EXPECT_NE(combine.spec().source.find("combine/entry_model1.cuh"), std::string::npos);
  // The V3.2 names and sources are what they were.
  MlaKernelKey v32;
  v32.role = MlaKernelRole::kSchedule;
  EXPECT_EQ(v32.name(), "mla_sparse_schedule_sm90");
  EXPECT_NE(v32.spec().source.find("schedule/entry.cuh"), std::string::npos);
  const MlaKernelKey dk = mla_decode_key(90, "portable", model1_config(8, 2, 256, false));
  EXPECT_EQ(dk.spec().entry, "deca_mla_sparse_decode");
  EXPECT_NE(dk.spec().source.find("kChecked = false"), std::string::npos);
}

// Every plan below sm_90 runs the portable kernel; on sm_90 MODEL1 plans, checked or not, run
// the direct kernel up to 16 heads and the wide kernel above (no cluster up to 64 heads, a
// cluster of 2 above), the extra cache's page size compiled in beside the first's.
TEST(MlaModel1Nvrtc, PlanVariantAndKernelClass) {
  ASSERT_TRUE(mla_model1_sm90_supported());
  for (int heads = 1; heads <= 128; ++heads) {
    SCOPED_TRACE(heads);
    EXPECT_EQ(mla_plan_variant(90, model1_config(heads, 64, 64, true)), mla_decode_variant(90));
    EXPECT_EQ(mla_plan_variant(80, model1_config(heads, 64, 64, true)), "portable");
    EXPECT_EQ(mla_plan_variant(80, model1_config(heads, 64, 64, false)), "portable");
    ASSERT_EQ(mla_plan_variant(90, model1_config(heads, 64, 64, false)), "sm90");
    const MlaKernelKey k = mla_decode_key(90, "sm90", model1_config(heads, 256, 2, false));
    const MlaDecodeShape shape = mla_decode_shape(k);
    const bool direct = heads <= 16;
    EXPECT_EQ(shape.threads, direct ? 384 : 512);
    EXPECT_EQ(k.name(), std::string("mla_sparse_decode_sm90_model1_p256x2") +
                            (direct ? "_direct" : heads > 64 ? "_c2" : "") + "_sm90");
    EXPECT_EQ(shape.cluster_x, heads > 64 ? 2 : 1);
    const std::string src = k.spec().source;
    EXPECT_NE(src.find(direct ? "kDirect = 1;" : "kDirect = 0;"), std::string::npos);
    EXPECT_NE(src.find("kPageSize = 256;"), std::string::npos);
    EXPECT_NE(src.find("kKvFormat = 3;"), std::string::npos);
    EXPECT_NE(src.find("kExtraPageSize = 2;"), std::string::npos);
  }
}

// Without a second cache (extra_topk 0) the config's extra_page_size is not validated (0 or
// negative passes); the sm90 key must not compile it in as the divisor of the extra cache's ids,
// and plans that differ only there share one kernel.
TEST(MlaModel1Nvrtc, UnusedExtraPageSizeIsNotCompiledIn) {
  for (int unused : {0, -3, 2, 64}) {
    SCOPED_TRACE(unused);
    MlaConfig c = model1_config(64, 64, unused, false);
    c.extra_topk = 0;
    const MlaKernelKey k = mla_decode_key(90, "sm90", c);
    EXPECT_EQ(k.extra_page_size, MlaConfig{}.extra_page_size);
    EXPECT_EQ(k.name(), "mla_sparse_decode_sm90_model1_p64x64_sm90");
    EXPECT_NE(k.spec().source.find("kExtraPageSize = 64;"), std::string::npos);
  }
  // With a second cache its page size is the kernel's.
  EXPECT_EQ(mla_decode_key(90, "sm90", model1_config(64, 64, 2, false)).extra_page_size, 2);
}

}  // namespace
}  // namespace deca::cuda
