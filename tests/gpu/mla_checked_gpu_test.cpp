// Checked mode of the MLA sparse decode on the GPU (issue 9): sparse indices outside
// [-1, num_blocks * page_size) and topk_length entries outside [0, topk], planted in device
// memory, are skipped (clamped) exactly as the unchecked kernel does, every output is the
// reference's for the inputs so read, and check_mla_run raises the deca::Error naming the entry,
// then finds the record cleared. Each case runs the portable checked kernel and, on Hopper, the
// sm90 kernels' checked builds (what a checked plan runs there: the direct kernel at 16 heads, the wide
// kernel at 64, the cluster of 2 at 128): both must give the same error (the same record) and
// outputs that match the reference. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "deca/error.hpp"
#include "gpu/mla_sparse_gpu_runner.hpp"

namespace deca::test {
namespace {

MlaCaseSpec checked_spec(int heads) {
  MlaCaseSpec s;
  s.num_heads = heads;
  s.q_len = 2;
  s.topk = 256;
  s.page_size = 64;
  s.batch = 3;
  s.pool_blocks = 16;
  s.topk_length = true;
  s.attn_sink = true;
  return s;
}

// Runs the case as it stands on a checked plan of `variant`'s checked kernel; returns what
// check_mla_run raised ("" if nothing) and checks that a second check finds the record cleared.
std::string run_checked(MlaSparseCase& c, HostTensor& out, HostTensor& lse, const std::string& variant) {
  ScopedCheckedKernel scoped(variant);
  MlaConfig cfg = sparse_config(c.spec, Device::cuda(0));
  EXPECT_TRUE(cfg.checked) << "the tests' default (tests/common/checked_on.cpp)";
  DeviceSparse dev(c);
  expect_checked_kernel(dev.plan, variant);
  dev.run();
  dev.results(c, out, lse, /*expect_clean=*/false);
  std::string error;
  try {
    check_mla_run(dev.plan, dev.workspace.get(), nullptr);
  } catch (const Error& e) {
    error = e.what();
  }
  try {
    check_mla_run(dev.plan, dev.workspace.get(), nullptr);
  } catch (const Error& e) {
    ADD_FAILURE() << "the record was not cleared: " << e.what();
  }
  return error;
}

int* index_at(MlaSparseCase& c, int b, int i, int k) {
  return c.indices.data<int>() + (static_cast<std::int64_t>(b) * c.spec.q_len + i) * c.spec.topk + k;
}

// Request 0's last counted entry on its second token made bad (`which`: the pool's size, -2 or
// INT_MAX) on variant's checked kernel at `heads`: skipped as -1 is, and reported by name.
void expect_bad_index_reported(const std::string& variant, int heads, const std::string& which, int seed) {
  auto rng = make_rng(seed);
  MlaSparseCase c = build_mla_sparse_case(checked_spec(heads), rng);
  add_sparse_edges(c, SparseEdges{});
  const int pool = c.spec.pool_blocks * c.spec.page_size;
  const int len0 = c.topk_length.data<int>()[0];
  const int i = 1, k = len0 - 1;
  // The expectation: the entry skipped, as -1 is.
  *index_at(c, 0, i, k) = -1;
  run_reference(c);
  const int bad = which == "pool" ? pool : (which == "int_max" ? INT_MAX : -2);
  *index_at(c, 0, i, k) = bad;
  HostTensor out, lse;
  const std::string error = run_checked(c, out, lse, variant);
  const std::string at = variant + " h" + std::to_string(heads) + " " + which;
  EXPECT_EQ(error, "mla_decode_sparse: indices[0][1][" + std::to_string(k) +
                       "]: expected -1 or a token id in [0, " + std::to_string(pool) +
                       ") (num_blocks * page_size), got " + std::to_string(bad) +
                       " (found by the checked GPU run)")
      << at;
  expect_sparse_matches("checked/" + at, c, out, lse);
}

// Request 1's topk_length made `bad_len` (topk is 256) on variant's checked kernel at `heads`:
// clamped to [0, topk] as the kernels do, and reported by name.
void expect_bad_length_reported(const std::string& variant, int heads, int bad_len) {
  auto rng = make_rng(710 + (bad_len > 0));
  MlaSparseCase c = build_mla_sparse_case(checked_spec(heads), rng);
  // The expectation: the length clamped; set before the edges so that the tokens it counts are
  // not poisoned.
  int& len1 = c.topk_length.data<int>()[1];
  len1 = bad_len > 0 ? c.spec.topk : 0;
  add_sparse_edges(c, SparseEdges{});
  run_reference(c);
  len1 = bad_len;
  HostTensor out, lse;
  const std::string error = run_checked(c, out, lse, variant);
  const std::string at = variant + " h" + std::to_string(heads) + " topk_length " + std::to_string(bad_len);
  EXPECT_EQ(error, "mla_decode_sparse: topk_length[1]: expected a length in [0, " + std::to_string(c.spec.topk) +
                       "] (topk), got " + std::to_string(bad_len) + " (found by the checked GPU run)")
      << at;
  expect_sparse_matches("checked/" + at, c, out, lse);
}

TEST(MlaCheckedGpu, BadIndexIsSkippedAndReported) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    for (int heads : {16, 64, 128}) {
      int salt = 0;
      for (const char* which : {"pool", "below_minus_one", "int_max"}) {
        expect_bad_index_reported(variant, heads, which, 700 + ++salt);
      }
    }
  }
}

TEST(MlaCheckedGpu, BadTopkLengthIsClampedAndReported) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    for (int heads : {16, 64, 128}) {
      for (int bad_len : {300, -4}) expect_bad_length_reported(variant, heads, bad_len);  // topk is 256
    }
  }
}

// Valid inputs: each variant's checked kernel writes its unchecked kernel's bytes.
TEST(MlaCheckedGpu, ValidInputsGiveTheUncheckedBytes) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    for (int heads : {16, 64, 128}) {
      auto rng = make_rng(720);
      MlaSparseCase c = build_mla_sparse_case(checked_spec(heads), rng);
      add_sparse_edges(c, SparseEdges{});
      HostTensor out_c, lse_c, out_u, lse_u;
      EXPECT_EQ(run_checked(c, out_c, lse_c, variant), "");
      {
        ScopedMlaKernel unchecked(variant);
        setenv("DECA_CHECKED", "0", 1);  // restored by `unchecked`'s destructor
        DeviceSparse dev(c);
        EXPECT_EQ(dev.plan.kernel_name.find("_chk"), std::string::npos) << dev.plan.kernel_name;
        dev.run();
        dev.results(c, out_u, lse_u);
      }
      const std::string at = variant + " h" + std::to_string(heads);
      EXPECT_EQ(0, std::memcmp(out_c.raw(), out_u.raw(), out_c.bytes())) << at;
      EXPECT_EQ(0, std::memcmp(lse_c.raw(), lse_u.raw(), lse_c.bytes())) << at;
    }
  }
}

}  // namespace
}  // namespace deca::test
