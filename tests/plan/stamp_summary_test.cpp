// The phase stamps' summary (src/cuda/stamp_summary.cpp, printed by deca-bench --stamps) on
// hand-made records: percentiles, the time origin (the earliest entry), CTAs without a record,
// the marks' gaps, the timer step and the waves (a CTA placed on an SM after another CTA there
// ended is in the next wave).
#include <gtest/gtest.h>

#include <vector>

#include "cuda/stamp_summary.hpp"

namespace deca::cuda {
namespace {

using namespace gqa;

// A CTA on `sm` entering at `entry` ns whose every event up to kStampOut follows 1 us apart.
CtaStamps cta(int sm, std::uint64_t entry, int tiles = 2) {
  CtaStamps c;
  c.sm = sm;
  c.tiles = tiles;
  for (int e = kStampEntry; e <= kStampOut; ++e) c.t[e] = entry + 1000ull * e;
  return c;
}

TEST(StampSummary, PercentilesInterpolateBetweenRanks) {
  EXPECT_EQ(percentile({}, 0.5), 0.0);
  EXPECT_EQ(percentile({7.0}, 0.9), 7.0);
  EXPECT_DOUBLE_EQ(percentile({4.0, 1.0, 3.0, 2.0}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile({0.0, 10.0}, 0.1), 1.0);
  std::vector<double> v;
  for (int i = 0; i <= 100; ++i) v.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(v, 0.1), 10.0);
  EXPECT_DOUBLE_EQ(percentile(v, 0.9), 90.0);
  EXPECT_DOUBLE_EQ(percentile(v, 1.5), 100.0);  // clamped
}

TEST(StampSummary, TimesFromTheEarliestEntry) {
  StampRun run;
  const std::uint64_t base = 5'000'000'000ull;
  run.ctas = {cta(0, base + 2000), cta(1, base), cta(2, base + 1000), CtaStamps{}};  // the last wrote nothing
  run.ctas[1].t[kStampMergeWeights] = base + 7000;  // the merging CTA
  run.ctas[1].t[kStampMergeEnd] = base + 9500;
  run.grid_ctas = 4;
  run.mark_before = base - 3000;
  run.mark_after = base + 10000;
  const StampSummary s = summarize_stamps(run);
  EXPECT_EQ(s.ctas, 3);
  EXPECT_EQ(s.missing, 1);
  EXPECT_EQ(s.sms, 3);
  EXPECT_EQ(s.median_tiles, 2);
  EXPECT_DOUBLE_EQ(s.events[kStampEntry].median, 1.0);
  EXPECT_DOUBLE_EQ(s.events[kStampEntry].p10, 0.2);
  EXPECT_DOUBLE_EQ(s.events[kStampEntry].max, 2.0);
  EXPECT_DOUBLE_EQ(s.events[kStampOut].median, 7.0);
  EXPECT_EQ(s.events[kStampOut].count, 3);
  EXPECT_EQ(s.events[kStampMergeEnd].count, 1);
  EXPECT_DOUBLE_EQ(s.events[kStampMergeEnd].median, 9.5);
  EXPECT_DOUBLE_EQ(s.span_us, 9.5);  // the merging CTA's end
  EXPECT_TRUE(s.has_gap_before);
  EXPECT_DOUBLE_EQ(s.gap_before_us, 3.0);
  EXPECT_DOUBLE_EQ(s.gap_after_us, 0.5);
  EXPECT_DOUBLE_EQ(s.timer_step_ns, 1000.0);  // the distinct stamps are 1 us apart, 1.5 us at the end
  ASSERT_EQ(s.waves.size(), 1u);
  EXPECT_EQ(s.waves[0].ctas, 3);
}

TEST(StampSummary, ACtaPlacedAfterAnotherEndedOnItsSmIsTheNextWave) {
  StampRun run;
  // SM 0: two CTAs at once (wave 0), a third after the first ended (wave 1), a fourth after the
  // third ended (wave 2). SM 1: one CTA, entering late but with nothing ended there (wave 0).
  run.ctas = {cta(0, 0 + 1), cta(0, 100), cta(0, 6500), cta(0, 13500), cta(1, 9000)};
  EXPECT_EQ(wave_of_ctas(run.ctas), (std::vector<int>{0, 0, 1, 2, 0}));
  run.ctas.push_back(CtaStamps{});
  EXPECT_EQ(wave_of_ctas(run.ctas).back(), -1);
  const StampSummary s = summarize_stamps(run);
  ASSERT_EQ(s.waves.size(), 3u);
  EXPECT_EQ(s.waves[0].ctas, 3);
  EXPECT_EQ(s.waves[1].ctas, 1);
  EXPECT_EQ(s.waves[2].ctas, 1);
  EXPECT_DOUBLE_EQ(s.waves[1].events[kStampEntry].median, 6.499);
  EXPECT_FALSE(s.has_gap_before);
}

TEST(StampSummary, OrdersCoverEveryEvent) {
  std::vector<int> seen(kStampEventCount, 0);
  for (const StampOrder& o : stamp_orders()) {
    EXPECT_NE(o.before, o.after);
    seen[o.before] = seen[o.after] = 1;
  }
  for (int e = 0; e < kStampEventCount; ++e) EXPECT_EQ(seen[e], 1) << stamp_event_key(e);
}

}  // namespace
}  // namespace deca::cuda
