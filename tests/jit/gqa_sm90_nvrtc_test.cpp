// The Hopper fp8 GQA kernels (kernels/gqa/sm90/: decode.cuh up to 16 rows, decode_rows.cuh at 32
// and 64) without a GPU (this runs in CI): which configurations a plan sends to them (sm_90a, fp8,
// head_dim 128, no beams), and NVRTC compiles their specializations for sm_90a over every rows
// value and feature switch: entry exported, nothing spilled, no wgmma serialized, two CTAs per SM
// (three at two stages).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/compile_check.hpp"
#include "jit/gqa_sm90_config.hpp"

namespace deca::cuda {
namespace {

constexpr auto config = &testing::sm90_config;

TEST(GqaSm90Nvrtc, PlansSendFp8HeadDim128WithoutBeamsToTheHopperKernel) {
  struct Row {
    int q_heads, kv_heads, head_dim, q_len, beams;
    DType kv;
    int arch;
    bool wgmma;
    int rows;
  };
  const Row table[] = {
      {64, 8, 128, 1, 1, DType::kFP8E4M3, 90, true, 8},    // l70: group 8
      {64, 4, 128, 1, 1, DType::kFP8E4M3, 90, true, 16},   // q235: group 16
      {64, 8, 128, 2, 1, DType::kFP8E4M3, 90, true, 16},   // q_len 2
      {64, 8, 128, 4, 1, DType::kFP8E4M3, 90, true, 32},   // spec q4: rows on M
      {64, 8, 128, 8, 1, DType::kFP8E4M3, 90, true, 64},   // spec q8: rows on M
      {64, 4, 128, 8, 1, DType::kFP8E4M3, 90, true, 64},   // 128 rows: two row blocks of 64
      {10, 2, 128, 1, 1, DType::kFP8E4M3, 90, true, 8},    // group 5, padded to 8
      {24, 2, 128, 1, 1, DType::kFP8E4M3, 90, true, 16},   // group 12
      {8, 8, 128, 1, 1, DType::kFP8E4M3, 90, true, 8},     // MHA
      {64, 8, 128, 1, 2, DType::kFP8E4M3, 90, false, 16},  // beams: portable
      {64, 8, 64, 1, 1, DType::kFP8E4M3, 90, false, 16},   // head_dim 64: portable
      {64, 8, 256, 1, 1, DType::kFP8E4M3, 90, false, 16},  // head_dim 256: portable
      {64, 8, 128, 1, 1, DType::kBF16, 90, false, 16},     // bf16: portable
      {64, 8, 128, 1, 1, DType::kINT8, 90, false, 16},     // int8: portable
      {64, 8, 128, 1, 1, DType::kFP8E4M3, 89, false, 16},  // no wgmma below sm_90
      {64, 8, 128, 1, 1, DType::kFP8E4M3, 80, false, 16},
  };
  for (const Row& r : table) {
    GqaConfig c = config(r.q_heads, r.kv_heads, r.head_dim, r.q_len, r.kv);
    c.beam_width = r.beams;
    const GqaKernelKey k = make_gqa_key(c, r.arch);
    EXPECT_EQ(k.wgmma(), r.wgmma) << k.name();
    EXPECT_EQ(k.rows, r.rows) << k.name();
    EXPECT_EQ(k.name().find("_wgmma") != std::string::npos, r.wgmma) << k.name();
    EXPECT_EQ(k.spec().source.find("kernels/gqa/sm90/entry.cuh") != std::string::npos, r.wgmma)
        << k.name();
    EXPECT_EQ(k.shape().tile, r.wgmma ? 128 : k.shape().tile) << k.name();
    EXPECT_EQ(k.rows_on_m, r.wgmma && r.rows >= 32) << k.name();
  }
  // A test's path_arch picks another arch's path on sm_90 (the portable kernel, rows back to
  // 16 / 32 / 64); the Hopper kernel needs both arches to be 90.
  GqaConfig c = config(64, 8, 128, 1, DType::kFP8E4M3);
  for (int path_arch : {80, 86, 89}) {
    const GqaKernelKey k = make_gqa_key(c, 90, 132, path_arch);
    EXPECT_FALSE(k.wgmma()) << k.name();
    EXPECT_EQ(k.rows, 16) << k.name();
    EXPECT_EQ(k.two_term(), path_arch == 89) << k.name();
  }
  EXPECT_TRUE(make_gqa_key(c, 90, 132, 90).wgmma());
  EXPECT_FALSE(make_gqa_key(c, 89, 132, 90).wgmma());
  EXPECT_FALSE(make_gqa_key(c, 80, 132, 89).two_term());  // the e4m3 mma.sync needs sm_89+
  const int rows[][3] = {{4, 8, 32}, {8, 8, 64}, {8, 16, 64}};  // q_len, group, rows per CTA
  for (const auto& r : rows) {
    GqaConfig s = config(8 * r[1], 8, 128, r[0], DType::kFP8E4M3);
    const GqaKernelKey k = make_gqa_key(s, 90);
    EXPECT_TRUE(k.wgmma()) << k.name();
    EXPECT_EQ(k.rows, r[2]) << k.name();
    EXPECT_TRUE(k.rows_on_m) << k.name();
    EXPECT_NE(k.name().find("_wgmma_rm"), std::string::npos) << k.name();
    EXPECT_NE(k.spec().source.find("kRowsOnM = true;"), std::string::npos) << k.spec().source;
    EXPECT_EQ(k.shape().min_ctas, 2) << k.name();
  }
  EXPECT_FALSE(make_gqa_key(c, 90).rows_on_m);  // 8 rows: on N
}

// Shared memory: two CTAs per SM at every rows value (rows on N at 8 and 16, on M at 32 and 64), at
// least two stages, the epilogue's merge area inside the stages it reuses.
TEST(GqaSm90Nvrtc, ShapeKeepsTwoCtasPerSm) {
  for (int rows : {8, 16, -32, -64}) {
    const bool on_m = rows < 0;
    rows = on_m ? -rows : rows;
    const gqa::Shape s = gqa::sm90::make_shape(rows, 0, on_m);
    const gqa::sm90::SmemPlan plan = gqa::sm90::make_plan(rows, s.stages, on_m);
    if (on_m) {
      EXPECT_EQ(plan.vt % 1024, 0) << rows;
      EXPECT_EQ(plan.q_lo - plan.q_hi, 64 * 128) << rows;  // 64 operand rows whatever the rows
      EXPECT_EQ(plan.p_lo, plan.p_hi) << rows;              // no P tiles
      EXPECT_EQ(plan.end - plan.q_inv, 64 * 4) << rows;
    }
    std::printf("[sm90 shape] rows %2d: stages %d, smem %d B, min_ctas %d\n", rows, s.stages,
                s.smem_bytes, s.min_ctas);
    EXPECT_GE(s.stages, 2) << rows;
    EXPECT_EQ(s.min_ctas, 2) << rows;
    EXPECT_LE(2 * (s.smem_bytes + 1024), 228 * 1024) << rows;
    EXPECT_LE(s.merge_bytes, s.pipe_bytes) << rows;
    EXPECT_EQ(s.tile, 128) << rows;
  }
  EXPECT_EQ(gqa::sm90::make_shape(8).stages, 3);
  EXPECT_EQ(gqa::sm90::make_shape(16).stages, 3);
  // Two stages at 8 or 16 rows: three CTAs per SM.
  EXPECT_EQ(gqa::sm90::make_shape(8, 2).min_ctas, 3);
  EXPECT_EQ(gqa::sm90::make_shape(16, 2).min_ctas, 3);
}

// Two stages (three CTAs per SM) where the grid fills three per SM at 8 or 16 rows, else the
// default; the plan's key carries the choice in its name.
TEST(GqaSm90Nvrtc, StagesFollowTheGrid) {
  struct Row {
    int rows;
    long long units;
    int sms;
    int stages;
  };
  const Row table[] = {{8, 792, 132, 2},  {8, 396, 132, 2},   {8, 395, 132, 0},  {16, 4480, 132, 2},
                       {16, 256, 132, 0}, {32, 5000, 132, 0}, {64, 5000, 132, 0}, {8, 396, 114, 2},
                       {8, 300, 100, 2},  {8, 1, 132, 0}};
  for (const Row& r : table) {
    EXPECT_EQ(gqa::sm90::stages_for_grid(r.rows, r.units, r.sms), r.stages)
        << r.rows << " rows, " << r.units << " units, " << r.sms << " SMs";
  }
  GqaConfig c = config(64, 8, 128, 1, DType::kFP8E4M3);
  c.max_batch = 99;  // l70-b99-4k: 792 units
  GqaKernelKey k = make_gqa_key(c, 90, 132);
  EXPECT_EQ(k.stages, 2) << k.name();
  EXPECT_NE(k.name().find("_wgmma_st2"), std::string::npos) << k.name();
  EXPECT_NE(k.spec().source.find("kStages = 2;"), std::string::npos) << k.spec().source;
  EXPECT_EQ(k.shape().min_ctas, 3) << k.name();
  c.split_mode = SplitMode::kFixed, c.split_tokens = 512;  // the fixed split: the same kernel
  EXPECT_EQ(make_gqa_key(c, 90, 132).name(), k.name());
  c.split_mode = SplitMode::kAuto, c.split_tokens = 0;
  c.num_q_heads = 64, c.num_kv_heads = 4, c.max_batch = 64;  // q235-b64-4k: 256 units
  k = make_gqa_key(c, 90, 132);
  EXPECT_EQ(k.stages, 0) << k.name();
  EXPECT_EQ(k.name().find("_st"), std::string::npos) << k.name();
}

TEST(GqaSm90Nvrtc, SpecializationsCompileWithoutSpillsOrSerializedWgmma) {
  std::vector<GqaKernelKey> keys;
  auto key = [&](int group, int rows) {
    GqaKernelKey k;
    k.arch = 90, k.head_dim = 128, k.group = group, k.rows = rows, k.page_size = 64;
    k.q_dtype = 0, k.kv_dtype = 3, k.out_dtype = 0;
    k.fp8_mma = kv::kWgmma;
    k.rows_on_m = rows >= 32;  // as the plan sets it
    return k;
  };
  keys.push_back(key(8, 8));    // l70
  keys.push_back(key(16, 16));  // q235
  GqaKernelKey spec4 = key(8, 32);
  spec4.tree = true;
  keys.push_back(spec4);
  GqaKernelKey spec8 = key(8, 64);
  spec8.tree = true, spec8.window = true;
  keys.push_back(spec8);
  GqaKernelKey gpt = key(5, 8);  // a group that is not a power of two, window, soft-cap
  gpt.window = true, gpt.softcap = true, gpt.page_size = 48;
  keys.push_back(gpt);
  GqaKernelKey fp16 = key(12, 16);  // fp16 q, fp8 out
  fp16.q_dtype = 1, fp16.out_dtype = 3, fp16.page_size = 1;
  keys.push_back(fp16);
  for (int rows : {8, 64}) {
    GqaKernelKey chk = key(8, rows);
    chk.checked = true, chk.tree = rows == 64;
    keys.push_back(chk);
  }
  GqaKernelKey st2 = key(8, 8);  // two stages (three CTAs per SM), masks, checked
  st2.stages = 2, st2.window = true, st2.checked = true;
  keys.push_back(st2);
  // Rows on M (decode_rows.cuh, 32 and 64 rows): plain; masks with soft-cap and checked; a page
  // size that is not a power of two and page 1 with fp16 q and fp8 out; a group that is not a
  // power of two.
  for (int rows : {32, 64}) {
    GqaKernelKey k = key(8, rows);
    k.rows_on_m = true;
    keys.push_back(k);
    k.tree = true, k.window = true, k.softcap = true, k.checked = true, k.page_size = 48;
    keys.push_back(k);
    k = key(rows == 32 ? 10 : 5, rows);
    k.rows_on_m = true, k.page_size = 1, k.q_dtype = 1, k.out_dtype = 3;
    keys.push_back(k);
  }
  for (const GqaKernelKey& k : keys) {
    ASSERT_TRUE(k.wgmma()) << k.name();
    EXPECT_EQ(k.name().find("_rm") != std::string::npos, k.rows_on_m) << k.name();
    EXPECT_EQ(k.shape().threads, 128) << k.name();
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::testing::compile_and_check(spec);
    jit::testing::expect_no_spills(r, spec.name);
    EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
  }
}

}  // namespace
}  // namespace deca::cuda
