// Table tests of the split-KV policy and the kernel tile shapes (pure functions, no GPU).
#include <gtest/gtest.h>

#include "kernels/gqa/sm80/traits.cuh"
#include "plan/gqa_split.hpp"

namespace deca::plan {
namespace {

TEST(CtasPerSm, LimitedByRegistersSharedMemoryOrThreads) {
  const SmLimits h100;  // 64K registers, 228 KB shared memory, 2048 threads, 32 CTAs
  struct Row {
    int regs, threads, smem, expected;
  } rows[] = {
      {226, 128, 104448, 2},  // the bf16 d128 kernel: 232 regs/thread after rounding -> 2
      {128, 128, 104448, 2},  // shared memory binds: 2 x (102 + 1) KB fits, 3 do not
      {128, 128, 40000, 4},   // registers bind: 128 x 128 = 16K per CTA
      {32, 128, 1000, 16},    // threads bind: 2048 / 128
      {32, 32, 0, 32},        // the CTA cap
      {255, 128, 232448, 1},  // one CTA with all shared memory
      {255, 1024, 0, 1},      // too many registers for even one: still reported as 1
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ctas_per_sm(r.regs, r.threads, r.smem, h100), r.expected)
        << "regs " << r.regs << " threads " << r.threads << " smem " << r.smem;
  }
}

SplitInputs inputs(long long units, int keys, int tile = 64, int per_sm = 2, double cta_rate = 1.0) {
  SplitInputs in;
  in.units = units;
  in.max_keys = keys;
  in.tile = tile;
  in.sm_count = 132;
  in.ctas_per_sm = per_sm;
  in.max_splits = 256;
  in.cta_rate = cta_rate;
  return in;
}

// One CTA's rate in SM shares on the two Hoppers measured, from the memory clock and bus width
// they report (H100 2619 MHz x 5120 bits, H200 3201 MHz x 6016 bits; 132 SMs).
const double kH100Bf16 = cta_rate(gqa_cta_bytes_per_us(2), 3.352e6, 132);
const double kH100Fp8 = cta_rate(gqa_cta_bytes_per_us(1), 3.352e6, 132);
const double kH200Bf16 = cta_rate(gqa_cta_bytes_per_us(2), 4.814e6, 132);
const double kH200Fp8 = cta_rate(gqa_cta_bytes_per_us(1), 4.814e6, 132);

TEST(CtaRate, InSmSharesOfTheCopyRate) {
  // H100: a bf16 CTA streams 1.9 shares, an fp8 one 1.2; on H200's faster DRAM the fp8 CTA
  // falls below its share (0.8), so two resident CTAs pay there and not on H100.
  EXPECT_NEAR(kH100Bf16, 1.86, 0.02);
  EXPECT_NEAR(kH100Fp8, 1.17, 0.02);
  EXPECT_NEAR(kH200Bf16, 1.30, 0.02);
  EXPECT_NEAR(kH200Fp8, 0.81, 0.02);
  // A device that reports no DRAM rate: neutral.
  EXPECT_EQ(cta_rate(gqa_cta_bytes_per_us(1), 0.0, 132), 1.0);
  EXPECT_EQ(cta_rate(0.0, 3.352e6, 132), 1.0);
}

TEST(ChooseNumSplits, Table) {
  struct Row {
    const char* what;
    SplitInputs in;
    int expected;
  } rows[] = {
      // Enough CTAs already: no split (99 x 8 = 792 = 3 full waves of 264).
      {"l70-b99-4k", inputs(99 * 8, 4096), 1},
      {"l70-b560-2k", inputs(560 * 8, 2048), 1},
      {"l70-b960-512", inputs(960 * 8, 512, 128), 1},
      // One long request: one CTA per SM takes the SM's share (16 splits: 128 CTAs); 33 splits
      // (264 CTAs, two per SM) stream the same tiles per SM a little slower and merge twice as
      // many (the H100 sweep agrees).
      {"l70-b1-128k bf16 H100", inputs(8, 131072, 64, 2, kH100Bf16), 16},
      {"l70-b1-128k bf16 H200", inputs(8, 131072, 64, 2, kH200Bf16), 16},
      {"l70-b1-128k fp8 H100", inputs(8, 131072, 128, 2, kH100Fp8), 16},
      // On H200 one fp8 CTA streams 0.8 of its SM's share: a second one per SM pays.
      {"l70-b1-128k fp8 H200", inputs(8, 131072, 128, 2, kH200Fp8), 32},
      {"l70-b1-16k bf16 H100", inputs(8, 16384, 64, 2, kH100Bf16), 16},
      {"l70-b1-16k fp8 H100", inputs(8, 16384, 128, 2, kH100Fp8), 16},
      {"l70-b1-16k fp8 H200", inputs(8, 16384, 128, 2, kH200Fp8), 32},
      // tp8: 32 requests x 1 kv head: 4 splits put one CTA on 128 SMs.
      {"l70tp8-b32-8k bf16 H100", inputs(32, 8192, 64, 2, kH100Bf16), 4},
      {"l70tp8-b32-8k fp8 H200", inputs(32, 8192, 128, 2, kH200Fp8), 8},
      // 512 units at three per SM overflow one wave (396 slots): three splits even out the
      // second wave (faster than unsplit on H100).
      {"l8-b64-8k", inputs(512, 8192, 64, 3, kH100Bf16), 3},
      {"mha-b64-4k", inputs(64 * 32, 4096, 64, 3, kH100Bf16), 2},
      // Short requests never split past their tile count.
      {"one tile", inputs(1, 64), 1},
      // Two tiles: halving them saves one tile but costs a merge: not worth it.
      {"two tiles", inputs(1, 100), 1},
      // A lone short request on an idle GPU: one tile per split.
      {"eight tiles alone", inputs(1, 512), 8},
      // Nothing to do.
      {"empty batch", inputs(0, 4096), 1},
  };
  for (const Row& r : rows) EXPECT_EQ(choose_num_splits(r.in), r.expected) << r.what;
}

TEST(ChooseNumSplits, NeverExceedsTheCapOrTheTileCount) {
  for (double rate : {0.5, 1.0, 2.0}) {
    for (long long units : {1LL, 3LL, 8LL, 40LL, 264LL, 1000LL}) {
      for (int keys : {1, 64, 65, 1000, 50000, 1 << 20}) {
        SplitInputs in = inputs(units, keys, 64, 2, rate);
        in.max_splits = 48;
        const int s = choose_num_splits(in);
        EXPECT_GE(s, 1);
        EXPECT_LE(s, 48);
        EXPECT_LE(s, std::max(1, (keys + 63) / 64));
      }
    }
  }
}

TEST(ChooseNumSplits, DependsOnlyOnPromisedMaxima) {
  // Same inputs, same answer: the plan is graph-stable (nothing live goes in).
  EXPECT_EQ(choose_num_splits(inputs(8, 100000)), choose_num_splits(inputs(8, 100000)));
  // More CTAs resident per SM -> at least as many splits for a lone request.
  EXPECT_GE(choose_num_splits(inputs(8, 100000, 64, 3)), choose_num_splits(inputs(8, 100000, 64, 2)));
  // A slower CTA -> at least as many splits (more CTAs per SM to reach the DRAM's rate).
  for (long long units : {1LL, 8LL, 32LL, 100LL}) {
    EXPECT_GE(choose_num_splits(inputs(units, 65536, 64, 2, 0.6)),
              choose_num_splits(inputs(units, 65536, 64, 2, 1.5)))
        << units;
  }
}

TEST(FixedSplits, RoundUpToTilesAndCover) {
  EXPECT_EQ(fixed_split_tokens(0, 64), 64);
  EXPECT_EQ(fixed_split_tokens(1, 64), 64);
  EXPECT_EQ(fixed_split_tokens(64, 64), 64);
  EXPECT_EQ(fixed_split_tokens(65, 64), 128);
  EXPECT_EQ(fixed_split_tokens(500, 128), 512);
  EXPECT_EQ(fixed_num_splits(0, 256), 1);
  EXPECT_EQ(fixed_num_splits(256, 256), 1);
  EXPECT_EQ(fixed_num_splits(257, 256), 2);
  EXPECT_EQ(fixed_num_splits(8192, 512), 16);
}

TEST(GqaShape, TilesKeepAboutThirtyTwoKilobytesPerStage) {
  struct Row {
    int head_dim, rows, kv_dtype;
    int tile, stages, chunk;
  } rows[] = {
      {128, 16, 0, 64, 3, 16},   // bf16: 64 tokens x 256 B x (K, V)
      {128, 16, 3, 128, 3, 32},  // fp8: twice the tokens in the same bytes
      {64, 16, 0, 128, 3, 32},
      {256, 16, 0, 64, 3, 16},   // 16 tokens per warp at least
      {128, 64, 3, 128, 3, 32},  // one warp column: the whole tile per warp, 32-token steps
      {128, 32, 0, 64, 3, 32},
  };
  for (const Row& r : rows) {
    const gqa::Shape s = gqa::make_shape(r.head_dim, r.rows, r.kv_dtype);
    EXPECT_EQ(s.tile, r.tile) << r.head_dim << "/" << r.rows << "/" << r.kv_dtype;
    EXPECT_EQ(s.stages, r.stages) << r.head_dim << "/" << r.rows << "/" << r.kv_dtype;
    EXPECT_EQ(s.chunk, r.chunk) << r.head_dim << "/" << r.rows << "/" << r.kv_dtype;
    EXPECT_LE(s.smem_bytes, 227 * 1024);
    EXPECT_EQ(s.row_stride % 32, 16) << "rows must be an odd number of 16-byte chunks";
    EXPECT_EQ(s.tile % (16 * s.warps_n), 0);
  }
  EXPECT_EQ(gqa::rows_per_cta(1), 16);
  EXPECT_EQ(gqa::rows_per_cta(16), 16);
  EXPECT_EQ(gqa::rows_per_cta(17), 32);
  EXPECT_EQ(gqa::rows_per_cta(64), 64);
  EXPECT_EQ(gqa::rows_per_cta(65), 64);
}

}  // namespace
}  // namespace deca::plan
