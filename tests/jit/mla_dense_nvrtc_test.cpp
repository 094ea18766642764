// NVRTC compiles every dense specialisation of the portable MLA decode kernel (three cache
// formats, checked or not) for sm_90a and sm_80 without a GPU (this runs in CI): each cubin
// exports its entry and does not spill. Also the dense keys' names and JIT prologues, which the
// kernel caches and the plans' kernel_name show.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cuda/mla_spec.hpp"
#include "deca/mla.hpp"
#include "jit/compile_check.hpp"
#include "kernels/mla/params.cuh"

namespace deca::cuda {
namespace {

MlaKernelKey dense_key(int arch, int kv_format, bool checked) {
  MlaKernelKey k;
  k.arch = arch;
  k.role = MlaKernelRole::kDecode;
  k.variant = "portable";
  k.dense = true;
  k.kv_format = kv_format;
  k.checked = checked;
  return k;
}

TEST(MlaDenseNvrtc, EveryPortableDenseKernelCompilesForSm90aAndSm80WithoutSpilling) {
  for (int arch : {90, 80}) {
    for (int format : {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
      for (bool checked : {false, true}) {
        const jit::JitSpec spec = dense_key(arch, format, checked).spec();
        jit::testing::expect_no_spills(jit::testing::compile_and_check(spec), spec.name);
      }
    }
  }
}

TEST(MlaDenseNvrtc, NamesAndPrologues) {
  EXPECT_EQ(dense_key(90, kMlaKvBF16, false).name(), "mla_dense_decode_portable_bf16_sm90");
  EXPECT_EQ(dense_key(80, kMlaKvFP8E4M3, false).name(), "mla_dense_decode_portable_fp8_e4m3_sm80");
  EXPECT_EQ(dense_key(90, kMlaKvFP8Sparse, true).name(), "mla_dense_decode_portable_fp8_sparse_chk_sm90");
  const jit::JitSpec spec = dense_key(90, kMlaKvFP8E4M3, true).spec();
  EXPECT_EQ(spec.entry, "deca_mla_dense_decode");
  EXPECT_NE(spec.source.find("kChecked = true;"), std::string::npos) << spec.source;
  EXPECT_NE(spec.source.find("kKvFormat = 1;"), std::string::npos) << spec.source;
  EXPECT_NE(spec.source.find("kernels/mla/sm80/dense_entry.cuh"), std::string::npos) << spec.source;

  // The sparse keys keep their names, entries and sources (the kernel caches' entries stay valid).
  MlaKernelKey sparse;
  EXPECT_EQ(sparse.name(), "mla_sparse_decode_portable_sm90");
  EXPECT_EQ(sparse.spec().entry, "deca_mla_sparse_decode");
  EXPECT_EQ(sparse.spec().source.find("struct Cfg"), std::string::npos);
  sparse.checked = true;
  EXPECT_EQ(sparse.name(), "mla_sparse_decode_portable_chk_sm90");

  // The scheduler and the combine are the sparse run's whatever the key's token source.
  MlaKernelKey schedule = dense_key(90, kMlaKvBF16, false);
  schedule.role = MlaKernelRole::kSchedule;
  EXPECT_EQ(schedule.name(), "mla_sparse_schedule_sm90");
}

// The sm90 kernel's prologue carries a dense key's token source and format (Cfg::kDense,
// kKvFormat); a sparse key's leaves them out (the fields' defaults: indices, the 656-byte token),
// so that its source, name and cache entry stay as they were.
TEST(MlaDenseNvrtc, Sm90PrologueCarriesTheTokenSource) {
  MlaKernelKey k;
  k.arch = 90;
  k.variant = "sm90";
  k.page_size = 64;
  const std::string sparse_name = k.name();
  EXPECT_EQ(sparse_name.rfind("mla_sparse_decode_sm90_p64", 0), 0u) << sparse_name;
  EXPECT_EQ(k.spec().source.find("kDense"), std::string::npos);
  EXPECT_EQ(k.spec().source.find("kKvFormat"), std::string::npos);
  k.dense = true;
  k.kv_format = kMlaKvBF16;
  EXPECT_EQ(k.name(), "mla_dense_decode_sm90_bf16" + sparse_name.substr(std::string("mla_sparse_decode_sm90").size()));
  EXPECT_NE(k.spec().source.find("kDense = 1;"), std::string::npos);
  EXPECT_NE(k.spec().source.find("kKvFormat = 0;"), std::string::npos);
}

// A dense plan's key: its format (kDefault = bf16), checked or not; the portable kernel on every
// architecture while mla_dense_sm90_supported says no for the format.
TEST(MlaDenseNvrtc, PlanKeysFromTheConfig) {
  MlaConfig c;
  c.num_heads = 128;
  c.page_size = 64;
  c.max_seq_len = 8192;
  c.checked = false;
  struct Row {
    MlaCacheFormat format;
    int kv_format;
    const char* name;
  };
  for (const Row r : {Row{MlaCacheFormat::kDefault, kMlaKvBF16, "bf16"}, Row{MlaCacheFormat::kBF16, kMlaKvBF16, "bf16"},
                      Row{MlaCacheFormat::kFP8E4M3, kMlaKvFP8E4M3, "fp8_e4m3"},
                      Row{MlaCacheFormat::kFP8Sparse, kMlaKvFP8Sparse, "fp8_sparse"}}) {
    c.kv_format = r.format;
    EXPECT_EQ(mla_kv_format(c), r.kv_format);
    for (int arch : {80, 89, 90}) {
      const std::string variant = mla_plan_variant(arch, c);
      if (!mla_dense_sm90_supported(r.kv_format)) EXPECT_EQ(variant, "portable") << arch;
      c.checked = false;
      const MlaKernelKey k = mla_decode_key(arch, "portable", c);
      EXPECT_TRUE(k.dense);
      EXPECT_EQ(k.kv_format, r.kv_format);
      EXPECT_EQ(k.name(), "mla_dense_decode_portable_" + std::string(r.name) + "_sm" + std::to_string(arch));
      c.checked = true;
      EXPECT_EQ(mla_plan_variant(arch, c), variant);  // a checked plan: its variant's checked build
      EXPECT_EQ(mla_decode_key(arch, "portable", c).name(),
                "mla_dense_decode_portable_" + std::string(r.name) + "_chk_sm" + std::to_string(arch));
      c.checked = false;
    }
  }
  // Sparse keys are what they were.
  c.sparse = true;
  c.topk = 2048;
  c.kv_format = MlaCacheFormat::kDefault;
  EXPECT_EQ(mla_kv_format(c), kMlaKvFP8Sparse);
  EXPECT_FALSE(mla_decode_key(90, "portable", c).dense);
  EXPECT_EQ(mla_decode_key(90, "portable", c).name(), "mla_sparse_decode_portable_sm90");
}

}  // namespace
}  // namespace deca::cuda
