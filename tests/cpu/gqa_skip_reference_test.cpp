// Skip-softmax in the CPU reference (GqaConfig::skip_softmax_factor): the rule on hand-made
// logits (tile order and size, the first tile, masked tiles, ties, a raised maximum), and on
// random and peaked cases the error bound the rule implies, with every feature composed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/paged_gqa_case.hpp"
#include "common/skip_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"
#include "cpu/skip_softmax.hpp"

namespace deca {
namespace {

using test::GqaCase;
using test::GqaCaseSpec;

constexpr int kT = cpu::kSkipRefTile;

// Logits of whole tiles, tile k's largest at maxima[k] (the rest 30 below).
std::vector<double> tile_logits(const std::vector<double>& maxima) {
  std::vector<double> x(maxima.size() * kT);
  for (std::size_t k = 0; k < maxima.size(); ++k) {
    for (int j = 0; j < kT; ++j) x[k * kT + j] = maxima[k] - (j == 7 ? 0.0 : 30.0);
  }
  return x;
}

TEST(SkipSoftmaxRule, DropsTilesBelowTheRunningMaximum) {
  // f / L = 1 / 128: a tile is dropped when its max is more than log(128) = 4.85 below m_run.
  const std::vector<double> x = tile_logits({0.0, -5.0, -4.0, 3.0, -1.8, -2.0});
  std::vector<unsigned char> visible(x.size(), 1);
  EXPECT_EQ(cpu::drop_skipped_tiles(x, 0, static_cast<int>(x.size()), 1.0, 128, visible.data()), 2);
  // Tile 1 (-5 < 0 - 4.85) dropped; tile 2 (-4) kept; tile 3 raises m_run to 3; tile 4 (-1.8 >
  // 3 - 4.85) kept; tile 5 (-2 < -1.85) dropped.
  const std::vector<int> kept = {1, 0, 1, 1, 1, 0};
  for (int k = 0; k < 6; ++k) {
    for (int j = 0; j < kT; ++j) EXPECT_EQ(visible[k * kT + j], kept[k]) << "tile " << k;
  }
}

TEST(SkipSoftmaxRule, FirstTileKeptMaskedTilesIgnoredAndRangeAligned) {
  // The range starts inside tile 1 (tiles are aligned at key 0); tile 1's visible keys are the
  // first kept; a tile with no visible key changes nothing.
  std::vector<double> x = tile_logits({0.0, -50.0, 10.0, -50.0});
  const int lo = kT + 10;
  std::vector<double> from_lo(x.begin() + lo, x.end());
  std::vector<unsigned char> visible(x.size(), 1);
  for (int j = 0; j < kT; ++j) visible[2 * kT + j] = 0;  // tile 2 masked: its 10 is not seen
  from_lo[7] = -20.0;  // tile 1's largest visible logit: key kT + 17
  EXPECT_EQ(cpu::drop_skipped_tiles(from_lo, lo, static_cast<int>(x.size()), 1e-3, 1000, visible.data()), 1);
  EXPECT_EQ(visible[lo], 1);            // tile 1 kept (first)
  EXPECT_EQ(visible[3 * kT + 7], 0);    // tile 3 (-50 < -20 - 13.8) dropped
  EXPECT_EQ(visible[2 * kT + 7], 0);    // tile 2 stays masked; its 10 raised nothing
  EXPECT_EQ(visible[kT + 17], 1);
}

TEST(SkipSoftmaxRule, LargeFactorDropsEvenAHigherTileAndEqualityKeeps) {
  // f / L = 4: exp(m_t - m_run) < 4 drops tiles 1.0 and 1.3 above m_run (e^1.3 < 4), not one
  // exactly log(4) above.
  const std::vector<double> x = tile_logits({0.0, 1.0, 1.3, std::log(4.0)});
  std::vector<unsigned char> visible(x.size(), 1);
  EXPECT_EQ(cpu::drop_skipped_tiles(x, 0, static_cast<int>(x.size()), 4.0, 1, visible.data()), 2);
  EXPECT_EQ(visible[kT + 7], 0);
  EXPECT_EQ(visible[2 * kT + 7], 0);  // m_run stayed 0: a dropped tile does not raise it
  EXPECT_EQ(visible[3 * kT + 7], 1);  // exactly log(f / L) above: not below, kept
}

TEST(SkipSoftmaxRule, SpanIsTheCausalWindow) {
  EXPECT_EQ(cpu::skip_span(99, 0), 100);
  EXPECT_EQ(cpu::skip_span(99, 32), 32);
  EXPECT_EQ(cpu::skip_span(10, 32), 11);
  EXPECT_EQ(cpu::skip_span(0, 1), 1);
  // With a tree mask the drafts after the row's own count: its mask bits may show them.
  EXPECT_EQ(cpu::skip_span(99, 0, 3), 103);
  EXPECT_EQ(cpu::skip_span(99, 32, 3), 35);
}

struct Outputs {
  test::HostTensor out, lse;
};

Outputs run_reference(GqaCase& c, float f) {
  test::poison_outputs(c);
  c.params.skip_softmax_factor = f;
  cpu::gqa_decode(c.params);
  c.params.skip_softmax_factor = 0.f;
  return {c.out, c.lse};
}

GqaCaseSpec skip_spec() {
  GqaCaseSpec s;
  s.batch = 3;
  s.num_q_heads = 6;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.page_size = 16;
  s.seq_lens = {700, 3, 333};
  s.out_dtype = DType::kFP16;
  return s;
}

// A factor too small to drop any tile of random data leaves the result bit for bit exact.
TEST(SkipSoftmaxReference, TinyFactorIsExact) {
  auto rng = test::make_rng(31);
  GqaCase c = test::build_gqa_case(skip_spec(), rng);
  const Outputs exact = run_reference(c, 0.f);
  const Outputs tiny = run_reference(c, 1e-30f);
  EXPECT_TRUE(test::same_bytes(exact.out, tiny.out, exact.out.bytes()));
  EXPECT_TRUE(test::same_bytes(exact.lse, tiny.lse, exact.lse.bytes()));
}

struct BoundCase {
  std::string name;
  GqaCaseSpec spec;
  bool peaked;
};

std::vector<BoundCase> bound_cases() {
  std::vector<BoundCase> cs;
  GqaCaseSpec s = skip_spec();
  cs.push_back({"random", s, false});
  cs.push_back({"peaked", s, true});
  GqaCaseSpec f = s;  // every feature at once: q_len 3 with a tree, window, sinks, soft-cap
  f.q_len = 3, f.tree_mask = true, f.window = 400, f.sinks = true, f.softcap = 20.f;
  f.layout = KvLayout::kHND;
  cs.push_back({"peaked_features", f, true});
  GqaCaseSpec q8 = s;
  q8.kv_dtype = DType::kFP8E4M3, q8.per_head_scales = true;
  cs.push_back({"peaked_fp8", q8, true});
  q8.kv_dtype = DType::kINT8;
  cs.push_back({"peaked_int8", q8, true});
  return cs;
}

class SkipSoftmaxBound : public ::testing::TestWithParam<BoundCase> {};

TEST_P(SkipSoftmaxBound, WithinTheBoundForEveryFactor) {
  DECA_SEED_TRACE();
  auto rng = test::make_rng(std::hash<std::string>{}(GetParam().name));
  GqaCase c = test::build_gqa_case(GetParam().spec, rng);
  if (GetParam().peaked) test::make_peaked(c, rng, 8, 12.f);
  const Outputs exact = run_reference(c, 0.f);
  bool any_change = false;
  for (float f : {0.01f, 0.1f, 1.f, 10.f}) {
    const Outputs skip = run_reference(c, f);
    any_change = any_change || !test::same_bytes(exact.out, skip.out, exact.out.bytes());
    const double worst = test::expect_within_skip_bound(c, exact.out, exact.lse, skip.out, skip.lse, f,
                                                        std::ldexp(1.0, -10), 1e-5);
    std::printf("[skip] %-16s f=%-5g largest share of the bound %.3g\n", GetParam().name.c_str(), f, worst);
  }
  // Peaked data at f = 10 drops tiles (the outputs move): the test sees the rule act.
  if (GetParam().peaked) EXPECT_TRUE(any_change);
}

// A tree mask that shows every row all the drafts (a non-causal query): row 0 sees 192 keys, so
// L must count them, not its position's 1, or the 128 keys after its first tile, each just
// under f times key 0's weight, are dropped: S / K about 1.7 at f = 0.1, 2 at f = 1.
TEST(SkipSoftmaxReference, TreeMaskShowingLaterDraftsStaysWithinTheBound) {
  DECA_SEED_TRACE();
  GqaCaseSpec s;
  s.q_len = 192, s.seq_lens = {192}, s.tree_mask = true;
  s.num_q_heads = 2, s.num_kv_heads = 1, s.head_dim = 64, s.out_dtype = DType::kFP16;
  for (float f : {0.1f, 1.f}) {
    auto rng = test::make_rng(41);
    GqaCase c = test::build_gqa_case(s, rng);
    test::make_drafts_see_all(c, f, kT);
    const Outputs exact = run_reference(c, 0.f);
    const Outputs skip = run_reference(c, f);
    test::expect_within_skip_bound(c, exact.out, exact.lse, skip.out, skip.lse, f, std::ldexp(1.0, -10), 1e-5);
  }
}

// The host simulation of the kernels' decisions (test::simulate_skip_copies, which the GPU suite
// holds the kernels' V counts to) is the reference's rule at the reference's granularity: one
// row, 64-key tiles, one split.
TEST(SkipSoftmaxSimulation, IsTheReferenceRuleOnOneRow) {
  DECA_SEED_TRACE();
  GqaCaseSpec s;
  s.num_q_heads = 1, s.num_kv_heads = 1, s.head_dim = 64, s.seq_lens = {3000};
  for (float f : {0.1f, 1.f, 10.f}) {
    auto rng = test::make_rng(43);
    GqaCase c = test::build_gqa_case(s, rng);
    test::make_peaked(c, rng, 8, 16.f);
    std::vector<double> x;
    test::row_logits_of(c, 0, 0, 0, x);
    std::vector<unsigned char> visible(x.size(), 1);
    const int dropped = cpu::drop_skipped_tiles(x, 0, 3000, f, cpu::skip_span(2999, 0), visible.data());
    const test::SkipCopies sim = test::simulate_skip_copies(c, f, kT, 0);
    EXPECT_EQ(sim.total, 3000);
    EXPECT_EQ(sim.copied, std::count(visible.begin(), visible.end(), 1)) << "f " << f;
    EXPECT_GT(dropped, 0) << "f " << f;
  }
}

// The GPU suite's peaked shapes (gqa_skip_gpu_test.cpp: 32 q heads on 4, head_dim 128, 5000 and
// 2049 keys, heavy keys 16 above the bulk); with `q_len` > 1 its features case: a tree mask,
// window 1500, sinks and soft-cap 25.
GqaCase peaked_suite_case(int q_len, DType kv, std::uint64_t seed) {
  GqaCaseSpec s;
  s.num_q_heads = 32, s.num_kv_heads = 4, s.head_dim = 128, s.batch = 3, s.seq_lens = {5000, q_len, 2049};
  s.kv_dtype = kv, s.q_len = q_len;
  if (q_len > 1) s.tree_mask = true, s.window = 1500, s.sinks = true, s.softcap = 25.f;
  auto rng = test::make_rng(seed);
  GqaCase c = test::build_gqa_case(s, rng);
  test::make_peaked(c, rng, 8, 16.f);
  return c;
}

// They leave the rule much of the bulk to drop on splits of 4096 keys at f = 1, and less on
// splits of 256: a split restarts the running maximum, so only a split with a heavy key early
// drops anything.
TEST(SkipSoftmaxSimulation, PeakedDataDropOnLongSplitsMoreThanOnShortOnes) {
  DECA_SEED_TRACE();
  for (int features = 0; features < 2; ++features) {
    const GqaCase c = features ? peaked_suite_case(4, DType::kFP8E4M3, 48) : peaked_suite_case(1, DType::kBF16, 47);
    const test::SkipCopies long_splits = test::simulate_skip_copies(c, 1.0, 128, 4096);
    const test::SkipCopies short_splits = test::simulate_skip_copies(c, 1.0, 128, 256);
    std::printf("[skip] peaked%s f=1: %.1f %% of V rows dropped on splits of 4096, %.1f %% on 256\n",
                features ? "_features" : "", 100.0 * long_splits.skipped_share(), 100.0 * short_splits.skipped_share());
    EXPECT_GT(long_splits.skipped_share(), features ? 0.15 : 0.5);
    EXPECT_LT(short_splits.skipped_share(), long_splits.skipped_share());
  }
}

// m_ref's seed (the Hopper 16-bit kernel's: a split starts from the largest logits of the CTA's
// first visible tile, which the split holding it keeps): on the same peaked shapes, short splits
// then drop about what one long split drops, where unseeded they drop much less; with a window
// the seed tile is the window's first (make_peaked puts the first heavy keys there). Seeding
// never drops less than restarting at -inf here, and never touches a request of one split.
TEST(SkipSoftmaxSimulation, SeededSplitsDropAsMuchAsLongOnes) {
  DECA_SEED_TRACE();
  for (int features = 0; features < 2; ++features) {
    const GqaCase c = peaked_suite_case(features ? 2 : 1, DType::kBF16, 53 + features);
    const test::SkipCopies one = test::simulate_skip_copies(c, 1.0, 64, 0, true);
    EXPECT_EQ(one.copied, test::simulate_skip_copies(c, 1.0, 64, 0).copied);  // one split: no seed
    const test::SkipCopies seeded = test::simulate_skip_copies(c, 1.0, 64, 512, true);
    const test::SkipCopies plain = test::simulate_skip_copies(c, 1.0, 64, 512);
    std::printf("[skip] peaked%s f=1, 64-key tiles: %.1f %% of V rows dropped in one split, %.1f %% on seeded "
                "splits of 512, %.1f %% unseeded\n",
                features ? "_features" : "", 100.0 * one.skipped_share(), 100.0 * seeded.skipped_share(),
                100.0 * plain.skipped_share());
    EXPECT_GT(seeded.skipped_share(), plain.skipped_share() + 0.2);
    EXPECT_GT(seeded.skipped_share(), 0.8 * one.skipped_share());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SkipSoftmaxBound, ::testing::ValuesIn(bound_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace deca
