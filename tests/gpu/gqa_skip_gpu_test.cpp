// Skip-softmax on the GPU (GqaConfig::skip_softmax_factor > 0, the "_skip" kernels) against exact
// attention: within the rule's error bound of the CPU reference on random and peaked data, with
// splits, beams, window, sinks, soft-cap, tree masks and LSE; a factor too small to drop a tile
// gives the exact kernel's bits; on peaked data and splits long enough for the rule to act (a
// split restarts its running maximum) the kernel leaves at least half the V rows uncopied that
// the rule, simulated on the host at the kernels' granularity, leaves (the kernel's own count,
// GqaParams::skip_counts). Every KV dtype and 8-bit path; the Hopper skip kernels for fp8 and for
// bf16 / fp16 at head_dim 64, 128 and 256: up to 16 rows (sm90/skip.cuh) and 32 / 64 rows
// (sm90/skip_rows.cuh, whose tiny-factor run gives decode_rows.cuh's bits). Skipped where no GPU
// is present.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "common/skip_case.hpp"
#include "common/test_seed.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

constexpr float kPeakGap = 16.f;

struct SkipCase {
  std::string name;
  GqaCaseSpec spec;
  GpuOptions opt;
  bool peaked;
  int beams = 1;  // > 1: the beams share their prefix pages (share_prefix_pages, 1 own page)
  bool drafts_see_all = false;  // make_drafts_see_all's data (for f = 0.1)
  std::string kernel;  // a part of the skip kernel's name the case is meant to run (empty: any)
};

std::vector<SkipCase> skip_cases() {
  std::vector<SkipCase> m;
  for (DType kv : {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kINT8}) {
    const std::string t = dtype_name(kv);
    const bool b16 = kv == DType::kBF16 || kv == DType::kFP16;
    GqaCaseSpec s = base_spec(32, 4, 128, 16, kv);  // group 8
    s.batch = 3, s.seq_lens = {5000, 1, 2049};
    if (kv == DType::kFP16) s.q_dtype = s.out_dtype = DType::kFP16;
    // 8 rows: the Hopper skip kernel for fp8 and 16-bit caches (the plan's choice, gqa_spec.cpp).
    const std::string hopper = kv == DType::kINT8 ? "" : "_wgmma_st3";
    m.push_back({"random_" + t, s, {}, false, 1, false, hopper});
    m.push_back({"peaked_" + t, s, {}, true, 1, false, hopper});
    GqaCaseSpec f = s;  // every feature: q_len 4 with a tree, window, sinks, soft-cap, HND
    f.q_len = 4, f.seq_lens = {5000, 4, 2049}, f.tree_mask = true, f.window = 1500, f.sinks = true;
    f.softcap = 25.f, f.layout = KvLayout::kHND;
    m.push_back({"peaked_features_" + t, f, {}, true});
    if (b16) {
      // The 16-bit Hopper skip kernel's other tiles and features: 16 rows (q_len 2 of a group
      // of 8) with a tree, window, sinks, soft-cap and fixed splits at head_dim 128 (64-token
      // tiles); head_dim 64 (128-token tiles) at an odd group; head_dim 256 (32-token tiles) at
      // 16 rows (group 16) with a window and sinks.
      GqaCaseSpec r = s;
      r.q_len = 2, r.seq_lens = {5000, 2, 2049}, r.tree_mask = true, r.window = 1500, r.sinks = true;
      r.softcap = 25.f;
      GpuOptions fixed;
      fixed.split_mode = SplitMode::kFixed, fixed.split_tokens = 1024;
      m.push_back({"peaked_rows16_features_fixed_split_" + t, r, fixed, true, 1, false, "_wgmma_st3"});
      GqaCaseSpec d64 = base_spec(7, 1, 64, 16, kv);  // group 7: 8 rows
      d64.batch = 2, d64.seq_lens = {4097, 16}, d64.q_dtype = d64.out_dtype = s.q_dtype;
      m.push_back({"peaked_d64_group7_" + t, d64, {}, true, 1, false, "_wgmma_st3"});
      m.push_back({"random_d64_group7_" + t, d64, {}, false, 1, false, "_wgmma_st3"});
      GqaCaseSpec d256 = base_spec(32, 2, 256, 64, kv);  // group 16: 16 rows
      d256.batch = 2, d256.seq_lens = {3000, 65}, d256.window = 2000, d256.sinks = true;
      d256.q_dtype = d256.out_dtype = s.q_dtype, d256.layout = KvLayout::kHND;
      m.push_back({"peaked_d256_rows16_window_sinks_" + t, d256, {}, true, 1, false, "_wgmma_st3"});
    }
    if (kv == DType::kFP8E4M3 || kv == DType::kINT8) {  // the other arches' 8-bit paths
      for (int arch : {80, 89}) {
        GpuOptions o;
        o.path_arch = arch;
        m.push_back({"peaked_" + t + "_path" + std::to_string(arch), s, o, true});
      }
    }
  }
  // The rows-on-M skip kernel (sm90/skip_rows.cuh, "_wgmma_rm_skip"): speculative decoding with
  // 32 rows (q_len 4 of a group of 8) and 64 rows (q_len 8), causal or with a tree mask, per-tensor
  // and per-head scales, fixed splits (partials) and one split per request.
  for (DType kv : {DType::kBF16, DType::kFP16, DType::kFP8E4M3}) {
    const std::string t = dtype_name(kv);
    GqaCaseSpec q4 = base_spec(32, 4, 128, 16, kv);  // group 8
    q4.batch = 3, q4.q_len = 4, q4.seq_lens = {5000, 4, 2049};
    if (kv == DType::kFP16) q4.q_dtype = q4.out_dtype = DType::kFP16;
    m.push_back({"peaked_rm_q4_causal_" + t, q4, {}, true, 1, false, "_wgmma_rm_skip"});
    m.push_back({"random_rm_q4_causal_" + t, q4, {}, false, 1, false, "_wgmma_rm_skip"});
    GqaCaseSpec q8 = q4;
    q8.q_len = 8, q8.seq_lens = {5000, 8, 2049};
    m.push_back({"peaked_rm_q8_causal_" + t, q8, {}, true, 1, false, "_wgmma_rm_skip"});
    GqaCaseSpec tree = q8;  // a tree mask, per-head scales, LSE, fixed splits
    tree.tree_mask = true, tree.per_head_scales = true, tree.lse = true;
    GpuOptions fixed;
    fixed.split_mode = SplitMode::kFixed, fixed.split_tokens = 1024;
    m.push_back({"peaked_rm_q8_tree_per_head_fixed_split_" + t, tree, fixed, true, 1, false, "_wgmma_rm_skip"});
    GqaCaseSpec tree4 = q4;
    tree4.tree_mask = true, tree4.per_head_scales = true;
    m.push_back({"random_rm_q4_tree_per_head_" + t, tree4, {}, false, 1, false, "_wgmma_rm_skip"});
    if (kv != DType::kFP8E4M3) {  // the 16-bit tiles of head_dim 64 (128 tokens) and 256 (32)
      GqaCaseSpec d64 = base_spec(16, 2, 64, 16, kv);
      d64.batch = 2, d64.q_len = 8, d64.seq_lens = {4097, 8}, d64.q_dtype = d64.out_dtype = q4.q_dtype;
      m.push_back({"peaked_rm_q8_d64_" + t, d64, {}, true, 1, false, "_wgmma_rm_skip"});
      GqaCaseSpec d256 = base_spec(16, 2, 256, 64, kv);
      d256.batch = 2, d256.q_len = 4, d256.seq_lens = {3000, 65}, d256.window = 2000, d256.sinks = true;
      d256.q_dtype = d256.out_dtype = q4.q_dtype, d256.layout = KvLayout::kHND;
      m.push_back({"peaked_rm_q4_d256_window_sinks_" + t, d256, {}, true, 1, false, "_wgmma_rm_skip"});
    }
  }
  {
    GqaCaseSpec s = base_spec(64, 8, 128, 32, DType::kBF16);  // l70's heads, fixed splits
    s.batch = 2, s.seq_lens = {9000, 7777};
    GpuOptions o;
    o.split_mode = SplitMode::kFixed, o.split_tokens = 1024;
    m.push_back({"peaked_fixed_split_l70", s, o, true});
    GqaCaseSpec b = base_spec(32, 4, 128, 16, DType::kBF16);
    b.batch = 8, b.seq_lens = {3000, 3000, 3001, 2990, 700, 700, 711, 700};
    b.window = 2000, b.sinks = true;
    GpuOptions ob;
    ob.beam_width = 4;
    m.push_back({"peaked_beam4_window_sinks", b, ob, true, 4});
    GqaCaseSpec d = base_spec(16, 2, 256, 64, DType::kBF16);  // head_dim 256, 8 rows
    d.batch = 2, d.seq_lens = {3000, 65};
    m.push_back({"peaked_d256", d, {}, true, 1, false, "_wgmma_st3"});
    // The Hopper skip kernel at 16 rows (two draft tokens of a group of 8: four columns a
    // thread, a tree mask) on fixed splits (its partials merged in the launch).
    GqaCaseSpec h = base_spec(32, 4, 128, 16, DType::kFP8E4M3);
    h.batch = 2, h.q_len = 2, h.seq_lens = {5000, 2}, h.tree_mask = true;
    GpuOptions oh;
    oh.split_mode = SplitMode::kFixed, oh.split_tokens = 1024;
    m.push_back({"peaked_rows16_tree_fixed_split_fp8", h, oh, true, 1, false, "_r16_p16_qbf16_kvfp8_e4m3_obf16_tree_wgmma"});
    GqaCaseSpec g = base_spec(7, 1, 64, 16, DType::kFP8E4M3);  // odd group, 16 rows
    g.batch = 2, g.seq_lens = {4097, 16}, g.per_head_scales = true;
    m.push_back({"peaked_group7_fp8", g, {}, true});
    // A tree mask showing every row all 192 drafts: row 0's L counts them (one split, so that
    // the keys after row 0's first tile are not the first of another split).
    GqaCaseSpec t = base_spec(2, 1, 64, 16, DType::kBF16);
    t.batch = 1, t.q_len = 192, t.seq_lens = {192}, t.tree_mask = true;
    GpuOptions ot;
    ot.split_mode = SplitMode::kFixed, ot.split_tokens = 1024;
    m.push_back({"drafts_see_all", t, ot, false, 1, true});
  }
  return m;
}

void PrintTo(const SkipCase& c, std::ostream* os) { *os << c.name; }

struct SkipRun {
  GpuRun run;
  unsigned long long copied = 0, total = 0;  // V rows: copied, and what the exact kernel copies
};

SkipRun run_skip(const GqaCase& c, GpuOptions o, float f) {
  o.skip_softmax_factor = f;
  SkipRun r;
  const GqaPlan plan = gpu_plan(c, o);
  DeviceCase dev(c, plan);
  DeviceBuffer counts(2 * sizeof(unsigned long long));
  counts.fill(0);
  if (f > 0.f) dev.params.skip_counts = counts.as<unsigned long long>();
  cuda::gqa_decode(plan, dev.params, nullptr);
  cuda_ok(cudaDeviceSynchronize(), plan.kernel_name.c_str());
  try {
    check_gqa_run(plan, dev.ws.get(), nullptr);
  } catch (const Error& e) {
    ADD_FAILURE() << "kernel " << plan.kernel_name << ": " << e.what();
  }
  unsigned long long host[2] = {0, 0};
  cudaMemcpy(host, counts.get(), sizeof(host), cudaMemcpyDeviceToHost);
  r.copied = host[0], r.total = host[1];
  r.run = dev.results(c, plan);
  return r;
}

class GqaSkipGpu : public ::testing::TestWithParam<SkipCase> {};

TEST_P(GqaSkipGpu, WithinTheBoundOfExactAttention) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  const SkipCase& sc = GetParam();
  auto rng = make_rng(std::hash<std::string>{}(sc.name));
  GqaCase c = build_gqa_case(sc.spec, rng);
  if (sc.beams > 1) share_prefix_pages(c, sc.beams, 1);
  // Heavy keys 16 above the bulk: the bulk's 128-key tiles (maxima ~4 above its mean) then sit
  // below the heavy keys by more than ln(L / f) for L up to 5000 and f >= 1 (at 12 they did not:
  // few tiles dropped, docs/perf-notes.md "Skip-softmax").
  if (sc.peaked) make_peaked(c, rng, 8, kPeakGap);
  if (sc.drafts_see_all) make_drafts_see_all(c, 0.1, 64);
  const double max_logit = max_abs_logit(c);  // the Hopper fp8 kernel's LSE tolerance grows with it

  // The exact kernel, and the CPU reference's exact result.
  const SkipRun exact = run_skip(c, sc.opt, 0.f);
  EXPECT_EQ(exact.run.plan.kernel_name.find("_skip"), std::string::npos);
  expect_matches_reference(sc.name + "_exact", c, exact.run, max_logit);  // leaves the reference in c.out
  const HostTensor ref_out = c.out, ref_lse = c.lse;

  // A factor no tile of this data falls under: the skip kernel copies every V row a row sees and
  // computes the exact kernel's bits (its exact pass is the exact kernel's arithmetic, in the same order).
  // Both on one fixed split (an automatic split count follows each kernel's occupancy).
  GpuOptions fixed = sc.opt;
  if (fixed.split_mode == SplitMode::kAuto) fixed.split_mode = SplitMode::kFixed, fixed.split_tokens = 512;
  const SkipRun tiny = run_skip(c, fixed, 1e-30f);
  // Its exact counterpart is the same kernel without "_skip" (at 32 / 64 rows the rows-on-M
  // kernel, decode_rows.cuh, against skip_rows.cuh: the same bits); where the skip plan takes the
  // portable kernel (int8, other paths) and the exact one would not, path 80 gives the fp8 exact
  // plan the portable kernel too, and hopper_16bit 0 the 16-bit one.
  GpuOptions exact_opt = fixed;
  const bool portable_skip = tiny.run.plan.kernel_name.find("_wgmma") == std::string::npos;
  if (portable_skip && sc.spec.kv_dtype == DType::kFP8E4M3 && exact_opt.path_arch == 0) exact_opt.path_arch = 80;
  if (portable_skip && (sc.spec.kv_dtype == DType::kBF16 || sc.spec.kv_dtype == DType::kFP16)) exact_opt.hopper_16bit = 0;
  const SkipRun exact_fixed = run_skip(c, exact_opt, 0.f);
  EXPECT_EQ(exact_fixed.run.plan.kernel_name.find("_wgmma") == std::string::npos, portable_skip)
      << exact_fixed.run.plan.kernel_name << " vs " << tiny.run.plan.kernel_name;
  EXPECT_NE(tiny.run.plan.kernel_name.find("_skip"), std::string::npos) << tiny.run.plan.kernel_name;
  EXPECT_NE(tiny.run.plan.kernel_name.find(sc.kernel), std::string::npos) << tiny.run.plan.kernel_name;
  // Every V row some row of the CTA sees is copied; a tile or slice no row sees (past a beam's
  // own keys, before the window) has no weight and may be dropped at any factor, so <=; the bits
  // below are the test that nothing visible was dropped.
  EXPECT_LE(tiny.copied, tiny.total);
  EXPECT_GT(tiny.copied, 0u);
  EXPECT_TRUE(same_bytes(tiny.run.out, exact_fixed.run.out, exact_fixed.run.out.bytes()))
      << tiny.run.plan.kernel_name << " vs " << exact_fixed.run.plan.kernel_name;
  if (sc.spec.lse) EXPECT_TRUE(same_bytes(tiny.run.lse, exact_fixed.run.lse, exact_fixed.run.lse.bytes()));

  const double rel_tol = out_tolerance(sc.spec.out_dtype);
  const double lse_tol = lse_tolerance(sc.spec, tiny.run.plan.kernel_name, max_logit);
  unsigned long long total = 0;  // V rows the exact kernel copies on sc.opt's splits
  for (float f : {0.1f, 1.f, 10.f}) {
    const SkipRun skip = run_skip(c, sc.opt, f);
    const double worst =
        expect_within_skip_bound(c, ref_out, ref_lse, skip.run.out, skip.run.lse, f, rel_tol, lse_tol);
    const Diff d = compare(c, skip.run);  // c.out: the exact reference
    std::printf("[skip] %-34s f=%-4g V rows copied %llu of %llu (%.1f %% skipped) rel_l2=%.3g bound share %.3g\n",
                sc.name.c_str(), f, skip.copied, skip.total,
                skip.total ? 100.0 * (1.0 - double(skip.copied) / double(skip.total)) : 0.0, d.rel_l2, worst);
    EXPECT_EQ(d.nan, 0);
    if (total == 0) total = skip.total;
    EXPECT_EQ(skip.total, total);  // the decisions change what is copied, never what exists
    EXPECT_GT(skip.total, 0u);
    EXPECT_LE(skip.copied, skip.total);
  }

  // Peaked data on splits of 4096 keys at f = 1: the rule's host simulation (a CTA's rows
  // together, the running maximum restarting per split) drops most of the bulk after the heavy
  // keys. Its tiles are the Hopper kernel's (16 KB of K: fp8 128 keys, 16-bit 8192 / head_dim:
  // 128, 64 or 32), else 128 keys, which the portable kernel's units are no coarser than (a warp's
  // slice, the running maximum shared by the row block's warps); each kernel must skip at least
  // half of what the simulation skips. The Hopper 16-bit kernel seeds each split's m_ref with the
  // CTA's first visible tile (sm90/skip.cuh), as its simulation does, and runs on splits of 512
  // too, where seeded splits drop what one long split drops (unseeded ones little: the rule needs
  // a large key early in the split). Beams are left out: make_peaked's heavy keys on the beams'
  // shared pages belong to one beam only.
  if (!sc.peaked || sc.beams > 1) return;
  const bool hopper = tiny.run.plan.kernel_name.find("_wgmma") != std::string::npos;
  // (The rows-on-M skip kernel, "_rm", does not seed.)
  const bool rows_on_m = tiny.run.plan.kernel_name.find("_wgmma_rm") != std::string::npos;
  const bool seeded =
      hopper && !rows_on_m && (sc.spec.kv_dtype == DType::kBF16 || sc.spec.kv_dtype == DType::kFP16);
  const int sim_tile =
      hopper ? gqa::sm90::tile_tokens(gqa::sm90::kv_bytes_of(static_cast<int>(sc.spec.kv_dtype)), sc.spec.head_dim)
             : 128;
  for (int split : {4096, 512}) {
    if (split == 512 && !seeded) continue;
    GpuOptions fixed_split = sc.opt;
    fixed_split.split_mode = SplitMode::kFixed, fixed_split.split_tokens = split;
    const SkipCopies sim = simulate_skip_copies(c, 1.0, sim_tile, split, seeded);
    EXPECT_GT(sim.skipped_share(), 0.1) << "the peaked data leave the rule nothing to drop";
    const SkipRun skip = run_skip(c, fixed_split, 1.f);
    expect_within_skip_bound(c, ref_out, ref_lse, skip.run.out, skip.run.lse, 1.0, rel_tol, lse_tol);
    const double share = skip.total ? 1.0 - double(skip.copied) / double(skip.total) : 0.0;
    std::printf("[skip] %-34s f=1 split %d: %.1f %% of V rows skipped (host simulation, %d-key tiles%s: %.1f %%)\n",
                sc.name.c_str(), split, 100.0 * share, sim_tile, seeded ? ", seeded" : "", 100.0 * sim.skipped_share());
    EXPECT_GE(share, 0.5 * sim.skipped_share()) << skip.run.plan.kernel_name << " split " << split;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GqaSkipGpu, ::testing::ValuesIn(skip_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace deca::test
