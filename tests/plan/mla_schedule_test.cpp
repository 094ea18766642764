// Table tests of the MLA decode scheduler (kernels/mla/schedule/schedule.cuh), run on the host:
// the seed's worked example partition by partition, then coverage invariants over ragged, empty
// and long requests, sparse (top-k lengths) and dense (cache lengths under max_seq_len).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "kernels/mla/schedule/schedule.cuh"
#include "plan/mla_schedule_check.hpp"

namespace deca::mla {
namespace {

Schedule run(int batch, int topk, const std::vector<int>* lengths, int num_parts) {
  return run(batch, one_cache(lengths ? lengths->data() : nullptr, topk), num_parts);
}

void expect_consistent(const Schedule& s, int batch, int topk, const std::vector<int>* lengths,
                       int num_parts) {
  expect_consistent(s, batch, one_cache(lengths ? lengths->data() : nullptr, topk), num_parts);
}

TEST(MlaSchedule, SeedExampleTwoRequestsOf128On66Partitions) {
  const Schedule s = run(2, 128, nullptr, 66);
  const SparsePart expected[] = {
      // begin_req, begin_block, end_req, end_block, begin_split, begin_count, end_count, pad
      {0, 0, 0, 1, 0, 2, 2, 0},
      {0, 1, 0, 2, 1, 2, 2, 0},
      {1, 0, 1, 1, 2, 2, 2, 0},
      {1, 1, 1, 2, 3, 2, 2, 0},
  };
  for (int i = 0; i < 4; ++i) {
    const SparsePart& p = s.parts[i];
    const SparsePart& e = expected[i];
    EXPECT_EQ(p.begin_req, e.begin_req) << i;
    EXPECT_EQ(p.begin_block, e.begin_block) << i;
    EXPECT_EQ(p.end_req, e.end_req) << i;
    EXPECT_EQ(p.end_block, e.end_block) << i;
    EXPECT_EQ(p.begin_split, e.begin_split) << i;
    EXPECT_EQ(p.begin_split_count, e.begin_split_count) << i;
    EXPECT_EQ(p.end_split_count, e.end_split_count) << i;
  }
  for (int i = 4; i < 66; ++i) {
    EXPECT_GT(s.parts[i].begin_req, s.parts[i].end_req) << "partition " << i << " has work";
    EXPECT_EQ(s.parts[i].begin_req, 2) << i;
  }
  EXPECT_EQ(s.offsets, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(s.slots, 4);
  expect_consistent(s, 2, 128, nullptr, 66);
}

TEST(MlaSchedule, OneLongRequestSpreadsOverAllPartitions) {
  // 512 blocks + 5 = 517 units over 132 partitions: payload 4 + 5, four blocks per partition.
  const Schedule s = run(1, 32768, nullptr, 132);
  EXPECT_EQ(s.slots, 128);
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(s.parts[i].begin_block, 4 * i) << i;
    EXPECT_EQ(s.parts[i].end_block, 4 * i + 4) << i;
    EXPECT_EQ(s.parts[i].begin_split, i) << i;
  }
  expect_consistent(s, 1, 32768, nullptr, 132);
}

TEST(MlaSchedule, RaggedLengthsIncludingZeroAndClamped) {
  // topk_length outside [0, topk] is clamped the way the kernels clamp it.
  const std::vector<int> lengths = {0, 1, 64, 65, 2048, 0, -3, 5000, 127, 4096, 0};
  for (int parts : {1, 2, 3, 7, 66, 132}) {
    const Schedule s = run(static_cast<int>(lengths.size()), 4096, &lengths, parts);
    expect_consistent(s, static_cast<int>(lengths.size()), 4096, &lengths, parts);
  }
  const Schedule one = run(static_cast<int>(lengths.size()), 4096, &lengths, 1);
  EXPECT_EQ(one.slots, static_cast<int>(lengths.size())) << "one partition never cuts";
}

TEST(MlaSchedule, AllEmptyAndBatchZero) {
  const std::vector<int> zeros(5, 0);
  const Schedule s = run(5, 2048, &zeros, 132);
  EXPECT_EQ(s.slots, 5);
  expect_consistent(s, 5, 2048, &zeros, 132);
  const Schedule none = run(0, 2048, nullptr, 8);
  EXPECT_EQ(none.slots, 0);
  for (const SparsePart& p : none.parts) EXPECT_GT(p.begin_req, p.end_req);
}

TEST(MlaSchedule, RandomShapesKeepTheInvariants) {
  std::mt19937_64 rng = test::make_rng(7);
  DECA_SEED_TRACE();
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 200);
    const int topk = 64 * (1 + static_cast<int>(rng() % 64));
    const int parts = 1 + static_cast<int>(rng() % 140);
    std::vector<int> lengths(batch);
    for (int& l : lengths) l = static_cast<int>(rng() % (topk + 1));
    const bool ragged = rng() % 2;
    const Schedule s = run(batch, topk, ragged ? &lengths : nullptr, parts);
    expect_consistent(s, batch, topk, ragged ? &lengths : nullptr, parts);
    // Same inputs, same bytes.
    const Schedule again = run(batch, topk, ragged ? &lengths : nullptr, parts);
    EXPECT_EQ(0, std::memcmp(s.parts.data(), again.parts.data(), parts * sizeof(SparsePart)));
    EXPECT_EQ(s.offsets, again.offsets);
    if (HasFailure()) {
      ADD_FAILURE() << "batch " << batch << " topk " << topk << " parts " << parts
                    << " ragged " << ragged;
      return;
    }
  }
}

// The one-pass walk the phased scheduler replaced (counts and slots kept during the walk): the
// phases must give the same bytes.
int one_pass_schedule(int batch, int topk, const int* len, int num_parts, SparsePart* parts,
                      int* offsets) {
  int total = 0;
  for (int r = 0; r < batch; ++r) {
    total += request_blocks(len, topk, r) + kFixedOverheadBlocks;
    offsets[r + 1] = 0;
  }
  offsets[0] = 0;
  const int payload = (total + num_parts - 1) / num_parts + kFixedOverheadBlocks;
  int req = 0, block = 0, piece = 0;
  for (int i = 0; i < num_parts; ++i) {
    SparsePart& part = parts[i];
    part = SparsePart{req, block, req - 1, 0, piece, 0, 0, 0};
    int remain = payload;
    while (req < batch) {
      const int n = request_blocks(len, topk, req);
      const int rest = n - block;
      if (rest + kFixedOverheadBlocks <= remain) {
        remain -= rest + kFixedOverheadBlocks;
        ++offsets[req + 1];
        part.end_req = req;
        part.end_block = n;
        ++req;
        block = 0;
        piece = 0;
        continue;
      }
      if (remain - kFixedOverheadBlocks > 0) {
        block += remain - kFixedOverheadBlocks;
        ++offsets[req + 1];
        ++piece;
        part.end_req = req;
        part.end_block = block;
      }
      break;
    }
  }
  for (int r = 0; r < batch; ++r) offsets[r + 1] += offsets[r];
  for (int i = 0; i < num_parts; ++i) {
    SparsePart& part = parts[i];
    if (part.begin_req > part.end_req) {
      part.begin_split = part.begin_split_count = part.end_split_count = 0;
      continue;
    }
    part.begin_split += offsets[part.begin_req];
    part.begin_split_count = offsets[part.begin_req + 1] - offsets[part.begin_req];
    part.end_split_count = offsets[part.end_req + 1] - offsets[part.end_req];
  }
  return offsets[batch];
}

// The phases as the kernel runs them (each parallel phase split over several "threads", run in
// reverse thread order) give the bytes of the one-pass walk, ragged or not.
TEST(MlaSchedule, PhasesInAnyThreadOrderMatchTheOnePassWalk) {
  std::mt19937_64 rng = test::make_rng(11);
  DECA_SEED_TRACE();
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 300);
    const int topk = 64 * (1 + static_cast<int>(rng() % 64));
    const int num_parts = 1 + static_cast<int>(rng() % 140);
    const int threads = 1 + static_cast<int>(rng() % 9);
    std::vector<int> lengths(batch);
    for (int& l : lengths) l = static_cast<int>(rng() % (topk + 80)) - 40;
    const int* len = rng() % 2 ? lengths.data() : nullptr;

    std::vector<SparsePart> want(num_parts);
    std::vector<int> want_off(batch + 1);
    const int want_slots = one_pass_schedule(batch, topk, len, num_parts, want.data(), want_off.data());

    std::vector<SparsePart> parts(num_parts, SparsePart{-7, -7, -7, -7, -7, -7, -7, -7});
    std::vector<int> off(batch + 1, -7);
    int total = 0;
    for (int t = threads - 1; t >= 0; --t) {
      total += schedule_stage_blocks(batch, one_cache(len, topk), off.data(), t, threads);
    }
    const int uniform = len == nullptr ? request_blocks(nullptr, topk, 0) : -1;
    if (uniform >= 0) EXPECT_EQ(total, batch * (uniform + kFixedOverheadBlocks));
    schedule_walk(batch, uniform, off.data(), total, num_parts, parts.data());
    for (int r = 0; r < batch; ++r) off[r + 1] = 1;
    off[0] = 0;
    for (int i = num_parts - 1; i >= 0; --i) {
      if (part_cuts_in(parts[i])) ++off[parts[i].begin_req + 1];
    }
    for (int r = 0; r < batch; ++r) off[r + 1] += off[r];
    for (int t = threads - 1; t >= 0; --t) schedule_fill_slots(num_parts, off.data(), parts.data(), t, threads);

    ASSERT_EQ(off, want_off) << "trial " << trial;
    ASSERT_EQ(off[batch], want_slots);
    ASSERT_EQ(0, std::memcmp(parts.data(), want.data(), num_parts * sizeof(SparsePart)))
        << "trial " << trial << " batch " << batch << " parts " << num_parts;
  }
}

// Whether a call without topk_length cuts a request (the backend launches the combine kernel
// only then): the anchor shapes on the H200's partitions (132 SMs; 66 clusters at 128 heads).
TEST(MlaSchedule, CutsRequestsDecidesTheCombine) {
  struct Row {
    int batch, topk, num_parts;
    bool cuts;
  };
  for (const Row r : {Row{128, 2048, 66, false}, Row{64, 2048, 66, false}, Row{128, 2048, 132, false},
                      Row{64, 2048, 132, true}, Row{1, 2048, 132, true}, Row{148, 16384, 66, true},
                      Row{128, 4096, 66, false}, Row{132, 64, 132, false}, Row{133, 64, 132, false},
                      Row{100, 2048, 66, true},
                      Row{3, 64, 8, false}}) {
    EXPECT_EQ(schedule_cuts_requests(r.batch, one_cache(nullptr, r.topk), r.num_parts), r.cuts)
        << r.batch << " x " << r.topk << " on " << r.num_parts;
    // The same as counting the pieces of the full schedule.
    const Schedule s = run(r.batch, r.topk, nullptr, r.num_parts);
    EXPECT_EQ(s.slots > r.batch, r.cuts);
  }
  // Its first-partition shortcut against the whole schedule's pieces, over random shapes.
  std::mt19937_64 rng = test::make_rng(13);
  DECA_SEED_TRACE();
  for (int i = 0; i < 2000; ++i) {
    const int batch = 1 + static_cast<int>(rng() % 300);
    const int topk = 1 + static_cast<int>(rng() % 8192);
    const int num_parts = 1 + static_cast<int>(rng() % 264);
    const Schedule s = run(batch, topk, nullptr, num_parts);
    EXPECT_EQ(schedule_cuts_requests(batch, one_cache(nullptr, topk), num_parts), s.slots > batch)
        << batch << " x " << topk << " on " << num_parts;
  }
}

// Dense decode schedules by the cache lengths: topk_length = cache_seqlens, topk = the plan's
// max_seq_len (the cap). Coverage over ragged lengths: 0, 1, a page +- 1, shorter than a block,
// 131072, and entries past the cap (clamped as the kernels clamp them).
TEST(MlaSchedule, DenseLengthsKeepTheInvariants) {
  const int cap = 131072;
  const std::vector<int> lengths = {1, 0, 63, 64, 65, 131072, 2047, 2048, 17, 131073, -1, 4096, 1};
  const int batch = static_cast<int>(lengths.size());
  for (int parts : {1, 5, 33, 66, 132}) {
    const Schedule s = run(batch, cap, &lengths, parts);
    expect_consistent(s, batch, cap, &lengths, parts);
  }
  EXPECT_EQ(request_len(lengths.data(), cap, 9), cap);
  EXPECT_EQ(request_len(lengths.data(), cap, 10), 0);
  EXPECT_EQ(request_blocks(lengths.data(), cap, 0), 1);
  EXPECT_EQ(request_blocks(lengths.data(), cap, 5), 2048);
}

// The dense anchor shapes on the H200 (132 SMs): how many partitions get work and the most blocks
// of 64 tokens any one takes (its time), against the least possible, ceil(blocks / partitions).
// A single long request (b1 h128 32768) and a small batch (b4 h16 16384) are cut across the
// partitions so that the longest one takes that least: 8 blocks. Every partition but 2 (resp. 4)
// then has work; giving those some too would leave the longest at 8 blocks, so it would gain
// nothing and add pieces to combine.
TEST(MlaSchedule, DenseAnchorShapesFillThePartitions) {
  struct Row {
    int batch, heads, len, q_len;
    int num_parts, busy, max_blocks;
    bool least;  // max_blocks is ceil(blocks / num_parts)
  };
  const Row rows[] = {
      {1, 128, 32768, 1, 66, 64, 8, true},        {4, 16, 16384, 1, 132, 128, 8, true},
      {128, 128, 8192, 1, 66, 66, 253, false},    {64, 128, 8192, 1, 66, 64, 128, false},
      {128, 128, 4096, 1, 66, 64, 128, false},    {128, 128, 8192, 2, 33, 33, 501, false},
      {128, 64, 8192, 1, 132, 128, 128, false},   {64, 64, 4096, 1, 132, 128, 34, false},
      {128, 16, 4096, 1, 132, 128, 64, false},
  };
  for (const Row& r : rows) {
    const int parts = decode_num_parts(132, r.q_len, r.heads);
    EXPECT_EQ(parts, r.num_parts) << r.batch << " x " << r.len;
    const std::vector<int> lengths(r.batch, r.len);
    const Schedule s = run(r.batch, r.len, &lengths, parts);
    expect_consistent(s, r.batch, r.len, &lengths, parts);
    int busy = 0, max_blocks = 0, blocks = 0;
    for (const SparsePart& p : s.parts) {
      if (p.begin_req > p.end_req) continue;
      ++busy;
      int mine = 0;
      for (int q = p.begin_req; q <= p.end_req; ++q) {
        int first = 0, last = 0;
        piece_blocks(p, one_cache(lengths.data(), r.len), q, first, last);
        mine += last - first;
      }
      max_blocks = std::max(max_blocks, mine);
      blocks += mine;
    }
    const std::string at = "b" + std::to_string(r.batch) + " h" + std::to_string(r.heads) + " " +
                           std::to_string(r.len) + " q_len " + std::to_string(r.q_len);
    EXPECT_EQ(busy, r.busy) << at;
    EXPECT_EQ(max_blocks, r.max_blocks) << at;
    EXPECT_EQ(blocks, r.batch * (r.len / 64)) << at;
    // Never more than the payload's blocks: ceil(cost / partitions) with the fixed overhead.
    EXPECT_LE(max_blocks, (r.batch * (r.len / 64 + kFixedOverheadBlocks) + parts - 1) / parts) << at;
    EXPECT_EQ(max_blocks == (blocks + parts - 1) / parts, r.least) << at;
    // The schedule the dense run reads (lengths given) is the uniform one's when they are equal.
    const Schedule uniform = run(r.batch, r.len, nullptr, parts);
    EXPECT_EQ(0, std::memcmp(s.parts.data(), uniform.parts.data(), parts * sizeof(SparsePart))) << at;
  }
}

// The pieces the combine merges per request at the small-batch rows (docs/perf-notes-mla.md,
// "Small batches": the default combine's time is about one dependent round trip per piece): one
// request of 32768 tokens at 128 heads is cut into 64 pieces, four of 16384 at 16 heads into 32
// each.
TEST(MlaSchedule, SmallBatchRowsPiecesPerRequest) {
  struct Row {
    int batch, heads, len;
    std::vector<int> pieces;
  };
  const Row rows[] = {{1, 128, 32768, {64}}, {4, 16, 16384, {32, 32, 32, 32}}};
  for (const Row& r : rows) {
    const int parts = decode_num_parts(132, 1, r.heads);
    const std::vector<int> lengths(r.batch, r.len);
    const Schedule s = run(r.batch, r.len, &lengths, parts);
    std::vector<int> pieces;
    for (int b = 0; b < r.batch; ++b) pieces.push_back(s.offsets[b + 1] - s.offsets[b]);
    EXPECT_EQ(pieces, r.pieces) << "b" << r.batch << " h" << r.heads;
  }
}

TEST(MlaSchedule, NumPartsFillsTheSmsOnce) {
  EXPECT_EQ(decode_num_parts(132, 1, 128), 66);
  EXPECT_EQ(decode_num_parts(132, 1, 64), 132);
  EXPECT_EQ(decode_num_parts(132, 2, 128), 33);
  EXPECT_EQ(decode_num_parts(132, 1, 100), 66);
  EXPECT_EQ(decode_num_parts(132, 4, 16), 33);
  EXPECT_EQ(decode_num_parts(4, 4, 128), 1);
}

}  // namespace
}  // namespace deca::mla
