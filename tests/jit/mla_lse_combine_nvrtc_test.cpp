// NVRTC compiles the MLA combine variants and the portable decode kernels of plans that write
// FlashMLA's LSE for empty rows (MlaConfig::lse_of_empty_row), for sm_90a and sm_80 without a
// GPU: no spills, the entry exported; and the keys keep every default kernel's name and source
// (so its cache entry and machine code) as they were.
#include <gtest/gtest.h>

#include <string>

#include "cuda/mla_spec.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "jit/compile_check.hpp"
#include "jit/scoped_env.hpp"

namespace deca::cuda {
namespace {

MlaKernelKey combine_key(int arch, bool split, bool model1, bool pos_inf) {
  MlaKernelKey k;
  k.arch = arch;
  k.role = MlaKernelRole::kCombine;
  k.combine_split = split;
  if (model1) k.kv_format = kMlaKvModel1;
  k.lse_pos_inf = pos_inf;
  return k;
}

TEST(MlaCombineNvrtc, EveryCombineVariantCompilesWithoutSpilling) {
  for (int arch : {90, 80}) {
    for (bool split : {false, true}) {
      for (bool model1 : {false, true}) {
        for (bool pos_inf : {false, true}) {
          const jit::JitSpec spec = combine_key(arch, split, model1, pos_inf).spec();
          jit::testing::expect_no_spills(jit::testing::compile_and_check(spec), spec.name, false);
        }
      }
    }
  }
}

TEST(MlaCombineNvrtc, NamesAndSources) {
  const MlaKernelKey plain = combine_key(90, false, false, false);
  EXPECT_EQ(plain.name(), "mla_sparse_combine_sm90");
  EXPECT_EQ(plain.spec().source,
            "// mla_sparse_combine_sm90\n#include \"kernels/mla/combine/entry.cuh\"\n");
  EXPECT_EQ(combine_key(90, true, false, false).name(), "mla_sparse_combine_split_sm90");
  EXPECT_EQ(combine_key(90, true, true, true).name(), "mla_sparse_combine_model1_split_lsepinf_sm90");
  const jit::JitSpec split = combine_key(80, true, false, true).spec();
  EXPECT_NE(split.source.find("kernels/mla/combine/entry_split.cuh"), std::string::npos);
  EXPECT_NE(split.source.find("#define DECA_MLA_LSE_EMPTY_POS_INF 1\n#include"), std::string::npos);
  EXPECT_NE(combine_key(90, true, true, false).spec().source.find("entry_model1_split.cuh"),
            std::string::npos);
  // The scheduler and the generic combine op write no final LSE: the flag never reaches them.
  MlaKernelKey sched = combine_key(90, false, false, true);
  sched.role = MlaKernelRole::kSchedule;
  EXPECT_EQ(sched.name(), "mla_sparse_schedule_sm90");
  EXPECT_EQ(sched.spec().source.find("DECA_MLA_LSE"), std::string::npos);
}

// The portable decode kernels a +inf plan runs (sparse, checked sparse, dense bf16, MODEL1), on
// both architectures.
TEST(MlaCombineNvrtc, PortableLsePosInfKernelsCompileWithoutSpilling) {
  struct Plan {
    bool sparse;
    MlaCacheFormat format;
    bool checked;
  };
  for (int arch : {90, 80}) {
    for (const Plan pl : {Plan{true, MlaCacheFormat::kDefault, false},
                          Plan{true, MlaCacheFormat::kDefault, true},
                          Plan{false, MlaCacheFormat::kBF16, false},
                          Plan{true, MlaCacheFormat::kModel1, false}}) {
      MlaConfig c;
      c.num_heads = 64;
      c.sparse = pl.sparse;
      c.kv_format = pl.format;
      c.topk = pl.sparse ? 2048 : 0;
      c.max_seq_len = 4096;
      c.checked = pl.checked;
      c.lse_of_empty_row = MlaLseOfEmptyRow::kPosInf;
      const MlaKernelKey k = mla_decode_key(arch, "portable", c);
      EXPECT_TRUE(k.lse_pos_inf);
      const jit::JitSpec spec = k.spec();
      EXPECT_NE(spec.name.find("_lsepinf_sm"), std::string::npos) << spec.name;
      jit::testing::expect_no_spills(jit::testing::compile_and_check(spec), spec.name);
    }
  }
}

// A default plan's keys carry neither the combine choice nor the LSE convention: names and
// sources are the ones the kernel caches and the verified machine code were made from.
TEST(MlaCombineNvrtc, DefaultKeysUnchanged) {
  jit::testing::ScopedEnv unset("DECA_MLA_COMBINE", nullptr);
  EXPECT_FALSE(mla_combine_split());
  MlaConfig c;
  c.num_heads = 128;
  c.sparse = true;
  c.topk = 2048;
  c.checked = false;
  for (const std::string variant : {"portable", "sm90"}) {
    const MlaKernelKey k = mla_decode_key(90, variant, c);
    EXPECT_FALSE(k.lse_pos_inf);
    EXPECT_EQ(k.name().find("lsepinf"), std::string::npos);
    EXPECT_EQ(k.spec().source.find("DECA_MLA_LSE"), std::string::npos);
  }
  jit::testing::ScopedEnv split("DECA_MLA_COMBINE", "split");
  EXPECT_TRUE(mla_combine_split());
  jit::testing::ScopedEnv bad("DECA_MLA_COMBINE", "spread");
  EXPECT_THROW(mla_combine_split(), Error);
}

}  // namespace
}  // namespace deca::cuda
