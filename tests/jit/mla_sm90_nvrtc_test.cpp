// NVRTC compiles the sm90a MLA sparse decode kernels (no GPU needed: runs in CI): every kernel
// a plan selects, at several page sizes (MODEL1's at the page pairs its tests and bench use); each cubin exports the entry, and ptxas reports no
// spills, no stack and none of the warnings that silently cost the design its point: setmaxnreg
// ignored (C7508) or wgmma serialized (the accumulators touched inside a wgmma pipeline stage).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "jit/elf_symbols.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "jit/nvrtc_compile.hpp"
#include "kernels/mla/params.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca {
namespace {

// `timing_only`: an ablation whose numbers are wrong anyway; a few spilled bytes there only
// blur its time, so they are printed, not failed on.
void expect_clean_compile(const jit::JitSpec& spec, bool timing_only = false) {
  const jit::CompileResult r = jit::compile(spec);
  ASSERT_FALSE(r.cubin.empty()) << spec.name;
  ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log:\n" << r.log;
  EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-32s %7.0f ms  regs=%d spill_stores=%d spill_loads=%d stack=%d\n",
              spec.name.c_str(), r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
              r.ptxas.spill_load_bytes, r.ptxas.stack_bytes);
  if (!timing_only) {
    EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
    EXPECT_EQ(r.ptxas.spill_load_bytes, 0) << spec.name;
    EXPECT_EQ(r.ptxas.stack_bytes, 0) << spec.name;
  }
  // 384 threads (the direct kernel) or 512, one CTA per SM: the launch budget setmaxnreg
  // redistributes.
  const bool direct = spec.source.find("kDirect = 1;") != std::string::npos;
  EXPECT_LE(r.ptxas.registers, direct ? 168 : 128) << spec.name;
  EXPECT_EQ(r.log.find("C7508"), std::string::npos) << spec.name << ":\n" << r.log;
  EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
}

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

// The dense kernels with the split consumers (DECA_MLA_DENSE_CONSUMERS=split,
// kernels/mla/sm90/split_consumer.cuh) where they fit (traits.cuh split_consumers_fit): every
// format in a cluster (65..128 heads), bf16 rows without one (17..64 heads; 16 and fewer too), at
// page sizes 1, 61, 64 and 576 (q_len is a run-time value: one kernel serves 1..4). The plans they
// do not fit keep the default consumers' kernel.
TEST(MlaSm90Nvrtc, DenseSplitConsumersCompileWithoutSpills) {
  for (int format : {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
    for (int heads : {16, 64, 128}) {
      for (int page : {1, 61, 64, 576}) {
        const jit::JitSpec spec = test::mla_sm90_spec(page, heads, 0, format, true);
        const bool fits = heads > 64 || (format == kMlaKvBF16);
        EXPECT_EQ(spec.name.find("_split") != std::string::npos, fits) << spec.name;
        EXPECT_EQ(spec.source.find("kSplit = 1;") != std::string::npos, fits) << spec.name;
        if (fits) expect_clean_compile(spec);
      }
    }
  }
  // The consumers-alone and producers-alone builds (config.cuh Ablate 3, 4; no no-wgmma one).
  for (int ablate : {3, 4}) expect_clean_compile(test::mla_sm90_spec(64, 128, ablate, kMlaKvBF16, true), true);
}

// The MODEL1 kernels (584-byte tokens of two caches, the wide kernel at every head count) the GPU
// tests (tests/gpu/mla_model1_gpu_test.cpp) and the mla-model1 bench rows plan: each (page,
// extra page) pair they use, without and with a cluster, as mla_decode_key makes them.
TEST(MlaSm90Nvrtc, Model1KernelsCompileWithoutSpills) {
  struct Pages {
    int page, extra;
  };
  for (const Pages pg : {Pages{64, 256}, Pages{256, 2}, Pages{2, 64}, Pages{256, 64}, Pages{64, 2},
                         Pages{64, 64}, Pages{7, 5}}) {
    for (int heads : {16, 128}) {
      MlaConfig c;
      c.num_heads = heads;
      c.sparse = true;
      c.kv_format = MlaCacheFormat::kModel1;
      c.topk = 128;
      c.page_size = pg.page;
      c.extra_topk = 1024;
      c.extra_page_size = pg.extra;
      c.checked = false;
      expect_clean_compile(cuda::mla_decode_key(90, "sm90", c).spec());
    }
  }
}

// The timing-only builds that leave a stage out (config.cuh Ablate), as the timing test runs them:
// their numbers are wrong anyway, so a few spilled bytes there are printed, not failed on.
TEST(MlaSm90Nvrtc, AblationsCompile) {
  for (int heads : {16, 64, 128}) {
    for (int ablate : {1, 2, 3, 4}) {
      if (heads <= 16 && ablate == 3) continue;  // the direct kernel has no consumers-only build
      expect_clean_compile(test::mla_sm90_spec(64, heads, ablate), true);
    }
  }
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
