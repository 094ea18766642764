// NVRTC compiles the sm90a MLA sparse decode kernels (no GPU needed: runs in CI): every kernel
// a plan selects, at several page sizes (MODEL1's at the page pairs its tests and bench use); each cubin exports the entry, and ptxas reports no
// spills, no stack and none of the warnings that silently cost the design its point: setmaxnreg
// ignored (C7508) or wgmma serialized (the accumulators touched inside a wgmma pipeline stage).
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "deca/error.hpp"
#include "jit/mla_sm90_clean_compile.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "jit/mla_sm90_timing_cases.hpp"
#include "jit/nvrtc_compile.hpp"
#include "jit/scoped_env.hpp"
#include "deca/mla.hpp"
#include "kernels/mla/params.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca {
namespace {

// Every kernel a plan compiles (kernel_class: the direct kernel at <= 16 heads, the wide kernel
// without a cluster at 17..64 and in a cluster of 2 at 65..128), at page sizes 1, 16, 64 and 128
// (the page size only changes a division).
TEST(MlaSm90Nvrtc, EveryPlanKernelCompilesWithoutSpills) {
  for (int heads : {16, 64, 128}) {
    for (int page : {1, 16, 64, 128}) expect_clean_compile(test::mla_sm90_spec(page, heads));
  }
}

// The dense decode kernels: bf16 and e4m3 rows through the wide kernel at every head class, the
// 656-byte token read densely through the direct kernel at <= 16 heads and the wide one above, at
// page sizes 1, 61 and 64.
TEST(MlaSm90Nvrtc, DenseKernelsCompileWithoutSpills) {
  for (int format : {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
    for (int heads : {16, 64, 128}) {
      for (int page : {1, 61, 64}) expect_clean_compile(test::mla_sm90_spec(page, heads, 0, format));
    }
  }
}

// The MODEL1 kernels (584-byte tokens of two caches: the direct kernel up to 16 heads, the wide
// kernel above) the GPU tests (tests/gpu/mla_model1_gpu_test.cpp) and the mla-model1 bench rows
// plan: each (page, extra page) pair they use (extra 0: no second cache, its page size the
// default's), the direct kernel, the wide one without and with a cluster, as mla_decode_key makes
// them. The direct kernel's consumers and producer stay within its setmaxnreg budgets (no spill,
// no C7508), its wgmma unserialized.
TEST(MlaSm90Nvrtc, Model1KernelsCompileWithoutSpills) {
  struct Pages {
    int page, extra;
  };
  for (const Pages pg : {Pages{64, 256}, Pages{256, 2}, Pages{2, 64}, Pages{256, 64}, Pages{64, 2},
                         Pages{64, 64}, Pages{7, 5}, Pages{2, 2}, Pages{256, 0}, Pages{2, 0}}) {
    for (int heads : {1, 16, 64, 128}) {
      if (heads == 1 && pg.page != 2) continue;  // 1 head: the direct kernel as 16 (one key per pages)
      MlaConfig c;
      c.num_heads = heads;
      c.sparse = true;
      c.kv_format = MlaCacheFormat::kModel1;
      c.topk = 128;
      c.page_size = pg.page;
      c.extra_topk = pg.extra > 0 ? 1024 : 0;
      c.extra_page_size = pg.extra;
      c.checked = false;
      const jit::JitSpec spec = cuda::mla_decode_key(90, "sm90", c).spec();
      EXPECT_EQ(spec.name.find("_direct") != std::string::npos, heads <= 16) << spec.name;
      expect_clean_compile(spec);
    }
  }
}

// The checked builds (Cfg::kChecked, kernels/mla/sm90/checked.cuh) of every kernel class and
// format a checked plan runs on sm_90, as mla_decode_key makes
// them: sparse V3.2, MODEL1 and dense 656-byte (the direct kernel at 16 heads, the wide kernel at
// 64, the cluster of 2 at 128), dense bf16 / e4m3 (the wide kernel, without and with a cluster),
// at pages 1, 61, 64 and 576. Their tests ride on finish_id's compare and write the
// record after the block loop: no spill (none beyond the unchecked build's), no serialized wgmma,
// registers within the launch budget as the unchecked builds'.
MlaConfig checked_sm90_config(int heads, int page, int format) {
  MlaConfig c;
  c.num_heads = heads;
  c.page_size = page;
  c.checked = true;
  c.sparse = format == kMlaKvFP8Sparse || format == kMlaKvModel1;
  c.topk = 2048;
  c.max_seq_len = 65536;
  switch (format) {
    case kMlaKvBF16: c.kv_format = MlaCacheFormat::kBF16; break;
    case kMlaKvFP8E4M3: c.kv_format = MlaCacheFormat::kFP8E4M3; break;
    case kMlaKvModel1:
      c.kv_format = MlaCacheFormat::kModel1;
      c.extra_topk = 512;
      c.extra_page_size = page;
      break;
    default: c.kv_format = MlaCacheFormat::kFP8Sparse; break;
  }
  return c;
}

TEST(MlaSm90Nvrtc, CheckedKernelsCompileWithoutSpills) {
  struct Kind {
    int format;
    bool dense;
  };
  for (const Kind kind : {Kind{kMlaKvFP8Sparse, false}, Kind{kMlaKvFP8Sparse, true}, Kind{kMlaKvBF16, true},
                          Kind{kMlaKvFP8E4M3, true}, Kind{kMlaKvModel1, false}}) {
    for (int heads : {16, 64, 128}) {
      // The tile-only formats' 16 and 64 heads are one kernel (the wide one without a cluster).
      const bool tile_only = kind.format == kMlaKvBF16 || kind.format == kMlaKvFP8E4M3;
      if (tile_only && heads == 64) continue;
      for (int page : {1, 61, 64, 576}) {
        MlaConfig c = checked_sm90_config(heads, page, kind.format);
        c.sparse = !kind.dense;
        const cuda::MlaKernelKey key = cuda::mla_decode_key(90, "sm90", c);
        ASSERT_TRUE(key.checked);
        const jit::JitSpec spec = key.spec();
        EXPECT_NE(spec.source.find("kChecked = true;"), std::string::npos) << spec.source;
        EXPECT_NE(spec.name.find("_chk_p"), std::string::npos) << spec.name;
        jit::PtxasInfo bound;
        if (kind.format == kMlaKvModel1 && page == 1) {
          // MODEL1 at pages 1 x 1 (no plan of the tests or the bench uses it): the unchecked
          // build spills a few bytes in its 80-register producers already; the checked one may
          // spill no more than it.
          c.checked = false;
          bound = jit::compile(cuda::mla_decode_key(90, "sm90", c).spec()).ptxas;
          std::printf("[nvrtc] unchecked MODEL1 p1x1 at %d heads: spill_stores=%d spill_loads=%d stack=%d\n", heads,
                      bound.spill_store_bytes, bound.spill_load_bytes, bound.stack_bytes);
        }
        expect_clean_compile(spec, bound);
      }
    }
  }
}

// A checked plan on sm_90 runs the sm90 kernel's checked build, named "_chk", for every format
// the sm90 kernels serve; on other archs, and with DECA_MLA_KERNEL=portable, the portable
// kernel's. Unchecked plans and their kernels' source are what they were. DECA_MLA_SM90_CHECKED,
// the override that chose them before their GPU round, is refused.
TEST(MlaSm90Nvrtc, CheckedPlansSelectTheSm90CheckedBuilds) {
  jit::testing::ScopedEnv kernel("DECA_MLA_KERNEL", nullptr);
  for (int format : {kMlaKvFP8Sparse, kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvModel1}) {
    MlaConfig c = checked_sm90_config(16, 64, format);
    EXPECT_EQ(cuda::mla_plan_variant(90, c), "sm90") << format;
    EXPECT_EQ(cuda::mla_plan_variant(80, c), "portable") << format;
    const cuda::MlaKernelKey key = cuda::mla_decode_key(90, "sm90", c);
    EXPECT_NE(key.name().find("_sm90_"), std::string::npos) << key.name();
    EXPECT_NE(key.name().find("_chk_p64"), std::string::npos) << key.name();
    EXPECT_NE(key.spec().source.find("kChecked = true;"), std::string::npos) << key.spec().source;
    c.checked = false;
    const cuda::MlaKernelKey plain = cuda::mla_decode_key(90, "sm90", c);
    EXPECT_EQ(plain.name().find("_chk"), std::string::npos) << plain.name();
    EXPECT_EQ(plain.spec().source.find("kChecked"), std::string::npos) << plain.spec().source;
    EXPECT_EQ(cuda::mla_plan_variant(90, c), "sm90") << format;
    c.checked = true;
    {
      jit::testing::ScopedEnv portable("DECA_MLA_KERNEL", "portable");
      EXPECT_EQ(cuda::mla_plan_variant(90, c), "portable") << format;
    }
    jit::testing::ScopedEnv retired("DECA_MLA_SM90_CHECKED", "1");
    try {
      (void)cuda::mla_decode_key(90, "sm90", c);
      ADD_FAILURE() << "DECA_MLA_SM90_CHECKED=1: expected a deca::Error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("plan_mla_decode: environment DECA_MLA_SM90_CHECKED: expected unset"), std::string::npos)
          << what;
    }
  }
}

// The kernels of plans with MlaConfig::lse_of_empty_row kPosInf (FlashMLA's compat layer): the
// sparse direct, wide and cluster kernels, the dense bf16 wide kernel and MODEL1's, each with the
// convention compiled in ("_lsepinf", the macro in the source) and as clean as without it.
TEST(MlaSm90Nvrtc, LsePosInfKernelsCompileWithoutSpills) {
  struct Plan {
    int heads;
    bool sparse;
    MlaCacheFormat format;
  };
  for (const Plan pl : {Plan{16, true, MlaCacheFormat::kDefault}, Plan{64, true, MlaCacheFormat::kDefault},
                        Plan{128, true, MlaCacheFormat::kDefault}, Plan{16, false, MlaCacheFormat::kBF16},
                        Plan{16, true, MlaCacheFormat::kModel1}, Plan{128, true, MlaCacheFormat::kModel1}}) {
    MlaConfig c;
    c.num_heads = pl.heads;
    c.sparse = pl.sparse;
    c.kv_format = pl.format;
    c.topk = pl.sparse ? 2048 : 0;
    c.max_seq_len = 4096;
    c.checked = false;
    c.lse_of_empty_row = MlaLseOfEmptyRow::kPosInf;
    const jit::JitSpec spec = cuda::mla_decode_key(90, "sm90", c).spec();
    EXPECT_NE(spec.name.find("_lsepinf_sm90"), std::string::npos) << spec.name;
    EXPECT_NE(spec.source.find("#define DECA_MLA_LSE_EMPTY_POS_INF 1"), std::string::npos) << spec.source;
    expect_clean_compile(spec);
  }
}

// The +inf convention in the sm90 checked builds (a checked FlashMLA plan), whose final LSE goes
// through the same store_lse.
TEST(MlaSm90Nvrtc, LsePosInfCheckedKernelsCompile) {
  const auto expect_pos_inf = [](const cuda::MlaKernelKey& key, const char* part) {
    const jit::JitSpec spec = key.spec();
    EXPECT_NE(spec.name.find(part), std::string::npos) << spec.name;
    EXPECT_NE(spec.name.find("_lsepinf_sm90"), std::string::npos) << spec.name;
    EXPECT_NE(spec.source.find("#define DECA_MLA_LSE_EMPTY_POS_INF 1"), std::string::npos) << spec.source;
    expect_clean_compile(spec);
  };
  for (int format : {kMlaKvFP8Sparse, kMlaKvBF16, kMlaKvModel1}) {
    for (int heads : {16, 64, 128}) {
      if (format == kMlaKvBF16 && heads == 64) continue;  // the same wide kernel as 16
      MlaConfig c = checked_sm90_config(heads, 64, format);
      c.lse_of_empty_row = MlaLseOfEmptyRow::kPosInf;
      const cuda::MlaKernelKey key = cuda::mla_decode_key(90, "sm90", c);
      ASSERT_TRUE(key.checked && key.lse_pos_inf);
      expect_pos_inf(key, "_chk_p");
    }
  }
}

// The timing-only builds that leave a stage out (config.cuh Ablate) of every kernel the timing
// test runs (tests/jit/mla_sm90_timing_cases.hpp: V3.2's sparse rows, the dense rows, the MODEL1
// rows; each kernel once), as clean as the plans' kernels: a spill or a serialized wgmma would
// time something other than the kernel less one stage.
TEST(MlaSm90Nvrtc, AblationsCompile) {
  std::vector<test::TimingCase> cases = test::sparse_timing_cases();
  for (const auto& more : {test::dense_timing_cases(), test::model1_timing_cases()}) {
    cases.insert(cases.end(), more.begin(), more.end());
  }
  std::set<std::string> compiled;
  for (const test::TimingCase& c : cases) {
    const cuda::MlaKernelKey key = test::timing_key(c);
    for (const test::TimingVariant& v : test::timing_variants(key)) {
      if (v.ablate == mla::sm90::kAblateNone) continue;  // the plans' kernels: the tests above
      const jit::JitSpec spec = test::timing_spec(key, v);
      if (!compiled.insert(spec.name).second) continue;
      expect_clean_compile(spec);
    }
  }
  // V3.2: 4 + 4 + 3 (the direct kernel has no consumers-only build); dense: 3 kernels (bf16 at
  // 64 and 16 heads is one) x 4, and bf16 at 128 heads (TMA rows) its register producers alone;
  // MODEL1: 2 x 4.
  EXPECT_EQ(compiled.size(), 11u + 13u + 8u);
}

TEST(MlaSm90Nvrtc, SharedMemoryPlanFitsOneCta) {
  static_assert(mla::sm90::kSmemBytes <= 227 * 1024);
  EXPECT_EQ(mla::sm90::threads_of(1), 384);
  EXPECT_EQ(mla::sm90::threads_of(0), 512);
  EXPECT_EQ(mla::sm90::launch_regs(384), 168);
  EXPECT_EQ(mla::sm90::launch_regs(512), 128);
  EXPECT_EQ(mla::sm90::head_blocks(64), 1);
  EXPECT_EQ(mla::sm90::head_blocks(100), 2);
  EXPECT_EQ(mla::sm90::head_blocks(128), 2);
  std::printf("[smem] %d bytes dynamic per CTA\n", mla::sm90::kSmemBytes);
}

}  // namespace
}  // namespace deca
