// MLA dense decode on the GPU against the CPU reference (docs/semantics.md "MLA decode"; issue 31
// item 5), for every decode variant this machine runs (DECA_MLA_KERNEL; on Hopper the sm90
// kernels) and every cache format (bf16, e4m3 with one scale, the 656-byte token read densely):
// heads 1, 8, 16, 24, 64, 100, 128; q_len 1..4; page sizes 1, 16, 61, 64, 128, 256, 576; ragged
// lengths with 0, 1, page +- 1, shorter than a page and below q_len, partitions of several
// requests, one request of 131072 tokens (its plan takes the split combine); shuffled block
// tables, NaN in every cache slot no request owns, outputs poisoned before each run. Then the
// cache as a strided view, the dense bf16 rows by TMA where plans take them (and their register
// fallback for an unaligned cache), run-to-run bitwise identity, CUDA graph capture + replay with new
// lengths, the schedule reused across layers, checked plans naming a bad block id and a bad
// length, and the workspace checks.
// Seed: DECA_TEST_SEED. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "cuda/mla_tma.hpp"
#include "deca/error.hpp"
#include "gpu/mla_dense_gpu_runner.hpp"

namespace deca::test {
namespace {

constexpr int kFormats[] = {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse};

struct Case {
  std::string name;
  MlaCaseSpec spec;
};

MlaCaseSpec spec(int heads, int q_len, int page, std::vector<int> lens) {
  MlaCaseSpec s;
  s.num_heads = heads;
  s.q_len = q_len;
  s.page_size = page;
  s.batch = static_cast<int>(lens.size());
  s.seq_lens = std::move(lens);
  return s;
}

// Whether plans take this page size (a CPU plan answers without a GPU).
bool page_size_allowed(int page) {
  MlaConfig c;
  c.num_heads = 1;
  c.page_size = page;
  c.max_seq_len = 1;
  try {
    plan_mla_decode(c);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<Case> matrix() {
  std::vector<Case> m;
  auto add = [&](std::string name, MlaCaseSpec s) { m.push_back({std::move(name), s}); };
  // Every head count and q_len; the lengths: long, empty, one page, one past it, a few tokens.
  for (int heads : {1, 8, 16, 24, 64, 100, 128}) {
    for (int q_len : {1, 2, 3, 4}) {
      add("h" + std::to_string(heads) + "_q" + std::to_string(q_len),
          spec(heads, q_len, 64, {700, 0, 64, 65, q_len + 2}));
    }
  }
  for (int page : {1, 16, 61, 128, 256, 576}) {
    if (!page_size_allowed(page)) continue;  // 576: once plans take any page size
    add("p" + std::to_string(page), spec(64, 2, page, {3 * page + 1, page - 1 + (page == 1), 2, 900}));
  }
  // Lengths below q_len (the first rows see no key: zeros, LSE -inf), length 1.
  add("short_below_q_len", spec(16, 4, 64, {1, 3, 4, 40}));
  // 40 ragged requests on few partitions (q_len 3 and 4: a partition is a column of q_len x head
  // blocks CTAs), so that partitions hold two or three requests, an empty one among them: what a
  // CTA carries from one request to the next (the Q tile after staged outputs, the consumers'
  // barrier phases, block pairs starting on either tile). In a cluster at page 61 with LSE +inf
  // for rows without a key, and without one at page 1; a cluster at page 576 besides.
  std::vector<int> many;
  for (int i = 0; i < 40; ++i) {
    constexpr int kRagged[16] = {0, 1, 63, 64, 65, 128, 129, 200, 300, 2, 700, 0, 191, 5, 64, 130};
    many.push_back(kRagged[i % 16] + 3 * (i / 16));
  }
  MlaCaseSpec many_c2 = spec(128, 3, 61, many);
  many_c2.lse_empty = kMlaLseEmptyPosInf;
  add("many_h128_q3_p61", many_c2);
  add("many_h64_q4_p1", spec(64, 4, 1, many));
  add("h128_q2_p576", spec(128, 2, 576, {3 * 576 + 1, 575, 0, 1, 1300, 2}));
  // Many small requests, few heads; one long request over the whole GPU.
  add("b96_h16", spec(16, 1, 64, std::vector<int>(96, 300)));
  {
    MlaCaseSpec s = spec(128, 1, 64, {4000, 1});
    s.softmax_scale = 0.05f;
    add("h128_scale", s);
    MlaCaseSpec nolse = spec(64, 2, 64, {500, 2});
    nolse.lse = false;
    add("no_lse", nolse);
  }
  return m;
}

// Case c (its reference computed) on every variant this machine runs.
void expect_variants_match(const std::string& name, const MlaDenseCase& c) {
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    DeviceDense dev(c);
    dev.run();
    HostTensor out, lse;
    dev.results(c, out, lse);
    expect_dense_matches(variant + "/" + dense_format_name(c.spec.kv_format) + "/" + name + " (" +
                             dev.plan.kernel_name + ")",
                         c, out, lse);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(MlaDenseGpu, MatchesCpuReference) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  std::uint64_t salt = 0;
  for (const int format : kFormats) {
    for (const Case& k : matrix()) {
      MlaCaseSpec s = k.spec;
      s.kv_format = format;
      auto rng = make_rng(++salt);
      MlaDenseCase c = build_mla_dense_case(s, rng);
      run_dense_reference(c);
      expect_variants_match(k.name, c);
      if (HasFatalFailure()) return;
    }
  }
}

// One request of 131072 tokens beside a short one: split over every partition and merged.
TEST(MlaDenseGpu, OneRequestOf131072Tokens) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const int format : kFormats) {
    MlaCaseSpec s = spec(16, 1, 64, {131072, 7});
    s.kv_format = format;
    auto rng = make_rng(200 + format);
    MlaDenseCase c = build_mla_dense_case(s, rng);
    run_dense_reference(c);
    expect_variants_match("b2_131072", c);
  }
}

// Case c's cache as one layer of an interleaved [blocks, 2 layers, page, 1, row] allocation
// (block stride two pages), `shift` bytes after the allocation's start; the other layer and the
// shift all NaN (0xFF). Run on every variant against the reference; on sm90 the decode kernel's
// name must contain `sm90_kernel` when not empty.
void expect_cache_view_matches(const MlaDenseCase& c, std::size_t shift, const std::string& name,
                               const std::string& sm90_kernel = "") {
  const MlaCaseSpec& s = c.spec;
  const int format = s.kv_format;
  const std::int64_t blocks = c.kv.shape()[0];
  const std::size_t block_bytes = c.kv.bytes() / blocks;
  HostTensor big(DType::kUINT8, {static_cast<std::int64_t>(2 * blocks * block_bytes + shift)});
  big.fill_bytes(0xFF);
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::memcpy(big.data<unsigned char>() + shift + (2 * b + 1) * block_bytes,
                static_cast<const unsigned char*>(c.kv.raw()) + b * block_bytes, block_bytes);
  }
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    DeviceDense dev(c);
    DeviceBuffer dbig(big);
    const std::int64_t row = mla_dense_row(format);
    const std::size_t elem = format == kMlaKvBF16 ? 2 : 1;
    dev.args.kv_cache = make_tensor(static_cast<char*>(dbig.get()) + shift + block_bytes, c.kv.dtype(),
                                    {blocks, s.page_size, 1, row}, {2 * s.page_size * row, row, row, 1},
                                    Device::cuda(0));
    ASSERT_EQ(block_bytes, static_cast<std::size_t>(s.page_size * row) * elem);
    if (variant == "sm90" && !sm90_kernel.empty()) {
      EXPECT_NE(dev.plan.kernel_name.find(sm90_kernel), std::string::npos) << dev.plan.kernel_name;
    }
    dev.run();
    HostTensor out, lse;
    dev.results(c, out, lse);
    expect_dense_matches(variant + "/" + dense_format_name(format) + "/" + name + " (" + dev.plan.kernel_name + ")",
                         c, out, lse);
  }
}

TEST(MlaDenseGpu, CacheAsAStridedView) {
  DECA_REQUIRE_GPU();
  for (const int format : kFormats) {
    MlaCaseSpec s = spec(64, 2, 16, {100, 1, 33});
    s.kv_format = format;
    auto rng = make_rng(300 + format);
    MlaDenseCase c = build_mla_dense_case(s, rng);
    run_dense_reference(c);
    expect_cache_view_matches(c, 0, "strided_cache");
  }
}

// Dense bf16 rows by TMA (src/cuda/mla_tma.hpp): the plans of 65..128 heads at pages of a multiple
// of 64 run the "_tma" kernel on sm_90. Each request's last block ends inside it (NaN in the
// unused slots: the kernel must zero those rows), q_len 4 moves the causal end within a block,
// an empty request and one shorter than a page. Then the cache as a layer of an interleaved
// allocation (the map's block stride) and at 16 bytes past a 256-byte boundary (TMA asks the
// global address for 16-byte alignment only; the API refuses less), and caches of one block with
// a block stride no map holds (the same kernel's register producers; tests/plan/mla_tma_map_test.cpp
// has the map's refusals).
TEST(MlaDenseGpu, TmaRowsWherePlansTakeThem) {
  DECA_REQUIRE_GPU();
  std::uint64_t salt = 800;
  for (int heads : {100, 128}) {
    for (int page : {64, 128, 256, 576}) {
      for (int q_len : {1, 4}) {
        MlaCaseSpec s = spec(heads, q_len, page, {2 * page + 37, 0, 63, 64, 65, page - 1, 3, 1000});
        s.kv_format = kMlaKvBF16;
        auto rng = make_rng(++salt);
        MlaDenseCase c = build_mla_dense_case(s, rng);
        run_dense_reference(c);
        for (const std::string& variant : mla_variants()) {
          ScopedMlaKernel scoped(variant);
          DeviceDense dev(c);
          if (variant == "sm90") EXPECT_NE(dev.plan.kernel_name.find("_c2_tma_sm90"), std::string::npos);
          dev.run();
          HostTensor out, lse;
          dev.results(c, out, lse);
          expect_dense_matches(variant + "/tma/h" + std::to_string(heads) + "_p" + std::to_string(page) + "_q" +
                                   std::to_string(q_len) + " (" + dev.plan.kernel_name + ")",
                               c, out, lse);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  MlaCaseSpec s = spec(128, 2, 64, {300, 1, 130});
  s.kv_format = kMlaKvBF16;
  auto rng = make_rng(900);
  MlaDenseCase c = build_mla_dense_case(s, rng);
  run_dense_reference(c);
  expect_cache_view_matches(c, 0, "tma_strided_cache", "_c2_tma_sm90");
  expect_cache_view_matches(c, 16, "tma_offset_cache", "_c2_tma_sm90");

  // One block (one request of 1..64 tokens), whose stride is never taken: the API takes any (8
  // bytes, 0), no tensor map can hold it, and the TMA kernel runs its register producers
  // (src/cuda/mla_tma.hpp).
  for (const int len : {40, 64, 2}) {
    MlaCaseSpec one = spec(128, 2, 64, {len});
    one.kv_format = kMlaKvBF16;
    one.spare_blocks = 0;
    auto rng1 = make_rng(910 + len);
    MlaDenseCase c1 = build_mla_dense_case(one, rng1);
    ASSERT_EQ(c1.kv.shape()[0], 1);
    run_dense_reference(c1);
    for (const std::int64_t stride : {std::int64_t{4}, std::int64_t{0}}) {
      for (const std::string& variant : mla_variants()) {
        ScopedMlaKernel scoped(variant);
        DeviceDense dev(c1);
        dev.args.kv_cache.stride[0] = stride;
        if (variant == "sm90") EXPECT_NE(dev.plan.kernel_name.find("_c2_tma_sm90"), std::string::npos);
        dev.run();
        HostTensor out, lse;
        dev.results(c1, out, lse);
        expect_dense_matches(variant + "/tma_one_block_stride" + std::to_string(stride) + "_len" +
                                 std::to_string(len) + " (" + dev.plan.kernel_name + ")",
                             c1, out, lse);
      }
    }
  }
}

// The map is encoded on every run (the cache's address may change from call to call): its host
// cost, printed for docs/perf-notes-mla.md, must stay a small part of a run's launch overhead.
TEST(MlaDenseGpu, TmaMapEncodeHostCost) {
  DECA_REQUIRE_GPU();
  DeviceBuffer cache(64 * 1152 * 16);
  mla::DecodeKernelParams kp{};
  kp.p.kv = static_cast<const unsigned char*>(cache.get());
  kp.p.page_size = 64;
  kp.p.num_blocks = 16;
  kp.p.kv_stride_slot = 1152;
  kp.p.kv_stride_block = 64 * 1152;
  mla::TensorMapBytes map{};
  cuda::encode_dense_rows_map(kp, map, "TmaMapEncodeHostCost");  // resolves the driver first
  ASSERT_EQ(kp.dense.use_map, 1);
  constexpr int kCalls = 10000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) cuda::encode_dense_rows_map(kp, map, "TmaMapEncodeHostCost");
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kCalls;
  std::printf("[mla] cuTensorMapEncodeTiled for the dense bf16 rows: %.3f us a run\n", us);
  EXPECT_LT(us, 5.0);
  kp.p.kv_stride_slot = 1160;  // not a multiple of 16: no map, the register producers
  cuda::encode_dense_rows_map(kp, map, "TmaMapEncodeHostCost");
  EXPECT_EQ(kp.dense.use_map, 0);
}

// The same inputs give the same bytes: the scheduler is deterministic and every merge runs in a
// fixed order.
TEST(MlaDenseGpu, RunToRunBitwiseIdentical) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    for (const int format : kFormats) {
      MlaCaseSpec s = spec(128, 2, 64, {5000, 1, 700, 64, 2048, 3});
      s.kv_format = format;
      auto rng = make_rng(400 + format);
      MlaDenseCase c = build_mla_dense_case(s, rng);
      DeviceDense dev(c);
      expect_run_to_run_identical(variant + " " + dense_format_name(format), dev, c);
    }
  }
}

// Nothing allocated or synchronized: the launches are captured and replayed, and a replay
// schedules the cache_seqlens found in device memory at replay time.
TEST(MlaDenseGpu, CapturedInCudaGraphReplaysNewLengths) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    auto rng = make_rng(500);
    MlaCaseSpec s = spec(64, 1, 64, {3000, 700, 64, 9, 1});
    MlaDenseCase c = build_mla_dense_case(s, rng);
    DeviceDense dev(c);
    auto new_lengths = [&] {
      // Shorter lengths only (longer would read slots the case poisoned), one request emptied.
      const std::vector<int> shorter = {2999, 1, 0, 8, 1};
      std::copy(shorter.begin(), shorter.end(), c.seq_lens.data<int>());
      dev.seq_lens.from_host(c.seq_lens);
      run_dense_reference(c);
    };
    expect_graph_replay_matches(variant + "/cuda_graph", dev, c, new_lengths, 4e-3);
  }
}

// The schedule made once per decode step (MlaDenseArgs::reuse_schedule): a second "layer" with
// other q and cache contents but the first layer's lengths runs on the schedule the first left in
// the workspace and writes what its own scheduled run writes, bit for bit. A workspace that never
// held a schedule computes nothing (NaN).
TEST(MlaDenseGpu, ReusedScheduleServesTheNextLayer) {
  DECA_REQUIRE_GPU();
  for (const std::string& variant : mla_variants()) {
    ScopedMlaKernel scoped(variant);
    for (const int format : kFormats) {
      MlaCaseSpec s = spec(128, 2, 64, {4000, 2, 0, 900});
      s.kv_format = format;
      auto rng = make_rng(600 + format);
      MlaDenseCase first = build_mla_dense_case(s, rng);
      auto rng2 = make_rng(610 + format);  // another q and cache, the same lengths
      MlaDenseCase second = build_mla_dense_case(s, rng2);
      run_dense_reference(second);
      DeviceDense a(first), b(second);
      const std::string what = variant + "/" + dense_format_name(format) + "/reused_schedule";
      MlaDenseArgs reuse = expect_reused_schedule_matches(what, a, b, second, 4e-3);

      HostTensor out, lse;
      DeviceDense fresh(first);
      reuse.workspace = fresh.args.workspace;  // zeroed: no schedule in it
      b.out.fill(0);
      b.lse.fill(0);
      mla_decode_dense(fresh.plan, reuse);
      b.results(second, out, lse, false);
      for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.get(i))) << what << " " << i;
    }
  }
}

// Checked plans (the portable kernel, "_chk", and on Hopper the sm90 kernels' checked builds): a
// block id one past the pool
// and a length past max_seq_len, planted in device memory, are reported by check_mla_run with the
// entry, the bound and the value, then the record is clear; the requests without a bad entry are
// the reference's.
TEST(MlaDenseGpu, CheckedPlanReportsABadBlockIdAndABadLength) {
  DECA_REQUIRE_GPU();
  // Without a cluster at page 16; in one at page 64 (on sm90 the TMA rows, whose refused entry is
  // a box outside the tensor).
  for (const std::string& variant : mla_variants()) {
    for (const bool bad_block : {true, false}) {
      for (const MlaCaseSpec& s : {spec(64, 1, 16, {100, 40, 70}), spec(128, 1, 64, {300, 100, 170})}) {
        auto rng = make_rng(700 + bad_block + (s.num_heads > 64 ? 10 : 0));
        MlaDenseCase c = build_mla_dense_case(s, rng);
        run_dense_reference(c);
        ScopedCheckedKernel scoped(variant);
        DeviceDense dev(c, /*checked=*/true);
        expect_checked_kernel(dev.plan, variant);
        const std::int64_t cols = c.block_table.shape()[1];
        const int num_blocks = static_cast<int>(c.kv.shape()[0]);
        HostTensor table(c.block_table), lens(c.seq_lens);
        if (bad_block) {
          table.data<int>()[1 * cols + 1] = num_blocks;  // request 1 (40 tokens) reads column 1
        } else {
          // Every column request 1 may now read names a real block: the length is the one offender.
          for (std::int64_t j = 3; j < cols; ++j) table.data<int>()[1 * cols + j] = table.data<int>()[0];
          lens.data<int>()[1] = dev.plan.config.max_seq_len + 1;
        }
        cuda_ok(cudaMemcpy(dev.block_table.get(), table.raw(), table.bytes(), cudaMemcpyHostToDevice), "table");
        cuda_ok(cudaMemcpy(dev.seq_lens.get(), lens.raw(), lens.bytes(), cudaMemcpyHostToDevice), "lens");
        dev.run();
        HostTensor out, lse;
        dev.results(c, out, lse, false);
        std::string error;
        try {
          check_mla_run(dev.plan, dev.workspace.get(), nullptr);
        } catch (const Error& e) {
          error = e.what();
        }
        const std::string want =
            bad_block ? "mla_decode_dense: block_table[1][1]: expected a block id in [0, " +
                            std::to_string(num_blocks) + ") (kv_cache's num_blocks), got " +
                            std::to_string(num_blocks) + " (found by the checked GPU run)"
                      : "mla_decode_dense: cache_seqlens[1]: expected a length in [0, " +
                            std::to_string(dev.plan.config.max_seq_len) +
                            "] (min(plan.config.max_seq_len, block_table's columns * page_size)), got " +
                            std::to_string(dev.plan.config.max_seq_len + 1) + " (found by the checked GPU run)";
        EXPECT_EQ(error, want) << variant;
        EXPECT_NO_THROW(check_mla_run(dev.plan, dev.workspace.get(), nullptr)) << "record not cleared";
        // Requests 0 and 2 read nothing bad: the reference's bytes within the usual bounds.
        const std::int64_t per_request = static_cast<std::int64_t>(s.q_len) * s.num_heads * 512;
        for (const int b : {0, 2}) {
          for (std::int64_t i = b * per_request; i < (b + 1) * per_request; ++i) {
            ASSERT_FALSE(std::isnan(out.get(i))) << b;
            ASSERT_NEAR(out.get(i), c.out.get(i), 1e-2 + 2e-2 * std::fabs(c.out.get(i))) << b << " " << i;
          }
        }
      }
    }
  }
}

TEST(MlaDenseGpu, WorkspaceAndDevicesAreChecked) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(800);
  MlaDenseCase c = build_mla_dense_case(spec(16, 1, 64, {100, 3}), rng);
  DeviceDense dev(c);
  ASSERT_GT(dev.plan.workspace_bytes, 0u);
  auto rejects = [&](MlaDenseArgs a, const std::string& needle) {
    try {
      mla_decode_dense(dev.plan, a);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  MlaDenseArgs a = dev.args;
  a.workspace = nullptr;
  rejects(a, "workspace: expected");
  a = dev.args;
  a.workspace_bytes = dev.plan.workspace_bytes - 1;
  rejects(a, "workspace_bytes");
  a = dev.args;
  a.workspace = static_cast<char*>(dev.workspace.get()) + 8;
  rejects(a, "aligned to 16 bytes");
  a = dev.args;
  a.cache_seqlens = c.seq_lens.view();  // a host tensor for a CUDA plan
  rejects(a, "cache_seqlens: expected device cuda:0");
  a = dev.args;
  a.kv_scale = 2.f;  // a bf16 cache takes no scale
  rejects(a, "kv_scale: expected 1");
  HostTensor out, lse;
  dev.results(c, out, lse);
  for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.get(i))) << "written " << i;
}

TEST(MlaDenseGpu, PlanReportsPartitionsAndKernel) {
  DECA_REQUIRE_GPU();
  for (const int format : kFormats) {
    MlaConfig cfg;
    cfg.num_heads = 128;
    cfg.max_batch = 128;
    cfg.max_seq_len = 8192;
    cfg.kv_format = dense_format(format);
    cfg.device = Device::cuda(0);
    const MlaPlan plan = plan_mla_decode(cfg);
    EXPECT_EQ(plan.sm_count, cuda::sm_count(0));
    EXPECT_GT(plan.num_parts, 0);
    EXPECT_GT(plan.workspace_bytes, 0u);
    EXPECT_NE(plan.kernel_name.find("mla_dense_decode_"), std::string::npos) << plan.kernel_name;
    std::printf("[mla] dense %s plan: %s, %d partitions, workspace %zu bytes\n", dense_format_name(format),
                plan.kernel_name.c_str(), plan.num_parts, plan.workspace_bytes);
  }
}

}  // namespace
}  // namespace deca::test
