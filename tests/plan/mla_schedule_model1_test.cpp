// Table tests of the MLA decode scheduler with MODEL1's second cache (TopkLists with extra_topk,
// kernels/mla/schedule/schedule.cuh): a request's work list is the first cache's blocks then the
// extra cache's, both selections spread over the partitions as one, and the stamp tells a
// schedule of another extra list apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "kernels/mla/model1.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "plan/mla_schedule_check.hpp"

namespace deca::mla {
namespace {

TopkLists two(const std::vector<int>* len, int topk, const std::vector<int>* extra_len, int extra_topk) {
  return TopkLists{len ? len->data() : nullptr, topk, extra_len ? extra_len->data() : nullptr, extra_topk};
}

TEST(MlaScheduleModel1, BlocksOfBothCachesFirstCacheFirst) {
  const std::vector<int> len = {0, 1, 64, 65, 128, 300, -2};
  const std::vector<int> extra = {0, 0, 1, 2000, 64, -5, 1024};
  const TopkLists l = two(&len, 128, &extra, 1024);
  const int want[] = {0, 1, 1 + 1, 2 + 16, 2 + 1, 2 + 0, 0 + 16};
  for (int r = 0; r < 7; ++r) EXPECT_EQ(request_blocks(l, r), want[r]) << r;
  EXPECT_EQ(uniform_blocks(l), -1);
  EXPECT_EQ(uniform_blocks(two(nullptr, 128, nullptr, 1024)), 2 + 16);
  EXPECT_EQ(uniform_blocks(two(nullptr, 100, nullptr, 2)), 2 + 1);
  EXPECT_EQ(uniform_blocks(two(nullptr, 128, &extra, 1024)), -1);
  EXPECT_EQ(uniform_blocks(two(&len, 128, nullptr, 1024)), -1);
  // extra_topk 0: the extra lengths are not read, as for one cache.
  EXPECT_EQ(uniform_blocks(two(nullptr, 2048, &extra, 0)), 32);
  EXPECT_EQ(request_blocks(two(&len, 128, &extra, 0), 3), 2);
}

// FlashMLA's production shapes on the H200's partitions: topk 128 + extra 1024 (b128 h128 q_len 2
// on 33, b128 h64 on 66, b64 h128 topk 128 + extra 512 on 66), the shape's blocks spread so that
// no partition takes more than the payload.
TEST(MlaScheduleModel1, ProductionShapesSpreadBothSelections) {
  struct Row {
    int batch, topk, extra, parts;
  };
  for (const Row r : {Row{128, 128, 1024, 33}, Row{128, 128, 1024, 66}, Row{64, 128, 512, 66},
                      Row{16, 128, 1024, 132}, Row{1, 128, 64, 132}}) {
    const TopkLists l = two(nullptr, r.topk, nullptr, r.extra);
    const Schedule s = run(r.batch, l, r.parts);
    expect_consistent(s, r.batch, l, r.parts);
    const int n = (r.topk + 63) / 64 + (r.extra + 63) / 64;
    const int payload = schedule_payload(r.batch * (n + kFixedOverheadBlocks), r.parts);
    int most = 0;
    for (const SparsePart& p : s.parts) {
      int mine = 0;
      for (int q = p.begin_req; q <= p.end_req; ++q) {
        int first = 0, last = 0;
        piece_blocks(p, l, q, first, last);
        mine += last - first + kFixedOverheadBlocks;
      }
      most = std::max(most, mine);
    }
    EXPECT_LE(most, payload) << r.batch << " x " << r.topk << " + " << r.extra;
    // Whether it cuts a request (the combine's launch) is what the pieces say.
    EXPECT_EQ(schedule_cuts_requests(r.batch, l, r.parts), s.slots > r.batch);
  }
}

// Ragged lengths of both caches, 0 in either or both, entries past their topk (clamped), random
// partitions: every block of both caches exactly once, slots in order; the schedule with no
// extra cache equals the one-cache scheduler's.
TEST(MlaScheduleModel1, RaggedBothCachesKeepTheInvariants) {
  std::mt19937_64 rng = test::make_rng(33);
  DECA_SEED_TRACE();
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 150);
    const int topk = 1 + static_cast<int>(rng() % 2048);
    const int extra_topk = static_cast<int>(rng() % 1100);
    const int parts = 1 + static_cast<int>(rng() % 140);
    std::vector<int> len(batch), extra(batch);
    for (int& v : len) v = static_cast<int>(rng() % (topk + 40)) - 20;
    for (int& v : extra) v = static_cast<int>(rng() % (extra_topk + 40)) - 20;
    const bool ragged = rng() % 4 != 0, extra_ragged = rng() % 4 != 0;
    const TopkLists l = two(ragged ? &len : nullptr, topk, extra_ragged ? &extra : nullptr, extra_topk);
    const Schedule s = run(batch, l, parts);
    expect_consistent(s, batch, l, parts);
    if (extra_topk == 0) {
      const Schedule one = run(batch, one_cache(l.topk_length, topk), parts);
      EXPECT_EQ(0, std::memcmp(s.parts.data(), one.parts.data(), parts * sizeof(SparsePart)));
      EXPECT_EQ(s.offsets, one.offsets);
    }
    if (HasFailure()) {
      ADD_FAILURE() << "batch " << batch << " topk " << topk << " + " << extra_topk << " parts " << parts;
      return;
    }
  }
}

// The stamp of a MODEL1 call carries the extra list (its count and whether lengths are given);
// a one-cache call's leaves those fields zero, as before the second cache.
TEST(MlaScheduleModel1, StampCarriesTheExtraList) {
  MlaSparseParams p{};
  p.batch = 3;
  p.q_len = 2;
  p.topk = 128;
  p.extra_topk = 1024;
  int lengths[3] = {1, 2, 3};
  p.extra_topk_length = lengths;
  const ScheduleStamp one = schedule_stamp(p, 66);
  EXPECT_EQ(one.extra_topk, 0);
  EXPECT_EQ(one.has_extra_topk_length, 0);
  const ScheduleStamp two_caches = schedule_stamp<true>(p, 66);
  EXPECT_EQ(two_caches.extra_topk, 1024);
  EXPECT_EQ(two_caches.has_extra_topk_length, 1);
  EXPECT_EQ(two_caches.topk, 128);
  EXPECT_EQ(two_caches.num_parts, 66);
  EXPECT_EQ(two_caches.has_topk_length, 0);
}

// The token's place in its page (kernels/mla/model1.cuh): rows back to back from 0, then 8 scale
// bytes a token, inside the packed page of roundup(page * 584, 576) bytes.
TEST(MlaScheduleModel1, TokenLayoutInAPage) {
  EXPECT_EQ(model1_row_offset(0), 0);
  EXPECT_EQ(model1_row_offset(1), 576);
  EXPECT_EQ(model1_scale_offset(2, 0), 1152);
  EXPECT_EQ(model1_scale_offset(2, 1), 1160);
  EXPECT_EQ(model1_scale_offset(64, 63), 64 * 576 + 63 * 8);
  for (int page : {1, 2, 5, 7, 64, 256}) {
    const long long packed = (page * 584LL + 575) / 576 * 576;
    EXPECT_LE(model1_scale_offset(page, page - 1) + kModel1ScaleBytes, packed) << page;
    EXPECT_LE(model1_row_offset(page - 1) + kModel1RowBytes, model1_scale_offset(page, 0)) << page;
    EXPECT_EQ(model1_row_offset(page - 1) % 16, 0) << "16-byte loads of a row";
  }
}

}  // namespace
}  // namespace deca::mla
