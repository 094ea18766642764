// Table tests of the MLA combine choice (src/plan/mla_combine.hpp): the rows measured on the H200
// with both combines (docs/perf-notes-mla.md, "The split combine"), each with the combine that
// was faster there, and the rule's edges.
#include <gtest/gtest.h>

#include <string>

#include "kernels/mla/schedule/schedule.cuh"
#include "plan/mla_combine.hpp"

namespace deca::plan {
namespace {

struct Row {
  const char* name;
  int batch, heads, q_len, blocks;  // blocks of 64 tokens (dense) or indices (sparse) a request
  int pieces;                       // mla_uniform_pieces on the H200's 132 SMs
  bool split;                       // the faster combine there
};

// H200 medians, default combine -> split combine, where the decode kernel was the same in both
// runs: b4 h16 16k e4m3 46.5 -> 36.0 us; b64 h64 t2k 64.4 -> 78.1; b64 h64 4k e4m3 107.9 -> 121.4;
// b148 h128 t16k 1301.2 -> 1332.8; b128 h64 8k e4m3 352.4 -> 359.4; b128 h16 4k e4m3 179.1 ->
// 181.2; b128 h128 t2k q2 315.1 -> 315.5; MODEL1 b148 t16k q2 2631 -> 2699. b1 h128 32k (64
// pieces, the fixed-cost model's largest combine) ran only beside the split consumers; its
// combine is the b4 row's case twice over.
const Row kRows[] = {
    {"dense b4 h16 16k", 4, 16, 1, 256, 32, true},
    {"dense b1 h128 32k", 1, 128, 1, 512, 64, true},
    {"sparse b64 h64 t2k", 64, 64, 1, 32, 2, false},
    {"dense b64 h64 4k", 64, 64, 1, 64, 2, false},
    {"sparse b148 h128 t16k", 148, 128, 1, 256, 1, false},
    {"dense b128 h64 8k", 128, 64, 1, 128, 1, false},
    {"dense b128 h16 4k", 128, 16, 1, 64, 1, false},
    {"sparse b128 h128 t2k q2", 128, 128, 2, 32, 1, false},
    {"model1 b148 h128 t16k q2", 148, 128, 2, 256, 1, false},
    {"dense b4 h16 var q4 (45118 max)", 4, 16, 4, 705, 9, false},
};

TEST(MlaCombinePlan, MeasuredRowsTakeTheFasterCombine) {
  for (const Row& r : kRows) {
    const int parts = mla::decode_num_parts(132, r.q_len, r.heads);
    EXPECT_EQ(mla_uniform_pieces(r.batch, r.blocks, parts), r.pieces) << r.name;
    EXPECT_EQ(mla_split_combine(r.batch, r.blocks, parts), r.split) << r.name;
  }
}

// The cases of tests/gpu/mla_small_batch_gpu_test.cpp whose plan of max_batch = batch must take
// the split combine (that test compares it bitwise with a plan of max_batch 64, which must not):
// dense rows (blocks: the block table's columns, ceil(longest / 64) + 1), the sparse cases (8192
// indices), the +inf cases and the graph case.
TEST(MlaCombinePlan, GpuSuiteCasesTakeTheCombineTheyTest) {
  struct Case {
    int batch, heads, q_len, blocks;
  };
  const Case split_cases[] = {
      {1, 128, 1, 513}, {4, 16, 1, 257}, {3, 100, 1, 142}, {3, 64, 2, 142}, {2, 16, 1, 314},
      {1, 64, 4, 189},  {5, 64, 1, 189}, {3, 16, 1, 128},  {3, 16, 2, 128}, {3, 64, 2, 128},
      {3, 128, 1, 128}, {3, 128, 1, 470}, {3, 16, 2, 470}, {2, 16, 1, 2049}};
  for (const Case& c : split_cases) {
    const int parts = mla::decode_num_parts(132, c.q_len, c.heads);
    EXPECT_TRUE(mla_split_combine(c.batch, c.blocks, parts)) << c.batch << " x h" << c.heads << " q" << c.q_len;
    EXPECT_FALSE(mla_split_combine(64, c.blocks, parts)) << "max_batch 64, h" << c.heads << " q" << c.q_len;
  }
  // The +inf test's q_len 3 dense case stays on the warp-per-row combine.
  EXPECT_FALSE(mla_split_combine(4, 470, mla::decode_num_parts(132, 3, 16)));
  EXPECT_FALSE(mla_split_combine(4, 470, mla::decode_num_parts(132, 3, 128)));
}

// The threshold: 16 pieces a request on average, from the schedule itself (not the partition
// count alone: short requests are cut into at most their block count).
TEST(MlaCombinePlan, ThresholdIsSixteenPiecesPerRequest) {
  EXPECT_EQ(mla_uniform_pieces(3, 32, 66), 16);
  EXPECT_TRUE(mla_split_combine(3, 32, 66));
  EXPECT_EQ(mla_uniform_pieces(4, 32, 66), 11);
  EXPECT_FALSE(mla_split_combine(4, 32, 66));
  // One request of 8 blocks on 132 partitions: 8 pieces, whatever the partition count.
  EXPECT_EQ(mla_uniform_pieces(1, 8, 132), 8);
  EXPECT_FALSE(mla_split_combine(1, 8, 132));
  EXPECT_EQ(mla_uniform_pieces(1, 16, 132), 16);
  EXPECT_TRUE(mla_split_combine(1, 16, 132));
  // Fewer partitions than the threshold never split a request 16 ways.
  EXPECT_FALSE(mla_split_combine(1, 4096, 15));
  EXPECT_EQ(mla_uniform_pieces(1, 4096, 16), 16);
  EXPECT_TRUE(mla_split_combine(1, 4096, 16));
}

TEST(MlaCombinePlan, EdgesAndLargeInputs) {
  EXPECT_EQ(mla_uniform_pieces(1, 0, 132), 1);  // an empty request: its one (empty) piece
  EXPECT_FALSE(mla_split_combine(1, 0, 132));
  EXPECT_EQ(mla_uniform_pieces(1, 1, 132), 1);
  EXPECT_EQ(mla_uniform_pieces(0, 64, 132), 1);
  EXPECT_EQ(mla_uniform_pieces(4, 64, 0), 1);
  // Lengths past the clamp: the pieces no longer change (2^31 / 64 blocks would overflow the
  // schedule's costs unclamped).
  EXPECT_EQ(mla_uniform_pieces(2, 1 << 25, 132), mla_uniform_pieces(2, 1 << 16, 132));
  EXPECT_TRUE(mla_split_combine(2, 1 << 25, 132));
  // A large batch is answered without scheduling it.
  EXPECT_FALSE(mla_split_combine(1 << 30, 1 << 25, 132));
  EXPECT_FALSE(mla_split_combine(9, 4096, 132));  // 132 - 1 < 15 * 9
}

}  // namespace
}  // namespace deca::plan
