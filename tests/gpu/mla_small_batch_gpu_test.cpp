// Small batches and single long requests (issue 31's b1 h128 32768 and b4 h16 16384 rows) and the
// LSE of rows without a valid key, on the GPU through the public API:
//  - the split combine (a plan's choice for a few requests cut into many pieces each,
//    src/plan/mla_combine.hpp) writes the warp-per-row combine's bytes, output and LSE, for cut
//    dense and sparse requests of every decode variant: the same inputs under a plan of the
//    case's batch (the split combine) and one of max_batch 64 (the other); it matches the CPU
//    reference, runs to the same bytes twice and replays in a CUDA graph;
//  - plans with MlaConfig::lse_of_empty_row kPosInf write +inf exactly where the default plans
//    write -inf (empty requests, query tokens before their first key, index rows of -1 only,
//    requests cut over many partitions with no key at all: the combine's write) and the same
//    bytes everywhere else, under both combines.
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

namespace deca::test {
namespace {

constexpr const char* kSplitName = "+mla_sparse_combine_split";

// A plan's max_batch that keeps it on the warp-per-row combine: 64 requests average at most 3
// pieces on 132 partitions.
constexpr int kManyRequests = 64;

// A device run of `c` whose plan takes the split combine (`split`: max_batch = the case's batch,
// whose requests that plan cuts into 16 or more pieces each; every case below is chosen so) or
// the warp-per-row one (max_batch kManyRequests). Both schedule the run's batch alike, so their
// decode kernels write the same partials.
template <class Run, class Case>
std::unique_ptr<Run> make_run(Case& c, bool split) {
  c.spec.max_batch = split ? 0 : kManyRequests;
  auto run = std::make_unique<Run>(c);
  c.spec.max_batch = 0;
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

// Each row's plan of max_batch = batch takes the split combine (pieces a request, from the
// longest length, on 132 SMs): 65, 33, 21, 21, 63, 32, 24.
const std::vector<DenseRow>& dense_rows() {
  static const std::vector<DenseRow> rows = {
      {"b1_h128_32768", 128, 1, {32768}, kMlaKvBF16},
      {"b4_h16_16384", 16, 1, {16384, 16384, 16384, 16384}, kMlaKvBF16},
      {"b3_h100_ragged", 100, 1, {0, 1, 9000}, kMlaKvFP8E4M3},
      {"b3_h64_q2_ragged", 64, 2, {0, 1, 9000}, kMlaKvBF16},
      {"b2_h16_fp8_sparse", 16, 1, {20000, 3}, kMlaKvFP8Sparse},
      {"b1_h64_q4", 64, 4, {12000}, kMlaKvBF16},
      {"b5_h64", 64, 1, {2, 5000, 64, 65, 12000}, kMlaKvBF16},
  };
  return rows;
}

TEST(MlaCombineSplit, DenseBitwiseTheDefaultCombine) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
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
// request), a row of -1 only, poisoned unused tokens; 16 heads (the direct kernel) at q_len 1 and
// 2, 64 (the wide kernel) at 2, 128 (the cluster) at 1: 32, 19, 19 and 19 pieces a request (at 128
// heads and q_len 2, 33 partitions cut three requests 10 ways: the warp-per-row combine's case).
TEST(MlaCombineSplit, SparseBitwiseTheDefaultCombine) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  struct Shape {
    int heads, q_len;
  };
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    for (const Shape sh : {Shape{16, 1}, Shape{16, 2}, Shape{64, 2}, Shape{128, 1}}) {
      auto rng = make_rng(500 + sh.heads + sh.q_len);
      MlaSparseCase c = build_mla_sparse_case(long_sparse_spec(sh.heads, sh.q_len), rng);
      add_sparse_edges(c, SparseEdges{});
      run_reference(c);
      expect_split_is_default<DeviceSparse>(variant + "/sparse_h" + std::to_string(sh.heads) + "_q" +
                                                std::to_string(sh.q_len),
                                            c);
      if (HasFatalFailure()) return;
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

// The +inf plans against the default ones on the same inputs, under the warp-per-row combine and
// (`with_split`: a case whose plan of max_batch = batch takes it) the split one.
template <class Run, class Case>
void expect_plus_inf_plan(const std::string& what, Case& c, int min_empty, bool with_split) {
  for (bool split : {false, true}) {
    if (split && !with_split) continue;
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
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    for (int heads : {16, 128}) {
      // Dense, q_len 3: request 0 empty (3 rows), request 1 of one token (2 rows before it),
      // request 2 of two (1 row), request 3 cut over the partitions (4 requests on 44 or 22
      // partitions: the warp-per-row combine only).
      auto rng = make_rng(700 + heads);
      MlaDenseCase d = build_mla_dense_case(dense_spec(heads, 3, {0, 1, 2, 30000}, kMlaKvBF16), rng);
      expect_plus_inf_plan<DeviceDense>(variant + "/dense_h" + std::to_string(heads), d, 6 * heads, false);
      // Dense under both combines: request 0 empty, request 1 of one token (at q_len 2 a row
      // before it), request 2 cut 22 ways (q_len 2 at 16 heads, 1 at 128: 66 partitions).
      const int q_len = heads == 16 ? 2 : 1;
      MlaDenseCase d2 = build_mla_dense_case(dense_spec(heads, q_len, {0, 1, 30000}, kMlaKvBF16), rng);
      expect_plus_inf_plan<DeviceDense>(variant + "/dense_split_h" + std::to_string(heads), d2,
                                        (q_len + q_len - 1) * heads, true);
      // Sparse: request 1's first token all -1 (8192 indices: cut, every piece empty, so the
      // combine writes its LSE), the last request's topk_length 0.
      MlaSparseCase c = build_mla_sparse_case(long_sparse_spec(heads, 1), rng);
      add_sparse_edges(c, SparseEdges{});
      c.topk_length.data<int>()[1] = c.spec.topk;
      c.bind();
      expect_plus_inf_plan<DeviceSparse>(variant + "/sparse_h" + std::to_string(heads), c, 2 * heads, true);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace deca::test
