// Small batches and single long requests (issue 31's b1 h128 32768 and b4 h16 16384 rows) and the
// LSE of rows without a valid key, on the GPU through the public API:
//  - the split combine (DECA_MLA_COMBINE=split, pending its first GPU round) writes the default
//    combine's bytes, output and LSE, for cut dense and sparse requests of every decode variant
//    (dense: the split consumers too, DECA_MLA_DENSE_CONSUMERS=split); it matches the CPU reference, runs to the same bytes twice and replays in a CUDA graph;
//  - plans with MlaConfig::lse_of_empty_row kPosInf write +inf exactly where the default plans
//    write -inf (empty requests, query tokens before their first key, index rows of -1 only,
//    requests cut over many partitions with no key at all: the combine's write) and the same
//    bytes everywhere else, under both combines (dense: the split consumers too).
// Skips itself without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/mla_case.hpp"
#include "common/mla_lse_empty.hpp"
#include "common/test_seed.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/mla_dense_gpu_runner.hpp"
#include "gpu/mla_sparse_gpu_runner.hpp"
#include "jit/scoped_env.hpp"

namespace deca::test {
namespace {

constexpr const char* kSplitName = "+mla_sparse_combine_split";

// A device run made with DECA_MLA_COMBINE=split (`split`) or unset: the plan, made in the
// constructor, keeps its combine whatever the variable says later.
template <class Run, class Case>
std::unique_ptr<Run> make_run(Case& c, bool split) {
  jit::testing::ScopedEnv env("DECA_MLA_COMBINE", split ? "split" : nullptr);
  auto run = std::make_unique<Run>(c);
  EXPECT_EQ(run->plan.kernel_name.find(kSplitName) != std::string::npos, split) << run->plan.kernel_name;
  return run;
}

template <class Run, class Case>
void run_once(Run& dev, const Case& c, HostTensor& out, HostTensor& lse) {
  dev.poison();
  dev.run();
  dev.results(c, out, lse);
}

// The default and the split combine on `c` (its reference computed): bitwise the same, and the
// split one within the reference's bounds and the same run to run.
template <class Run, class Case>
void expect_split_is_default(const std::string& what, Case& c) {
  auto plain = make_run<Run>(c, false);
  auto split = make_run<Run>(c, true);
  HostTensor out0, lse0, out1, lse1;
  run_once(*plain, c, out0, lse0);
  run_once(*split, c, out1, lse1);
  const std::string name = what + " (" + split->plan.kernel_name + ")";
  expect_sparse_matches(name, c, out1, lse1);
  EXPECT_EQ(0, std::memcmp(out0.raw(), out1.raw(), out0.bytes())) << name << ": out";
  EXPECT_EQ(0, std::memcmp(lse0.raw(), lse1.raw(), lse0.bytes())) << name << ": lse";
  expect_run_to_run_identical(name, *split, c);
}

MlaCaseSpec dense_spec(int heads, int q_len, std::vector<int> lens, int format) {
  MlaCaseSpec s;
  s.batch = static_cast<int>(lens.size());
  s.q_len = q_len;
  s.num_heads = heads;
  s.seq_lens = std::move(lens);
  s.kv_format = format;
  return s;
}

struct DenseRow {
  const char* name;
  int heads, q_len;
  std::vector<int> lens;
  int format;
};

const std::vector<DenseRow>& dense_rows() {
  static const std::vector<DenseRow> rows = {
      {"b1_h128_32768", 128, 1, {32768}, kMlaKvBF16},
      {"b4_h16_16384", 16, 1, {16384, 16384, 16384, 16384}, kMlaKvBF16},
      {"b3_h100_q2_ragged", 100, 2, {0, 1, 9000}, kMlaKvFP8E4M3},
      {"b2_h16_fp8_sparse", 16, 1, {20000, 3}, kMlaKvFP8Sparse},
      {"b5_h64_q4", 64, 4, {2, 5000, 64, 65, 12000}, kMlaKvBF16},
  };
  return rows;
}

TEST(MlaCombineSplit, DenseBitwiseTheDefaultCombine) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_dense_variants()) {
    ScopedMlaKernel scoped(variant);
    std::uint64_t salt = 0;
    for (const DenseRow& r : dense_rows()) {
      auto rng = make_rng(400 + ++salt);
      MlaDenseCase c = build_mla_dense_case(dense_spec(r.heads, r.q_len, r.lens, r.format), rng);
      run_dense_reference(c);
      expect_split_is_default<DeviceDense>(variant + "/" + r.name, c);
      if (HasFatalFailure()) return;
    }
  }
}

// Three requests of 8192 indices (cut over the partitions) with topk_length and sinks.
MlaCaseSpec long_sparse_spec(int heads, int q_len) {
  MlaCaseSpec s;
  s.batch = 3;
  s.q_len = q_len;
  s.num_heads = heads;
  s.topk = 8192;
  s.pool_blocks = 160;
  s.topk_length = true;
  s.attn_sink = true;
  return s;
}

// Sparse requests of 8192 indices cut over the partitions: sinks, ragged topk_length (an empty
// request), a row of -1 only, poisoned unused tokens; q_len 1 and 2, 16 heads (the direct kernel)
// and 128 (the cluster).
TEST(MlaCombineSplit, SparseBitwiseTheDefaultCombine) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    for (int heads : {16, 128}) {
      for (int q_len : {1, 2}) {
        auto rng = make_rng(500 + heads + q_len);
        MlaSparseCase c = build_mla_sparse_case(long_sparse_spec(heads, q_len), rng);
        add_sparse_edges(c, SparseEdges{});
        run_reference(c);
        expect_split_is_default<DeviceSparse>(variant + "/sparse_h" + std::to_string(heads) + "_q" +
                                                  std::to_string(q_len),
                                              c);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Captured once, replayed with new lengths (shorter only: longer would read slots the case
// poisoned), so that the replay cuts the requests at other places.
TEST(MlaCombineSplit, GraphReplayWithNewLengths) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    auto rng = make_rng(601);
    MlaDenseCase c = build_mla_dense_case(dense_spec(128, 1, {30000, 9000, 5}, kMlaKvBF16), rng);
    auto dev = make_run<DeviceDense>(c, true);
    expect_graph_replay_matches(variant + "/split combine, graph", *dev, c, [&] {
      c.seq_lens.data<int>()[0] = 3000;
      c.seq_lens.data<int>()[1] = 8999;
      c.seq_lens.data<int>()[2] = 0;
      dev->seq_lens.from_host(c.seq_lens);
      run_dense_reference(c);
    }, 4e-3);
  }
}

// The +inf plans against the default ones on the same inputs, under both combines.
template <class Run, class Case>
void expect_plus_inf_plan(const std::string& what, Case& c, int min_empty) {
  for (bool split : {false, true}) {
    c.spec.lse_empty = kMlaLseEmptyNegInf;
    auto neg = make_run<Run>(c, split);
    c.spec.lse_empty = kMlaLseEmptyPosInf;
    auto pos = make_run<Run>(c, split);
    EXPECT_NE(pos->plan.kernel_name.find("_lsepinf"), std::string::npos) << pos->plan.kernel_name;
    HostTensor out0, lse0, out1, lse1;
    run_once(*neg, c, out0, lse0);
    run_once(*pos, c, out1, lse1);
    const std::string name = what + " (" + pos->plan.kernel_name + ")";
    EXPECT_GE(expect_lse_conventions_agree(name, out0, lse0, out1, lse1), min_empty) << name;
  }
  c.spec.lse_empty = kMlaLseEmptyNegInf;
}

TEST(MlaLseEmptyGpu, PlusInfOnlyForRowsWithoutKeys) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_dense_variants()) {
    ScopedMlaKernel scoped(variant);
    for (int heads : {16, 128}) {
      // Dense, q_len 3: request 0 empty (3 rows), request 1 of one token (2 rows before it),
      // request 2 of two (1 row), request 3 cut over the partitions.
      auto rng = make_rng(700 + heads);
      MlaDenseCase d = build_mla_dense_case(dense_spec(heads, 3, {0, 1, 2, 30000}, kMlaKvBF16), rng);
      expect_plus_inf_plan<DeviceDense>(variant + "/dense_h" + std::to_string(heads), d, 6 * heads);
      if (variant == "sm90_split") continue;  // the split consumers are dense only
      // Sparse: request 1's first token all -1 (8192 indices: cut, every piece empty, so the
      // combine writes its LSE), the last request's topk_length 0.
      MlaSparseCase c = build_mla_sparse_case(long_sparse_spec(heads, 1), rng);
      add_sparse_edges(c, SparseEdges{});
      c.topk_length.data<int>()[1] = c.spec.topk;
      c.bind();
      expect_plus_inf_plan<DeviceSparse>(variant + "/sparse_h" + std::to_string(heads), c, 2 * heads);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace deca::test
