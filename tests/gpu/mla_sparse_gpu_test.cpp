// MLA sparse FP8 decode on the GPU against the CPU reference (docs/semantics.md; issue 7 item 6),
// for every decode variant this machine runs (DECA_MLA_KERNEL): heads 1..128 (1, 3,
// 24, 100 and 127 among them), q_len 1..4, topk 64..4096 and counts no multiple of 64, ragged
// topk_length with an empty request, -1 holes and a whole row of -1, duplicates, an index in the
// last page, the sink on and off, page sizes 1..128 (7 and 48 among them); never-indexed tokens
// and a spare block poisoned with NaN, outputs poisoned before each run.
// Then bitwise run-to-run identity, CUDA graph capture + replay, and the workspace checks.
// Seed: DECA_TEST_SEED. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <string>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/test_seed.hpp"
#include "deca/error.hpp"
#include "gpu/mla_sparse_gpu_runner.hpp"

namespace deca::test {
namespace {

struct Case {
  std::string name;
  MlaCaseSpec spec;
};

MlaCaseSpec spec(int heads, int q_len, int topk, int page, int batch) {
  MlaCaseSpec s;
  s.num_heads = heads;
  s.q_len = q_len;
  s.topk = topk;
  s.page_size = page;
  s.batch = batch;
  // A pool a few times larger than one row's picks, so most tokens stay unindexed (poisoned).
  const int tokens = std::max(4 * topk, 256);
  s.pool_blocks = (tokens + page - 1) / page;
  s.duplicates = 3;
  return s;
}

std::vector<Case> matrix() {
  std::vector<Case> m;
  auto add = [&](std::string name, MlaCaseSpec s) { m.push_back({std::move(name), s}); };
  for (int heads : {8, 16, 24, 64, 100, 128}) {
    for (int q_len : {1, 2, 4}) {
      MlaCaseSpec s = spec(heads, q_len, 128, 64, 3);
      s.topk_length = true;
      s.attn_sink = q_len == 2;
      add("h" + std::to_string(heads) + "_q" + std::to_string(q_len) + "_k128", s);
    }
  }
  for (int topk : {64, 2048, 4096}) {
    for (int heads : {16, 128}) {
      MlaCaseSpec s = spec(heads, 1, topk, 64, 4);
      s.topk_length = topk != 64;
      s.attn_sink = heads == 128;
      add("h" + std::to_string(heads) + "_k" + std::to_string(topk), s);
    }
  }
  // Odd shapes: one head, three, 127 (a cluster of two CTAs, the second with 63 rows), q_len 3,
  // topk no multiple of 64 (a partial last block), page sizes that are not powers of two.
  struct Odd {
    int heads, q_len, topk, page;
  };
  for (const Odd o : {Odd{1, 3, 100, 48}, Odd{3, 1, 200, 7}, Odd{127, 3, 100, 64}}) {
    MlaCaseSpec s = spec(o.heads, o.q_len, o.topk, o.page, 3);
    s.topk_length = o.heads != 3;
    s.attn_sink = o.heads != 1;
    add("odd_h" + std::to_string(o.heads) + "_q" + std::to_string(o.q_len) + "_k" + std::to_string(o.topk) +
            "_p" + std::to_string(o.page),
        s);
  }
  for (int page : {1, 16, 32, 128}) {
    MlaCaseSpec s = spec(64, 2, 256, page, 3);
    s.topk_length = page != 32;
    s.attn_sink = page == 1;
    add("p" + std::to_string(page), s);
  }
  {
    MlaCaseSpec s = spec(64, 1, 2048, 64, 1);  // one request over every partition
    add("b1_k2048", s);
    MlaCaseSpec many = spec(128, 1, 128, 64, 40);  // many small requests per partition
    many.topk_length = true;
    many.attn_sink = true;
    add("b40_k128", many);
    // 6000 requests: the scheduler's state outgrows 48 KB of shared memory and it walks in
    // global memory instead (kernels/mla/schedule/entry.cuh).
    MlaCaseSpec huge = spec(8, 1, 64, 16, 6000);
    huge.topk_length = true;
    add("b6000_global_schedule", huge);
    MlaCaseSpec nolse = spec(16, 2, 192, 64, 2);
    nolse.lse = false;
    add("no_lse", nolse);
  }
  return m;
}

TEST(MlaSparseGpu, MatchesCpuReference) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    std::uint64_t salt = 0;
    for (const Case& k : matrix()) {
      auto rng = make_rng(++salt);
      MlaSparseCase c = build_mla_sparse_case(k.spec, rng);
      add_sparse_edges(c, SparseEdges{});
      run_reference(c);
      DeviceSparse dev(c);
      dev.run();
      HostTensor out, lse;
      dev.results(c, out, lse);
      expect_sparse_matches(variant + "/" + k.name + " (" + dev.plan.kernel_name + ")", c, out,
                            lse);
      if (HasFatalFailure()) return;
    }
  }
}

// The output as a strided view (a padded head row, as a slice of a wider buffer): pads of 8 and 24
// bf16 (rows 16-byte aligned, as the API requires: the sm90 kernel writes final rows as 16-byte
// units through shared memory); the pad between rows keeps its poison. A pad of 4 is refused
// before anything is written. Cluster (128 heads) and single-CTA (16) shapes, unsplit requests
// and split ones (b1: one request over every partition).
TEST(MlaSparseGpu, StridedOutputRows) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    std::uint64_t salt = 100;
    for (const int heads : {128, 16}) {
      for (const int batch : {3, 1}) {
        for (const int pad : {8, 24, 4}) {
          auto rng = make_rng(++salt);
          MlaCaseSpec sp = spec(heads, 2, batch == 1 ? 2048 : 256, 64, batch);
          sp.attn_sink = true;
          MlaSparseCase c = build_mla_sparse_case(sp, rng);
          add_sparse_edges(c, SparseEdges{});
          run_reference(c);
          DeviceSparse dev(c);
          const std::int64_t row = 512 + pad;
          const std::int64_t rows = static_cast<std::int64_t>(batch) * 2 * heads;
          DeviceBuffer wide(static_cast<std::size_t>(rows * row) * 2);
          wide.fill(0xFF);
          dev.args.out = make_tensor(wide.get(), DType::kBF16, {batch, 2, heads, 512},
                                     {2 * heads * row, heads * row, row, 1}, Device::cuda(0));
          const std::string what = variant + "/h" + std::to_string(heads) + "_b" + std::to_string(batch) +
                                   "_pad" + std::to_string(pad) + " (" + dev.plan.kernel_name + ")";
          HostTensor host_wide(DType::kBF16, {rows, row});
          if (pad % 8 != 0) {
            try {
              dev.run();
              ADD_FAILURE() << what << ": an output whose rows start 8-byte aligned was accepted";
            } catch (const Error& e) {
              EXPECT_NE(std::string(e.what()).find("out: expected the stride of dim 2"), std::string::npos)
                  << e.what();
            }
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            wide.to_host(host_wide);
            long long touched = 0;
            for (std::int64_t i = 0; i < rows * row; ++i) touched += host_wide.data<unsigned short>()[i] != 0xFFFF;
            EXPECT_EQ(touched, 0) << what << ": a refused call wrote its output";
            continue;
          }
          dev.run();
          HostTensor out, lse;
          dev.results(c, out, lse);
          wide.to_host(host_wide);
          const auto* w = host_wide.data<unsigned short>();
          auto* o = out.data<unsigned short>();
          long long pad_touched = 0;
          for (std::int64_t i = 0; i < rows; ++i) {
            std::memcpy(o + i * 512, w + i * row, 512 * 2);
            for (int k = 512; k < row; ++k) pad_touched += w[i * row + k] != 0xFFFF;
          }
          EXPECT_EQ(pad_touched, 0) << what << ": values written between the output rows";
          expect_sparse_matches(what, c, out, lse);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The same inputs give the same bytes: the scheduler is deterministic and every merge runs in a
// fixed order.
TEST(MlaSparseGpu, RunToRunBitwiseIdentical) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    auto rng = make_rng(101);
    MlaCaseSpec s = spec(128, 2, 2048, 64, 6);
    s.topk_length = true;
    s.attn_sink = true;
    MlaSparseCase c = build_mla_sparse_case(s, rng);
    add_sparse_edges(c, SparseEdges{});
    DeviceSparse dev(c);
    expect_run_to_run_identical(variant, dev, c);
  }
}

// Nothing allocated or synchronized: the three launches are captured and replayed, and a replay
// schedules the topk_length found in device memory at replay time.
TEST(MlaSparseGpu, CapturedInCudaGraph) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    auto rng = make_rng(102);
    MlaCaseSpec s = spec(64, 1, 1024, 64, 5);
    s.topk_length = true;
    MlaSparseCase c = build_mla_sparse_case(s, rng);
    add_sparse_edges(c, SparseEdges{});
    DeviceSparse dev(c);
    // Shorter lengths only: longer would count tokens the poisoning treated as never indexed.
    auto new_lengths = [&] {
      for (int b = 0; b < s.batch; ++b) {
        int& l = c.topk_length.data<int>()[b];
        l = b % 2 ? l / 3 : (l + 1) / 2;
      }
      dev.topk_length.from_host(c.topk_length);
      run_reference(c);
    };
    expect_graph_replay_matches(variant + "/cuda_graph", dev, c, new_lengths);
  }
}

// The schedule made once per decode step (MlaSparseArgs::reuse_schedule): a second "layer" with
// other q and cache contents but the first layer's indices and topk_length runs on the schedule
// the first left in the workspace, and writes what its own scheduled run writes, bit for bit.
TEST(MlaSparseGpu, ReusedScheduleServesTheNextLayer) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    MlaCaseSpec s = spec(128, 2, 2048, 64, 6);
    s.topk_length = true;
    s.attn_sink = true;
    // The same seed twice: the same cache, indices and topk_length; then another q.
    auto rng = make_rng(104);
    MlaSparseCase first = build_mla_sparse_case(s, rng);
    add_sparse_edges(first, SparseEdges{});
    auto rng_again = make_rng(104);
    MlaSparseCase second = build_mla_sparse_case(s, rng_again);
    add_sparse_edges(second, SparseEdges{});
    auto rng_q = make_rng(107);
    const MlaSparseCase other = build_mla_sparse_case(s, rng_q);
    ASSERT_EQ(other.q.bytes(), second.q.bytes());
    std::memcpy(second.q.raw(), other.q.raw(), other.q.bytes());
    run_reference(second);
    DeviceSparse a(first), b(second);
    expect_reused_schedule_matches(variant + "/reused_schedule", a, b, second);
  }
}

// A reused schedule made for another call shape, or none at all (a fresh workspace), computes
// nothing: out and lse come back NaN (they were zeroed before), and a checked plan says why.
TEST(MlaSparseGpu, ReusedScheduleOfAnotherShapeIsRefused) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    auto rng = make_rng(105);
    MlaSparseCase big = build_mla_sparse_case(spec(64, 1, 256, 64, 4), rng);
    MlaSparseCase small = build_mla_sparse_case(spec(64, 1, 256, 64, 2), rng);
    DeviceSparse a(big), b(small);
    auto expect_nan = [&](const std::string& what) {
      HostTensor out, lse;
      b.results(small, out, lse, false);
      for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.get(i))) << what << " out " << i;
      for (std::int64_t i = 0; i < lse.numel(); ++i) ASSERT_TRUE(std::isnan(lse.get(i))) << what << " lse " << i;
    };
    // Never scheduled: the fresh (zeroed) workspace holds no schedule.
    MlaSparseArgs reuse = b.args;
    reuse.workspace = a.args.workspace;
    reuse.workspace_bytes = a.args.workspace_bytes;
    reuse.reuse_schedule = true;
    b.out.fill(0);
    b.lse.fill(0);
    mla_decode_sparse(a.plan, reuse);
    expect_nan(variant + "/never_scheduled");
    // Scheduled for batch 4, reused for batch 2 under the same plan.
    a.run();
    b.out.fill(0);
    b.lse.fill(0);
    mla_decode_sparse(a.plan, reuse);
    expect_nan(variant + "/batch_4_for_2");
  }
  // A checked plan reports the mismatch (and records nothing for a matching reuse): the portable
  // checked kernel, and on Hopper the sm90 ones (the default there; the direct kernel at
  // these 16 heads).
  for (const std::string& variant : mla_variants()) {
    ScopedCheckedKernel scoped(variant);
    auto rng = make_rng(106);
    MlaSparseCase big = build_mla_sparse_case(spec(16, 1, 128, 64, 4), rng);
    MlaSparseCase small = build_mla_sparse_case(spec(16, 1, 128, 64, 2), rng);
    MlaConfig cfg = sparse_config(big.spec, Device::cuda(0));
    cfg.checked = true;
    const MlaPlan plan = plan_mla_decode(cfg);
    expect_checked_kernel(plan, variant);
    DeviceSparse a(big), b(small);
    DeviceBuffer ws(plan.workspace_bytes);
    ws.fill(0);
    MlaSparseArgs first = a.args;
    first.workspace = ws.get();
    first.workspace_bytes = ws.bytes();
    mla_decode_sparse(plan, first);
    first.reuse_schedule = true;
    mla_decode_sparse(plan, first);
    EXPECT_NO_THROW(check_mla_run(plan, ws.get(), nullptr));
    MlaSparseArgs other = b.args;
    other.workspace = ws.get();
    other.workspace_bytes = ws.bytes();
    other.reuse_schedule = true;
    mla_decode_sparse(plan, other);
    try {
      check_mla_run(plan, ws.get(), nullptr);
      ADD_FAILURE() << "a reused schedule of batch 4 for batch 2 passed the check";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("reuse_schedule: expected the workspace to hold the schedule "
                                           "of this call's shape, got one of batch 4, q_len 1, topk 128"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(MlaSparseGpu, WorkspaceIsChecked) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(103);
  MlaSparseCase c = build_mla_sparse_case(spec(16, 1, 128, 64, 2), rng);
  DeviceSparse dev(c);
  ASSERT_GT(dev.plan.workspace_bytes, 0u);
  MlaSparseArgs a = dev.args;
  a.workspace = nullptr;
  EXPECT_THROW(mla_decode_sparse(dev.plan, a), Error);
  a = dev.args;
  a.workspace_bytes = dev.plan.workspace_bytes - 1;
  try {
    mla_decode_sparse(dev.plan, a);
    ADD_FAILURE() << "a short workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace_bytes"), std::string::npos) << e.what();
  }
  a = dev.args;
  a.workspace = static_cast<char*>(dev.workspace.get()) + 8;
  try {
    mla_decode_sparse(dev.plan, a);
    ADD_FAILURE() << "a misaligned workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aligned to 16 bytes"), std::string::npos) << e.what();
  }
  a = dev.args;
  a.q.device = Device::cpu();
  EXPECT_THROW(mla_decode_sparse(dev.plan, a), Error);
  // None of the rejected calls wrote anything.
  HostTensor out, lse;
  dev.results(c, out, lse);
  for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.get(i))) << i;
}

TEST(MlaSparseGpu, PlanReportsPartitionsAndKernel) {
  DECA_REQUIRE_GPU();
  MlaCaseSpec s = spec(128, 1, 2048, 64, 128);
  const MlaPlan plan = plan_mla_decode(sparse_config(s, Device::cuda(0)));
  EXPECT_EQ(plan.sm_count, cuda::sm_count(0));
  EXPECT_EQ(plan.num_parts, std::max(1, plan.sm_count / 2));
  EXPECT_NE(plan.kernel_name.find("mla_sparse_decode_"), std::string::npos);
  std::printf("[mla] plan: %s, %d partitions, workspace %zu bytes\n", plan.kernel_name.c_str(),
              plan.num_parts, plan.workspace_bytes);
}

}  // namespace
}  // namespace deca::test
