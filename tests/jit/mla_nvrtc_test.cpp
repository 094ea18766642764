// NVRTC compiles every MLA sparse decode kernel (scheduler, portable decode, combine, the generic
// combine op) for sm_90a and sm_80 without a GPU (this runs in CI): each cubin exports its entry
// and does not spill. Prints compile time, registers and spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/mla_spec.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "jit/compile_check.hpp"
#include "jit/scoped_env.hpp"

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
      jit::testing::expect_no_spills(jit::testing::compile_and_check(spec), spec.name, false);
    }
  }
}

// The warp-specialized sm90 decode kernel compiles for sm_90a and exports its entry. Register and
// spill figures are printed for the record; its own budget (setmaxnreg per warpgroup) is that
// kernel's business (tests/jit/mla_sm90_nvrtc_test.cpp checks every plan's).
TEST(MlaNvrtc, Sm90DecodeCompiles) {
  MlaKernelKey key;
  key.arch = 90;
  key.variant = "sm90";
  key.page_size = 64;
  jit::testing::compile_and_check(key.spec());
}

// The page size is compiled into the sm90 kernel (Cfg::kPageSize: one division by a constant), so
// a plan of any page size gets its own specialisation: the ones FlashMLA's tests use that are not
// powers of two (61, 576) compile without spills in the kernels the plans pick (the direct kernel
// at 16 heads, the tiled one at 128).
TEST(MlaNvrtc, Sm90PlanKernelsCompileForAnyPageSize) {
  for (int heads : {16, 128}) {
    for (int page : {61, 576}) {
      MlaConfig c;
      c.num_heads = heads;
      c.sparse = true;
      c.topk = 2048;
      c.page_size = page;
      c.checked = false;
      const MlaKernelKey key = mla_decode_key(90, mla_plan_variant(90, c), c);
      const jit::JitSpec spec = key.spec();
      EXPECT_NE(spec.name.find("_p" + std::to_string(page)), std::string::npos) << spec.name;
      jit::testing::expect_no_spills(jit::testing::compile_and_check(spec), spec.name);
    }
  }
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

// One kernel per shape class: the direct kernel at 1..16 heads, the wide kernel without a cluster
// at 17..64 and in a cluster of 2 at 65..128; the key's name and prologue say which, and the
// launch shape follows.
TEST(MlaSm90Keys, OneKernelPerHeadCountClass) {
  MlaConfig c;
  c.checked = false;  // explicit: the test binary may run checked plans by default
  c.sparse = true;
  c.topk = 2048;
  c.page_size = 64;
  for (int heads = 1; heads <= 128; ++heads) {
    c.num_heads = heads;
    const MlaKernelKey k = mla_decode_key(90, "sm90", c);
    const MlaDecodeShape shape = mla_decode_shape(k);
    const std::string src = k.spec().source;
    SCOPED_TRACE(heads);
    if (heads <= 16) {
      EXPECT_EQ(k.name(), "mla_sparse_decode_sm90_p64_direct_sm90");
      EXPECT_EQ(shape.threads, 384);
      EXPECT_EQ(shape.cluster_x, 1);
      EXPECT_NE(src.find("kDirect = 1;"), std::string::npos);
    } else if (heads <= 64) {
      EXPECT_EQ(k.name(), "mla_sparse_decode_sm90_p64_sm90");
      EXPECT_EQ(shape.threads, 512);
      EXPECT_EQ(shape.cluster_x, 1);
      EXPECT_NE(src.find("kDirect = 0;"), std::string::npos);
      EXPECT_NE(src.find("kCluster = 1;"), std::string::npos);
    } else {
      EXPECT_EQ(k.name(), "mla_sparse_decode_sm90_p64_c2_sm90");
      EXPECT_EQ(shape.threads, 512);
      EXPECT_EQ(shape.cluster_x, 2);
      EXPECT_NE(src.find("kCluster = 2;"), std::string::npos);
    }
    EXPECT_NE(src.find("kPageSize = 64;"), std::string::npos);
    EXPECT_EQ(src.find("kAblate"), std::string::npos) << "timing-only builds are the tests' alone";
  }
  c.num_heads = 16;
  c.page_size = 1;
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p1_direct_sm90");
  EXPECT_EQ(mla_decode_key(90, "portable", c).name(), "mla_sparse_decode_portable_sm90");
}

// The environment variables that chose the retired sm90 variants are refused when a plan is made,
// by name, with what replaced them; DECA_MLA_KERNEL stays.
TEST(MlaSm90Keys, RetiredVariablesAreRefusedByName) {
  MlaConfig c;
  c.sparse = true;
  c.topk = 128;
  c.num_heads = 64;
  for (const char* var : {"DECA_MLA_PIPE", "DECA_MLA_DIRECT", "DECA_MLA_SEESAW", "DECA_MLA_STAMP", "DECA_MLA_CLUSTER"}) {
    jit::testing::ScopedEnv env(var, "1");
    try {
      (void)mla_decode_key(90, "sm90", c);
      ADD_FAILURE() << var << " set: expected a deca::Error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("plan_mla_decode: environment ") + var), std::string::npos) << what;
      EXPECT_NE(what.find("retired"), std::string::npos) << what;
      EXPECT_NE(what.find("got \"1\""), std::string::npos) << what;
    }
  }
  jit::testing::ScopedEnv kernel("DECA_MLA_KERNEL", "portable");
  EXPECT_EQ(mla_decode_variant(90), "portable");
  kernel.set(nullptr);
  EXPECT_EQ(mla_decode_variant(90), "sm90");
}

TEST(MlaNvrtc, PortableOnAnythingButSm90) {
  EXPECT_EQ(mla_decode_variant(80), "portable");
  EXPECT_EQ(mla_decode_variant(89), "portable");
  EXPECT_EQ(mla_decode_variant(100), "portable");
}

}  // namespace
}  // namespace deca::cuda
