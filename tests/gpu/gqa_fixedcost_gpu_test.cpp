// The split rows' fixed costs (docs/perf-notes.md, "Fixed costs of the split rows"): what changes
// where a split unit starts and ends must leave every output bit as it was.
//  - The Hopper prologue's page ids read for the promised maximum length (tile_loader.cuh
//    read_guess / start): a plan whose max_seq_len is the case's longest request (the guess is
//    right for those requests) against one promising more (wrong for every request), with the
//    same split count: the same keys in the same order.
//  - Graph replays on one workspace: the arrival counters reset themselves.
// Over split plans of every kind: 32 and more splits, empty splits and requests, ragged lengths,
// q_len > 1 (rows on N and on M), LSE, sinks, a window, fixed-size splits, checked mode, the
// portable kernel. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

std::vector<NamedGpuCase> split_cases() {
  std::vector<NamedGpuCase> cases;
  auto add = [&](std::string name, GqaCaseSpec s, GpuOptions o = {}) {
    cases.push_back({std::move(name), std::move(s), o});
  };
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    const std::string dt = dtype_name(kv);
    // l70-b1-16k's unit: one request, split 16 or 32 ways by the split model (by the device).
    GqaCaseSpec one = base_spec(64, 8, 128, 64, kv);
    one.seq_lens = {16384};
    add("one_16k_" + dt, one);
    // Ragged and empty requests at 48 splits: the short ones leave most splits empty.
    GqaCaseSpec ragged = base_spec(64, 8, 128, 64, kv);
    ragged.batch = 5, ragged.seq_lens = {8192, 0, 1, 300, 5001};
    GpuOptions s48;
    s48.splits = 48;
    add("ragged_48_" + dt, ragged, s48);
    // q_len 4: 32 rows per kv head (rows on M), sinks.
    GqaCaseSpec rows = base_spec(64, 8, 128, 64, kv);
    rows.batch = 3, rows.q_len = 4, rows.seq_lens = {6000, 4, 1500}, rows.sinks = true;
    add("qlen4_sinks_" + dt, rows);
    // A window: the split's first key depends on the length (the guess is right only when the
    // plan's maximum is the request's length).
    GqaCaseSpec win = base_spec(32, 4, 128, 32, kv);
    win.batch = 3, win.seq_lens = {9000, 2500, 40}, win.window = 1700;
    GpuOptions s16;
    s16.splits = 16;
    add("window_" + dt, win, s16);
    // Fixed 64- and 128-key splits: the keys of split j do not depend on the length.
    GqaCaseSpec fixed = base_spec(64, 8, 128, 64, kv);
    fixed.batch = 4, fixed.q_len = 2, fixed.seq_lens = {8192, 0, 2, 3000};
    GpuOptions f;
    f.split_mode = SplitMode::kFixed, f.split_tokens = kv == DType::kBF16 ? 64 : 128;
    add("fixed_split_" + dt, fixed, f);
    // Checked mode (valid inputs), per-head scales.
    GqaCaseSpec chk = base_spec(64, 8, 128, 64, kv);
    chk.batch = 2, chk.seq_lens = {12000, 700}, chk.per_head_scales = true;
    GpuOptions c;
    c.checked = true;
    add("checked_" + dt, chk, c);
  }
  // 16-bit head dims 64 and 256, a page size smaller than the loader's row step, fp16.
  GqaCaseSpec d64 = base_spec(32, 4, 64, 16, DType::kFP16);
  d64.q_dtype = d64.out_dtype = DType::kFP16;
  d64.batch = 2, d64.seq_lens = {20000, 333};
  add("d64_fp16", d64);
  GqaCaseSpec d256 = base_spec(16, 8, 256, 64, DType::kBF16);
  d256.batch = 2, d256.seq_lens = {10000, 65};
  add("d256_bf16", d256);
  // The portable kernel's split-KV (16-bit on sm_90a with DECA_GQA_SM90_16BIT=0, int8).
  GqaCaseSpec portable = base_spec(64, 8, 128, 64, DType::kBF16);
  portable.batch = 2, portable.seq_lens = {16384, 100};
  GpuOptions o0;
  o0.hopper_16bit = 0;
  add("portable_bf16", portable, o0);
  portable.kv_dtype = DType::kINT8;
  add("portable_int8", portable);
  return cases;
}

void expect_same_bits(const std::string& what, const GpuRun& a, const GpuRun& b) {
  EXPECT_EQ(a.plan.num_splits, b.plan.num_splits) << what;
  EXPECT_TRUE(same_bytes(a.out, b.out, static_cast<long long>(a.out.bytes()))) << what;
  EXPECT_TRUE(same_bytes(a.lse, b.lse, static_cast<long long>(a.lse.bytes()))) << what;
}

TEST(GqaFixedCostGpu, GuessedPageIdsGiveTheSameBits) {
  DECA_REQUIRE_GPU();
  for (NamedGpuCase& sc : split_cases()) {
    GqaCase c = build_named_case(sc, 32);
    const GpuRun tight = run_gqa_on_gpu(c, sc.opt);
    ASSERT_GT(tight.plan.num_splits, 1) << sc.name;
    GpuOptions o = sc.opt;
    // Even splits: three times the longest request (past every page-table column: read_guess
    // stops there) at the same split count. Fixed-size splits (the guess is right whatever the
    // maximum): two more splits, empty.
    if (o.split_mode == SplitMode::kFixed) {
      o.max_seq_len = tight.plan.config.max_seq_len + 2 * o.split_tokens;
    } else {
      o.max_seq_len = 3 * tight.plan.config.max_seq_len + 1;
      o.splits = tight.plan.num_splits;
    }
    const GpuRun loose = run_gqa_on_gpu(c, o);
    const std::string name = sc.name + " " + loose.plan.kernel_name;
    EXPECT_EQ(loose.plan.kernel_name, tight.plan.kernel_name) << name;
    if (o.split_mode == SplitMode::kFixed) {
      EXPECT_TRUE(same_bytes(tight.out, loose.out, static_cast<long long>(tight.out.bytes()))) << name;
      EXPECT_TRUE(same_bytes(tight.lse, loose.lse, static_cast<long long>(tight.lse.bytes()))) << name;
    } else {
      expect_same_bits(name, tight, loose);
    }
    expect_matches_reference("guess_" + sc.name, c, tight);
  }
}

// One workspace, one captured launch replayed: every replay's last CTA of a unit found the
// counters reset by the one before (a stale count would make no CTA or two CTAs merge: NaN from
// the poisoned outputs, or the wrong bits).
TEST(GqaFixedCostGpu, GraphReplaysReuseTheCounters) {
  DECA_REQUIRE_GPU();
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    auto rng = make_rng(33);
    GqaCaseSpec s = base_spec(64, 8, 128, 64, kv);
    s.batch = 3, s.seq_lens = {16384, 0, 2100};
    GqaCase c = build_gqa_case(s, rng);
    GpuOptions o;
    o.splits = 40;
    const GpuRun eager = run_gqa_on_gpu(c, o);
    const GqaPlan plan = gpu_plan(c, o);
    ASSERT_GE(plan.num_splits, 32) << plan.kernel_name;
    DeviceCase dev(c, plan);
    GraphReplay graph;
    ASSERT_NO_FATAL_FAILURE(
        graph.capture([&](cudaStream_t stream) { cuda::gqa_decode(plan, dev.params, stream); }));
    for (int round = 0; round < 3; ++round) {
      dev.out.fill(0xFF);
      dev.lse.fill(0xFF);
      ASSERT_NO_FATAL_FAILURE(graph.replay(round + 1));
      expect_same_bits("graph replay " + std::to_string(round) + " " + plan.kernel_name, eager,
                       dev.results(c, plan));
    }
  }
}

}  // namespace
}  // namespace deca::test
