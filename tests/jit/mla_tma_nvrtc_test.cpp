// The dense bf16 rows by TMA (kernels/mla/sm90/rows.cuh, Cfg::kTma) without a GPU: which plans
// take them (the sm90 dense bf16 plans of 65..128 heads at pages of a multiple of 64), their
// names and prologues, and NVRTC compiles each of them for sm_90a as cleanly as the kernels
// without it (no spill, no stack, setmaxnreg kept, wgmma unserialized), checked and unchecked.
#include <gtest/gtest.h>

#include <string>

#include "cuda/mla_spec.hpp"
#include "cuda/mla_tma.hpp"
#include "deca/mla.hpp"
#include "jit/mla_sm90_clean_compile.hpp"
#include "kernels/mla/params.cuh"

namespace deca {
namespace {

MlaConfig dense_config(int heads, int page, MlaCacheFormat format, bool checked = false) {
  MlaConfig c;
  c.num_heads = heads, c.page_size = page, c.max_seq_len = 8192;
  c.kv_format = format, c.checked = checked;
  return c;
}

TEST(MlaTmaNvrtc, PlansTakeTmaRowsForBf16ClustersAtPagesOfSixtyFourMultiples) {
  for (MlaCacheFormat format : {MlaCacheFormat::kBF16, MlaCacheFormat::kFP8E4M3, MlaCacheFormat::kFP8Sparse}) {
    for (int heads : {1, 16, 17, 64, 65, 100, 128}) {
      for (int page : {1, 2, 16, 32, 61, 63, 64, 65, 96, 128, 192, 256, 576, 1024}) {
        const MlaConfig c = dense_config(heads, page, format);
        const cuda::MlaKernelKey key = cuda::mla_decode_key(90, "sm90", c);
        const bool expect = format == MlaCacheFormat::kBF16 && heads > 64 && page % 64 == 0;
        EXPECT_EQ(key.tma, expect) << heads << " heads, page " << page << ", " << key.name();
        EXPECT_EQ(key.name().find("_tma") != std::string::npos, expect) << key.name();
        EXPECT_EQ(key.spec().source.find("kTma = 1;") != std::string::npos, expect) << key.spec().source;
        // The entry with the map as its second parameter (kernels/mla/sm90/entry.cuh).
        EXPECT_EQ(key.spec().source.find("#define DECA_MLA_TMA_ROWS 1") != std::string::npos, expect);
        if (!expect) EXPECT_EQ(key.spec().source.find("kTma"), std::string::npos) << key.name();
        // The portable kernel and other architectures never.
        EXPECT_FALSE(cuda::mla_decode_key(90, "portable", c).tma);
        EXPECT_FALSE(cuda::mla_decode_key(80, "portable", c).tma);
      }
    }
  }
  // Sparse plans never (their cache is the 656-byte token, read by the records' producers).
  MlaConfig sparse = dense_config(128, 64, MlaCacheFormat::kDefault);
  sparse.sparse = true;
  sparse.topk = 2048;
  EXPECT_FALSE(cuda::mla_decode_key(90, "sm90", sparse).tma);
  EXPECT_EQ(cuda::mla_decode_key(90, "sm90", dense_config(128, 64, MlaCacheFormat::kBF16)).name(),
            "mla_dense_decode_sm90_bf16_p64_c2_tma_sm90");
  EXPECT_EQ(cuda::mla_decode_key(90, "sm90", dense_config(100, 576, MlaCacheFormat::kBF16, true)).name(),
            "mla_dense_decode_sm90_bf16_chk_p576_c2_tma_sm90");
}

TEST(MlaTmaNvrtc, SelectionIsThePureFunction) {
  const mla::sm90::KernelClass c2{0, 2}, c1{0, 1}, direct{1, 1};
  EXPECT_TRUE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c2, 64));
  EXPECT_TRUE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c2, 128));
  EXPECT_TRUE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c2, 576));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c2, 32));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c2, 0));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c2, 63));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, c1, 64));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(true, kMlaKvBF16, direct, 64));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(true, kMlaKvFP8E4M3, c2, 64));
  EXPECT_FALSE(cuda::mla_dense_tma_rows(false, kMlaKvBF16, c2, 64));
}

// Every TMA kernel a plan of the GPU tests or the bench selects: 128 and 100 heads (one kernel),
// pages 64, 128, 256 and 576, checked or not, and FlashMLA's empty-row convention.
TEST(MlaTmaNvrtc, TmaKernelsCompileWithoutSpills) {
  for (int page : {64, 128, 256, 576}) {
    for (bool checked : {false, true}) {
      const cuda::MlaKernelKey key =
          cuda::mla_decode_key(90, "sm90", dense_config(128, page, MlaCacheFormat::kBF16, checked));
      ASSERT_TRUE(key.tma) << key.name();
      expect_clean_compile(key.spec());
    }
  }
  MlaConfig pinf = dense_config(128, 64, MlaCacheFormat::kBF16);
  pinf.lse_of_empty_row = MlaLseOfEmptyRow::kPosInf;
  const cuda::MlaKernelKey key = cuda::mla_decode_key(90, "sm90", pinf);
  ASSERT_TRUE(key.tma);
  expect_clean_compile(key.spec());
}

}  // namespace
}  // namespace deca
