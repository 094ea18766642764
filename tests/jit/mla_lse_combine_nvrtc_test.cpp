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
}

// The plan's combine (mla_combine_split): the split one for a few long requests, by the config's
// maxima (dense max_seq_len, sparse topk + MODEL1's extra_topk) and the partition count; the rule
// itself is table-tested in tests/plan/mla_combine_test.cpp. DECA_MLA_COMBINE is retired.
TEST(MlaCombineNvrtc, PlanChoosesTheCombineFromItsMaxima) {
  MlaConfig dense;
  dense.num_heads = 16;
  dense.max_batch = 4;
  dense.max_seq_len = 16384;
  EXPECT_EQ(mla_plan_blocks(dense), 256);
  EXPECT_TRUE(mla_combine_split(dense, 132));   // 32 pieces a request
  EXPECT_FALSE(mla_combine_split(dense, 33));   // 8
  dense.max_batch = 64;
  EXPECT_FALSE(mla_combine_split(dense, 132));  // 2
  dense.max_batch = 1;
  dense.max_seq_len = 32769;
  EXPECT_EQ(mla_plan_blocks(dense), 513);
  EXPECT_TRUE(mla_combine_split(dense, 66));
  MlaConfig sparse;
  sparse.sparse = true;
  sparse.num_heads = 128;
  sparse.topk = 2048;
  sparse.max_batch = 1;
  EXPECT_EQ(mla_plan_blocks(sparse), 32);
  EXPECT_TRUE(mla_combine_split(sparse, 66));   // 32 pieces of one block
  sparse.max_batch = 3;
  EXPECT_TRUE(mla_combine_split(sparse, 66));   // 16 (the threshold)
  sparse.max_batch = 4;
  EXPECT_FALSE(mla_combine_split(sparse, 66));  // 11
  sparse.kv_format = MlaCacheFormat::kModel1;
  sparse.topk = 128;
  sparse.extra_topk = 1000;
  EXPECT_EQ(mla_plan_blocks(sparse), 2 + 16);
  sparse.kv_format = MlaCacheFormat::kDefault;
  EXPECT_EQ(mla_plan_blocks(sparse), 2);  // the extra list counts for MODEL1 only
  jit::testing::ScopedEnv retired("DECA_MLA_COMBINE", "split");
  EXPECT_THROW((void)mla_decode_key(90, "sm90", sparse), Error);
}

}  // namespace
}  // namespace deca::cuda
