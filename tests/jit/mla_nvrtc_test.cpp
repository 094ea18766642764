// NVRTC compiles every MLA sparse decode kernel (scheduler, portable decode, combine, the generic
// combine op) for sm_90a and sm_80 without a GPU (this runs in CI): each cubin exports its entry
// and does not spill. Prints compile time, registers and spills.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/mla_spec.hpp"
#include "deca/mla.hpp"
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

// The page size is compiled into the sm90 kernel (Cfg::kPageSize: one division by a constant), so
// a plan of any page size gets its own specialisation: the ones FlashMLA's tests use that are not
// powers of two (61, 576) compile without spills in the kernels the plans pick (the direct kernel
// at 16 heads, the tiled one at 128).
TEST(MlaNvrtc, Sm90PlanKernelsCompileForAnyPageSize) {
  if (!kMlaSm90KernelEnabled) GTEST_SKIP() << "the sm90 MLA kernel is not enabled in this build";
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
      const jit::CompileResult r = jit::compile(spec);
      ASSERT_FALSE(r.cubin.empty()) << spec.name;
      ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
      EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
      std::printf("[nvrtc] %-36s %7.0f ms  regs=%d spill_stores=%d stack=%d\n",
                  spec.name.c_str(), r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
                  r.ptxas.stack_bytes);
      EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
      EXPECT_EQ(r.ptxas.stack_bytes, 0) << spec.name;
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

// The knobs a key may hold (mla_sm90_consistent), as a table: what was asked -> what is kept.
TEST(MlaSm90Knobs, ConsistentKeepsOnlyCombinationsTheKernelBuilds) {
  struct Row {
    int heads;
    MlaSm90Knobs asked;
    MlaSm90Knobs kept;
  };
  auto knobs = [](int cluster, int pipe, int dequant, int sync, int prefetch, int ahead, int map, int l1) {
    MlaSm90Knobs k;
    k.cluster = cluster, k.pipe = pipe, k.dequant = dequant, k.sync = sync;
    k.prefetch = prefetch, k.ahead = ahead, k.map = map, k.l1 = l1;
    return k;
  };
  const Row rows[] = {
      // The default for 128 and for 64 heads: a cluster (light hand-overs) only for 128.
      {128, knobs(2, 2, 0, 1, 0, 2, 0, 0), knobs(2, 2, 0, 1, 0, 2, 0, 0)},
      {64, knobs(2, 2, 0, 1, 0, 2, 0, 0), knobs(1, 2, 0, 0, 0, 2, 0, 0)},
      {65, knobs(2, 2, 0, 1, 0, 2, 0, 0), knobs(2, 2, 0, 1, 0, 2, 0, 0)},
      {129, knobs(2, 2, 0, 1, 0, 2, 0, 0), knobs(1, 2, 0, 0, 0, 2, 0, 0)},
      {100, knobs(1, 2, 0, 1, 0, 2, 0, 0), knobs(1, 2, 0, 0, 0, 2, 0, 0)},
      // The integer dequantization with pipe 3 only.
      {64, knobs(1, 3, 1, 0, 0, 2, 0, 0), knobs(1, 3, 1, 0, 0, 2, 0, 0)},
      {64, knobs(1, 2, 1, 0, 0, 2, 0, 0), knobs(1, 2, 0, 0, 0, 2, 0, 0)},
      // The base producer: its own prefetch distance and the unit split.
      {64, knobs(1, 0, 0, 0, 1, 4, 1, 1), knobs(1, 0, 0, 0, 1, 2, 0, 1)},
      {64, knobs(1, 1, 0, 0, 3, 4, 1, 1), knobs(1, 1, 0, 0, 3, 4, 1, 1)},
      // The mma dequantization: pipes 2 to 4, the unit split, a cluster.
      {128, knobs(2, 2, 2, 1, 0, 2, 0, 0), knobs(2, 2, 2, 1, 0, 2, 0, 0)},
      {128, knobs(2, 4, 2, 1, 0, 2, 0, 0), knobs(2, 4, 2, 1, 0, 2, 0, 0)},
      {64, knobs(2, 4, 2, 1, 0, 2, 0, 0), knobs(1, 4, 0, 0, 0, 2, 0, 0)},
      {128, knobs(2, 1, 2, 1, 0, 2, 0, 0), knobs(2, 1, 0, 1, 0, 2, 0, 0)},
      {128, knobs(2, 3, 2, 1, 0, 2, 1, 0), knobs(2, 3, 0, 1, 0, 2, 1, 0)},
      {64, knobs(1, 4, 1, 0, 0, 2, 0, 0), knobs(1, 4, 0, 0, 0, 2, 0, 0)},
      // The round stream: the unit split only, its own prefetch distance kept.
      {128, knobs(2, 4, 1, 1, 0, 3, 1, 1), knobs(2, 4, 0, 1, 0, 3, 0, 1)},
      {16, knobs(1, 4, 0, 0, 2, 2, 0, 0), knobs(1, 4, 0, 0, 2, 2, 0, 0)},
      // The pair exchange: in a cluster, with pipes 1-3 and the hardware conversions.
      {128, knobs(2, 2, 0, 1, 0, 1, 2, 0), knobs(2, 2, 0, 1, 0, 1, 2, 0)},
      {100, knobs(2, 1, 0, 1, 0, 1, 2, 0), knobs(2, 1, 0, 1, 0, 1, 2, 0)},
      {64, knobs(1, 2, 0, 0, 0, 1, 2, 0), knobs(1, 2, 0, 0, 0, 1, 0, 0)},
      {128, knobs(2, 4, 0, 1, 0, 1, 2, 0), knobs(2, 4, 0, 1, 0, 1, 0, 0)},
      {128, knobs(2, 0, 0, 1, 0, 1, 2, 0), knobs(2, 0, 0, 1, 0, 2, 0, 0)},
      {128, knobs(2, 2, 2, 1, 0, 1, 2, 0), knobs(2, 2, 0, 1, 0, 1, 2, 0)},
      // The whole-row pieces: with the hardware conversions only (another asked keeps the unit
      // split), not with one producer's whole share without a cluster.
      {128, knobs(2, 2, 0, 1, 0, 1, 3, 0), knobs(2, 2, 0, 1, 0, 1, 3, 0)},
      {128, knobs(2, 3, 1, 1, 0, 1, 3, 1), knobs(2, 3, 1, 1, 0, 1, 3, 1)},
      {128, knobs(2, 2, 2, 1, 0, 1, 3, 0), knobs(2, 2, 2, 1, 0, 1, 0, 0)},
      {128, knobs(2, 2, 1, 1, 0, 1, 3, 0), knobs(2, 2, 0, 1, 0, 1, 3, 0)},
      {64, knobs(1, 1, 0, 0, 0, 1, 3, 0), knobs(1, 1, 0, 0, 0, 1, 3, 0)},
      {64, knobs(1, 3, 1, 0, 0, 1, 3, 0), knobs(1, 3, 1, 0, 0, 1, 0, 0)},
      {64, knobs(1, 2, 0, 0, 0, 1, 3, 0), knobs(1, 2, 0, 0, 0, 1, 0, 0)},
      {16, knobs(1, 0, 0, 0, 0, 1, 3, 0), knobs(1, 0, 0, 0, 0, 2, 0, 0)},
      {128, knobs(2, 4, 0, 1, 0, 1, 3, 0), knobs(2, 4, 0, 1, 0, 1, 0, 0)},
  };
  auto with = [](MlaSm90Knobs k, int rescale, int phand) {
    k.rescale = rescale, k.phand = phand;
    return k;
  };
  // The rescale policy with any producer; P in consumer 1's registers with pipes 0-2 only.
  const Row more[] = {
      {128, with(knobs(2, 2, 0, 1, 0, 2, 0, 0), 2, 1), with(knobs(2, 2, 0, 1, 0, 2, 0, 0), 2, 1)},
      {64, with(knobs(1, 4, 0, 0, 0, 2, 0, 0), 1, 1), with(knobs(1, 4, 0, 0, 0, 2, 0, 0), 1, 0)},
      {128, with(knobs(2, 3, 0, 1, 0, 2, 0, 0), 0, 1), with(knobs(2, 3, 0, 1, 0, 2, 0, 0), 0, 0)},
      {64, with(knobs(1, 0, 0, 0, 0, 2, 0, 0), 2, 1), with(knobs(1, 0, 0, 0, 0, 2, 0, 0), 2, 1)},
      {64, with(knobs(1, 4, 0, 0, 0, 2, 0, 0), 2, 2), with(knobs(1, 4, 0, 0, 0, 2, 0, 0), 2, 2)},
      {128, with(knobs(2, 3, 0, 1, 0, 2, 0, 0), 0, 2), with(knobs(2, 3, 0, 1, 0, 2, 0, 0), 0, 2)},
      {64, with(knobs(1, 2, 0, 0, 0, 2, 0, 0), 2, 2), with(knobs(1, 2, 0, 0, 0, 2, 0, 0), 2, 0)},
      {128, with(knobs(2, 2, 0, 1, 0, 2, 0, 0), 2, 2), with(knobs(2, 2, 0, 1, 0, 2, 0, 0), 2, 2)},
      // The next block's QK^T behind P V: not with pipes 2 and 3 without a cluster.
      {64, with(knobs(1, 1, 0, 0, 0, 2, 0, 0), 2, 3), with(knobs(1, 1, 0, 0, 0, 2, 0, 0), 2, 3)},
      {64, with(knobs(1, 2, 0, 0, 0, 2, 0, 0), 2, 3), with(knobs(1, 2, 0, 0, 0, 2, 0, 0), 2, 0)},
      {64, with(knobs(1, 3, 0, 0, 0, 2, 0, 0), 2, 3), with(knobs(1, 3, 0, 0, 0, 2, 0, 0), 2, 0)},
      {128, with(knobs(2, 2, 0, 1, 0, 2, 0, 0), 2, 3), with(knobs(2, 2, 0, 1, 0, 2, 0, 0), 2, 3)},
      {128, with(knobs(2, 3, 0, 1, 0, 2, 0, 0), 2, 3), with(knobs(2, 3, 0, 1, 0, 2, 0, 0), 2, 3)},
  };
  // Two producer warpgroups: pipes 1-4 (pipe 0 asked takes 1); the unit split or the rows, the
  // hardware conversions, P from shared memory in consumer 1.
  auto two = [](MlaSm90Knobs k) {
    k.producers = 2;
    return k;
  };
  const Row producers[] = {
      // The integer placement with two producers: their whole share in one round (pipe 2) only.
      {64, two(knobs(1, 2, 1, 0, 0, 1, 3, 1)), two(knobs(1, 2, 1, 0, 0, 1, 3, 1))},
      {128, two(knobs(2, 2, 1, 1, 0, 1, 3, 0)), two(knobs(2, 2, 1, 1, 0, 1, 3, 0))},
      {64, two(knobs(1, 1, 1, 0, 0, 1, 3, 1)), two(knobs(1, 1, 0, 0, 0, 1, 3, 1))},
      {64, two(knobs(1, 3, 1, 0, 0, 1, 3, 1)), two(knobs(1, 3, 0, 0, 0, 1, 3, 1))},
      {128, two(knobs(2, 2, 2, 1, 0, 1, 0, 0)), two(knobs(2, 2, 0, 1, 0, 1, 0, 0))},
      {64, two(with(knobs(1, 4, 0, 0, 0, 2, 0, 0), 2, 2)), two(with(knobs(1, 4, 0, 0, 0, 2, 0, 0), 2, 2))},
      {64, two(with(knobs(1, 2, 0, 0, 0, 2, 0, 0), 2, 2)), two(with(knobs(1, 2, 0, 0, 0, 2, 0, 0), 2, 2))},
      {64, two(with(knobs(1, 3, 1, 0, 0, 2, 1, 0), 2, 1)), two(with(knobs(1, 3, 0, 0, 0, 2, 0, 0), 2, 0))},
      {16, two(with(knobs(1, 1, 0, 0, 0, 4, 0, 0), 2, 2)), two(with(knobs(1, 1, 0, 0, 0, 4, 0, 0), 2, 2))},
      {128, two(with(knobs(2, 2, 2, 1, 0, 1, 0, 0), 2, 0)), two(with(knobs(2, 2, 0, 1, 0, 1, 0, 0), 2, 0))},
      {128, two(with(knobs(2, 3, 0, 1, 0, 1, 0, 0), 2, 2)), two(with(knobs(2, 3, 0, 1, 0, 1, 0, 0), 2, 2))},
      {128, two(with(knobs(2, 0, 0, 1, 0, 2, 0, 0), 2, 0)), two(with(knobs(2, 1, 0, 1, 0, 2, 0, 0), 2, 0))},
      {100, two(with(knobs(2, 4, 0, 1, 0, 1, 0, 0), 2, 1)), two(with(knobs(2, 4, 0, 1, 0, 1, 0, 0), 2, 0))},
      // P in consumer 1's registers: in a cluster with pipes 1 and 2 (producers at 56 registers).
      {128, two(with(knobs(2, 2, 0, 1, 0, 1, 3, 0), 2, 1)), two(with(knobs(2, 2, 0, 1, 0, 1, 3, 0), 2, 1))},
      {100, two(with(knobs(2, 1, 0, 1, 0, 1, 0, 0), 2, 1)), two(with(knobs(2, 1, 0, 1, 0, 1, 0, 0), 2, 1))},
      {128, two(with(knobs(2, 3, 0, 1, 0, 1, 3, 0), 2, 1)), two(with(knobs(2, 3, 0, 1, 0, 1, 3, 0), 2, 0))},
      {64, two(with(knobs(1, 2, 0, 0, 0, 1, 3, 1), 2, 1)), two(with(knobs(1, 2, 0, 0, 0, 1, 3, 1), 2, 0))},
      {64, two(with(knobs(1, 1, 0, 0, 0, 1, 0, 0), 2, 3)), two(with(knobs(1, 1, 0, 0, 0, 1, 0, 0), 2, 3))},
      {64, two(with(knobs(1, 3, 0, 0, 0, 1, 0, 0), 2, 3)), two(with(knobs(1, 3, 0, 0, 0, 1, 0, 0), 2, 0))},
      {128, two(with(knobs(2, 2, 0, 1, 0, 1, 2, 0), 2, 0)), two(with(knobs(2, 2, 0, 1, 0, 1, 2, 0), 2, 0))},
      {128, two(with(knobs(2, 2, 0, 1, 0, 1, 1, 0), 2, 0)), two(with(knobs(2, 2, 0, 1, 0, 1, 0, 0), 2, 0))},
      {128, two(with(knobs(2, 3, 0, 1, 0, 1, 3, 0), 2, 0)), two(with(knobs(2, 3, 0, 1, 0, 1, 3, 0), 2, 0))},
  };
  // Every field of what is kept, for every row of the three tables.
  const auto expect_kept = [](const Row& r) {
    const MlaSm90Knobs k = mla_sm90_consistent(r.asked, r.heads);
    const std::string at = std::to_string(r.heads) + " heads, pipe " + std::to_string(r.asked.pipe) +
                           " map " + std::to_string(r.asked.map) + " producers " + std::to_string(r.asked.producers);
    EXPECT_EQ(k.cluster, r.kept.cluster) << at;
    EXPECT_EQ(k.pipe, r.kept.pipe) << at;
    EXPECT_EQ(k.dequant, r.kept.dequant) << at;
    EXPECT_EQ(k.sync, r.kept.sync) << at;
    EXPECT_EQ(k.prefetch, r.kept.prefetch) << at;
    EXPECT_EQ(k.ahead, r.kept.ahead) << at;
    EXPECT_EQ(k.map, r.kept.map) << at;
    EXPECT_EQ(k.l1, r.kept.l1) << at;
    EXPECT_EQ(k.rescale, r.kept.rescale) << at;
    EXPECT_EQ(k.phand, r.kept.phand) << at;
    EXPECT_EQ(k.producers, r.kept.producers) << at;
    EXPECT_EQ(k.peer_copy, r.kept.peer_copy) << at;
    EXPECT_EQ(k.seesaw, r.kept.seesaw) << at;
  };
  // The peer's rows by bulk copies: in a cluster with pipes 1-3 and not the token split.
  auto bulk = [](MlaSm90Knobs k, int peer_copy) {
    k.peer_copy = peer_copy;
    return k;
  };
  const Row peer[] = {
      {128, bulk(two(knobs(2, 2, 0, 1, 0, 1, 3, 0)), 1), bulk(two(knobs(2, 2, 0, 1, 0, 1, 3, 0)), 1)},
      {100, bulk(knobs(2, 3, 0, 1, 0, 1, 0, 0), 1), bulk(knobs(2, 3, 0, 1, 0, 1, 0, 0), 1)},
      {128, bulk(knobs(2, 1, 0, 1, 0, 1, 2, 0), 1), bulk(knobs(2, 1, 0, 1, 0, 1, 2, 0), 1)},
      {64, bulk(two(knobs(1, 2, 0, 0, 0, 1, 3, 0)), 1), bulk(two(knobs(1, 2, 0, 0, 0, 1, 3, 0)), 0)},
      {128, bulk(knobs(2, 4, 0, 1, 0, 1, 0, 0), 1), bulk(knobs(2, 4, 0, 1, 0, 1, 0, 0), 0)},
      {128, bulk(knobs(2, 0, 0, 1, 0, 2, 0, 0), 1), bulk(knobs(2, 0, 0, 1, 0, 2, 0, 0), 0)},
      {128, bulk(knobs(2, 2, 0, 1, 0, 1, 1, 0), 1), bulk(knobs(2, 2, 0, 1, 0, 1, 1, 0), 0)},
  };
  for (const Row& r : peer) expect_kept(r);
  // The seesaw consumers: two producers in a cluster with pipes 1 and 2; P's hand-over knob then
  // left at its neutral value.
  auto see = [](MlaSm90Knobs k, int seesaw) {
    k.seesaw = seesaw;
    return k;
  };
  const Row seesaw[] = {
      {128, see(two(with(knobs(2, 2, 0, 1, 0, 1, 3, 0), 2, 1)), 1), see(two(with(knobs(2, 2, 0, 1, 0, 1, 3, 0), 2, 0)), 1)},
      {100, see(two(with(knobs(2, 1, 0, 1, 0, 1, 0, 0), 1, 0)), 2), see(two(with(knobs(2, 1, 0, 1, 0, 1, 0, 0), 1, 0)), 2)},
      {64, see(two(with(knobs(2, 2, 0, 1, 0, 1, 3, 1), 2, 2)), 1), see(two(with(knobs(1, 2, 0, 0, 0, 1, 3, 1), 2, 2)), 0)},
      {128, see(with(knobs(2, 2, 0, 1, 0, 1, 3, 0), 2, 1), 1), see(with(knobs(2, 2, 0, 1, 0, 1, 3, 0), 2, 1), 0)},
      {128, see(two(with(knobs(2, 3, 0, 1, 0, 1, 3, 0), 2, 0)), 1), see(two(with(knobs(2, 3, 0, 1, 0, 1, 3, 0), 2, 0)), 0)},
      {128, see(two(with(knobs(2, 4, 0, 1, 0, 1, 0, 0), 2, 0)), 2), see(two(with(knobs(2, 4, 0, 1, 0, 1, 0, 0), 2, 0)), 0)},
  };
  for (const Row& r : seesaw) expect_kept(r);
  for (const Row& r : producers) {
    EXPECT_EQ(r.kept.producers, 2);
    expect_kept(r);
  }
  for (const Row& r : more) expect_kept(r);
  for (const Row& r : rows) expect_kept(r);
}

// The records staged in the Q tile (Cfg::kStage 1) need its rows 16..63 free (at most 16 heads)
// and the producer written for them (two warpgroups' whole shares in rows, no cluster).
TEST(MlaSm90Knobs, StagedRecordsOnlyWhereTheyFit) {
  struct Row {
    int heads, cluster, producers, pipe, map, kept;
  };
  for (const Row r : {Row{16, 1, 2, 2, 3, 1}, Row{1, 1, 2, 2, 3, 1}, Row{13, 1, 2, 2, 3, 1}, Row{17, 1, 2, 2, 3, 0},
                      Row{64, 1, 2, 2, 3, 0}, Row{16, 1, 1, 2, 3, 0}, Row{16, 1, 2, 1, 3, 0}, Row{16, 1, 2, 4, 0, 0},
                      Row{16, 1, 2, 2, 0, 0}, Row{128, 2, 2, 2, 3, 0}}) {
    MlaSm90Knobs k = mla_sm90_defaults(r.cluster);
    k.producers = r.producers;
    k.pipe = r.pipe;
    k.map = r.map;
    k.stage = 1;
    EXPECT_EQ(mla_sm90_consistent(k, r.heads).stage, r.kept)
        << r.heads << " heads, producers " << r.producers << " pipe " << r.pipe << " map " << r.map;
  }
}

// The heads on N (Cfg::kNarrow 1): one head block of at most 16, consumer 1 reading P from
// shared memory, not the seesaw; any producer.
TEST(MlaSm90Knobs, NarrowConsumerOnlyWhereItFits) {
  struct Row {
    int heads, phand, producers, pipe, kept;
  };
  for (const Row r : {Row{16, 2, 2, 2, 1}, Row{1, 0, 1, 1, 1}, Row{9, 3, 1, 3, 1}, Row{17, 2, 2, 2, 0},
                      Row{64, 2, 2, 2, 0}, Row{16, 1, 1, 1, 0}, Row{128, 2, 2, 2, 0}}) {
    MlaSm90Knobs k = mla_sm90_defaults(r.heads > 64 ? 2 : 1);
    k.phand = r.phand;
    k.producers = r.producers;
    k.pipe = r.pipe;
    k.narrow = 1;
    EXPECT_EQ(mla_sm90_consistent(k, r.heads).narrow, r.kept) << r.heads << " heads, phand " << r.phand;
  }
}

// No bf16 tile (Cfg::kDirect 1..3): one head block of at most 16 without a cluster; the kernel has
// its own producer and consumers, so whatever else was asked goes back to the neutral knobs
// (one producer warpgroup: 384 threads), the timeline kept.
TEST(MlaSm90Knobs, DirectOnlyWhereItFits) {
  for (const int heads : {1, 5, 13, 16, 17, 64, 128}) {
    MlaSm90Knobs k = mla_sm90_defaults(heads > 64 ? 2 : 1, heads);
    k.direct = 1 + heads % 3;
    k.stamp = 2;
    const MlaSm90Knobs kept = mla_sm90_consistent(k, heads);
    EXPECT_EQ(kept.direct, heads <= 16 ? k.direct : 0) << heads << " heads";
    if (heads > 16) continue;
    const MlaSm90Knobs neutral = mla_sm90_consistent(MlaSm90Knobs{}, 64);
    EXPECT_EQ(kept.producers, 1);
    EXPECT_EQ(kept.cluster, 1);
    EXPECT_EQ(kept.stage, 0);
    EXPECT_EQ(kept.narrow, 0);
    EXPECT_EQ(kept.pipe, 0);
    EXPECT_EQ(kept.map, 0);
    EXPECT_EQ(kept.stamp, 2);
    EXPECT_EQ(kept.rescale, neutral.rescale);
    // Applied twice, the same knobs (the key is stable).
    const MlaSm90Knobs again = mla_sm90_consistent(kept, heads);
    EXPECT_EQ(again.direct, k.direct);
    EXPECT_EQ(again.pipe, kept.pipe);
    EXPECT_EQ(again.producers, kept.producers);
  }
}

// The plan's keys: the names the results and caches know, the environment's overrides in range
// only, and the Cfg prologue carrying every knob.
TEST(MlaSm90Knobs, DefaultsByClusterSize) {
  struct Row {
    int cluster, pipe, ahead, phand, producers, map;
  };
  // Both: two producers' whole-share round in whole-row pieces, prefetching one block ahead;
  // without a cluster P handed over after P V and the gather allocating in L1, in one P in
  // consumer 1's registers.
  for (const Row r : {Row{1, 2, 1, 2, 2, 3}, Row{2, 2, 1, 1, 2, 3}}) {
    const MlaSm90Knobs k = mla_sm90_defaults(r.cluster);
    EXPECT_EQ(k.stage, 0);
    EXPECT_EQ(k.narrow, 0);
    EXPECT_EQ(k.cluster, r.cluster);
    EXPECT_EQ(k.pipe, r.pipe) << r.cluster;
    EXPECT_EQ(k.map, r.map) << r.cluster;
    EXPECT_EQ(k.ahead, r.ahead) << r.cluster;
    EXPECT_EQ(k.phand, r.phand) << r.cluster;
    EXPECT_EQ(k.producers, r.producers) << r.cluster;
    const MlaSm90Knobs base;
    EXPECT_EQ(k.rescale, base.rescale);
    EXPECT_EQ(k.sync, base.sync);
    EXPECT_EQ(k.dequant, base.dequant);
    EXPECT_EQ(k.l1, r.cluster == 2 ? 0 : 1);
    EXPECT_EQ(k.peer_copy, 0);
    // The defaults are a combination the kernel builds.
    const MlaSm90Knobs kept = mla_sm90_consistent(k, r.cluster == 2 ? 128 : 64);
    EXPECT_EQ(kept.pipe, k.pipe);
    EXPECT_EQ(kept.ahead, k.ahead);
    EXPECT_EQ(kept.phand, k.phand);
    EXPECT_EQ(kept.producers, k.producers);
    EXPECT_EQ(kept.map, k.map);
  }
}

// At 16 heads or fewer (one head block): the kernel without the bf16 tile (Cfg::kDirect 3: 16-byte
// copies, alternating consumers), every other knob neutral once made consistent; from 17 heads on
// the producers' and consumers' plan without it.
TEST(MlaSm90Knobs, DefaultsBySixteenHeadsOrFewer) {
  for (int heads : {1, 5, 8, 13, 16, 17, 32, 64}) {
    const MlaSm90Knobs k = mla_sm90_defaults(1, heads);
    const int want = heads <= 16 ? 3 : 0;
    EXPECT_EQ(k.direct, want) << heads;
    EXPECT_EQ(k.narrow, 0) << heads;
    EXPECT_EQ(k.stage, 0) << heads;
    const MlaSm90Knobs kept = mla_sm90_consistent(k, heads);
    EXPECT_EQ(kept.direct, want) << heads;
    EXPECT_EQ(kept.producers, heads <= 16 ? 1 : 2) << heads;
    EXPECT_EQ(kept.pipe, heads <= 16 ? 0 : 2) << heads;
    if (heads > 16) EXPECT_EQ(kept.phand, k.phand) << heads;
  }
  EXPECT_EQ(mla_sm90_defaults(2, 16).direct, 0);  // a cluster is never asked for 16 heads
}

TEST(MlaSm90Knobs, KeysFromTheEnvironment) {
  if (!kMlaSm90KernelEnabled) GTEST_SKIP() << "the sm90 MLA kernel is not enabled in this build";
  const char* vars[] = {"DECA_MLA_CLUSTER", "DECA_MLA_PIPE", "DECA_MLA_DEQUANT", "DECA_MLA_SYNC",
                        "DECA_MLA_PREFETCH", "DECA_MLA_AHEAD", "DECA_MLA_MAP", "DECA_MLA_L1",
                        "DECA_MLA_RESCALE", "DECA_MLA_PHAND", "DECA_MLA_PRODUCERS", "DECA_MLA_PEERCOPY",
                        "DECA_MLA_STAGE", "DECA_MLA_NARROW", "DECA_MLA_DIRECT"};
  for (const char* v : vars) unsetenv(v);
  MlaConfig c;
  c.sparse = true, c.topk = 2048, c.page_size = 64, c.checked = false;
  c.num_heads = 128;
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_c2_pipe2_sync1_ahead1_map3_pr1_w2_sm90");
  c.num_heads = 64;
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_pipe2_ahead1_map3_l1e1_pr2_w2_sm90");
  EXPECT_EQ(mla_decode_shape(mla_decode_key(90, "sm90", c)).threads, 512);
  // 16 heads: the kernel without the bf16 tile (direct3) by default, 384 threads; another of its
  // variants, or off (the staged records and the heads on N then as asked).
  c.num_heads = 16;
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_direct3_sm90");
  EXPECT_NE(mla_decode_key(90, "sm90", c).spec().source.find("kDirect = 3;"), std::string::npos);
  EXPECT_EQ(mla_decode_shape(mla_decode_key(90, "sm90", c)).threads, 384);
  setenv("DECA_MLA_DIRECT", "1", 1);
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_direct1_sm90");
  setenv("DECA_MLA_DIRECT", "0", 1);
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_pipe2_ahead1_map3_l1e1_pr2_w2_sm90");
  setenv("DECA_MLA_STAGE", "1", 1);
  setenv("DECA_MLA_NARROW", "1", 1);
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(),
            "mla_sparse_decode_sm90_p64_pipe2_ahead1_map3_l1e1_pr2_w2_stage_narrow_sm90");
  EXPECT_NE(mla_decode_key(90, "sm90", c).spec().source.find("kStage = 1;"), std::string::npos);
  EXPECT_NE(mla_decode_key(90, "sm90", c).spec().source.find("kNarrow = 1;"), std::string::npos);
  unsetenv("DECA_MLA_DIRECT");
  c.num_heads = 17;  // one head block of 17: none of the three
  setenv("DECA_MLA_DIRECT", "3", 1);
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_pipe2_ahead1_map3_l1e1_pr2_w2_sm90");
  unsetenv("DECA_MLA_DIRECT");
  unsetenv("DECA_MLA_STAGE");
  unsetenv("DECA_MLA_NARROW");
  c.num_heads = 65;
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_c2_pipe2_sync1_ahead1_map3_pr1_w2_sm90");
  EXPECT_EQ(mla_decode_shape(mla_decode_key(90, "sm90", c)).threads, 512);
  c.num_heads = 64;
  setenv("DECA_MLA_PRODUCERS", "1", 1);
  setenv("DECA_MLA_PIPE", "3", 1);
  setenv("DECA_MLA_DEQUANT", "1", 1);
  setenv("DECA_MLA_AHEAD", "9", 1);  // out of range: ignored
  setenv("DECA_MLA_L1", "yes", 1);   // not a digit: ignored
  setenv("DECA_MLA_PREFETCH", "3", 1);
  const MlaKernelKey k = mla_decode_key(90, "sm90", c);
  EXPECT_EQ(k.name(), "mla_sparse_decode_sm90_p64_pipe3_deq1_pf3_ahead1_l1e1_pr2_sm90");
  setenv("DECA_MLA_RESCALE", "0", 1);  // away from the default: named
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_pipe3_deq1_pf3_ahead1_l1e1_rs0_pr2_sm90");
  unsetenv("DECA_MLA_RESCALE");
  setenv("DECA_MLA_PRODUCERS", "2", 1);  // two producers: the hardware conversions, the rows
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_pipe3_pf3_ahead1_map3_l1e1_pr2_w2_sm90");
  setenv("DECA_MLA_PEERCOPY", "1", 1);  // no cluster at 64 heads: nothing crosses, left out
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_pipe3_pf3_ahead1_map3_l1e1_pr2_w2_sm90");
  c.num_heads = 128;
  EXPECT_EQ(mla_decode_key(90, "sm90", c).name(), "mla_sparse_decode_sm90_p64_c2_pipe3_sync1_pf3_ahead1_map3_w2_bulk_sm90");
  c.num_heads = 64;
  unsetenv("DECA_MLA_PEERCOPY");
  EXPECT_EQ(mla_decode_shape(mla_decode_key(90, "sm90", c)).threads, 512);
  setenv("DECA_MLA_PRODUCERS", "1", 1);
  EXPECT_EQ(mla_decode_shape(k).threads, 384);
  const std::string src = k.spec().source;
  for (const char* field : {"kPageSize = 64;", "kCluster = 1;", "kPipe = 3;", "kDequant = 1;", "kSync = 0;",
                            "kPrefetch = 3;", "kAhead = 1;", "kMap = 0;", "kL1 = 1;", "kRescale = 2;",
                            "kPHand = 2;", "kProducers = 1;", "kPeerCopy = 0;"}) {
    EXPECT_NE(src.find(field), std::string::npos) << field << " in\n" << src;
  }
  for (const char* v : vars) unsetenv(v);
}

TEST(MlaNvrtc, PortableOnAnythingButSm90) {
  EXPECT_EQ(mla_decode_variant(80), "portable");
  EXPECT_EQ(mla_decode_variant(89), "portable");
  EXPECT_EQ(mla_decode_variant(100), "portable");
  if (!kMlaSm90KernelEnabled) EXPECT_EQ(mla_decode_variant(90), "portable");
}

}  // namespace
}  // namespace deca::cuda
