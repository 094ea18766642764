// The Hopper fp8 GQA kernel (kernels/gqa/sm90/decode.cuh, issue 8) without a GPU (this runs in
// CI): which configurations a plan sends to it (sm_90a, fp8, head_dim 128, no beams; rows per CTA
// on wgmma's N), and NVRTC compiles its specializations for sm_90a over every rows value and
// feature switch: entry exported, nothing spilled, no wgmma serialized, two CTAs per SM.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"
#include "jit/scoped_env.hpp"

namespace deca::cuda {
namespace {

GqaConfig config(int q_heads, int kv_heads, int head_dim, int q_len, DType kv) {
  GqaConfig c;
  c.num_q_heads = q_heads, c.num_kv_heads = kv_heads, c.head_dim = head_dim;
  c.page_size = 64, c.max_batch = 8, c.max_seq_len = 4096, c.max_q_len = q_len;
  c.kv_dtype = kv;
  return c;
}

TEST(GqaSm90Nvrtc, PlansSendFp8HeadDim128WithoutBeamsToTheHopperKernel) {
  jit::testing::ScopedEnv env("DECA_GQA_FP8_MMA", nullptr);
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
  // The knob forces the portable path (rows back to 16 / 32 / 64) or asks for this one, which
  // only applies where it can.
  GqaConfig c = config(64, 8, 128, 1, DType::kFP8E4M3);
  {
    jit::testing::ScopedEnv knob("DECA_GQA_FP8_MMA", "widen_ldsm");
    const GqaKernelKey k = make_gqa_key(c, 90);
    EXPECT_FALSE(k.wgmma()) << k.name();
    EXPECT_EQ(k.rows, 16) << k.name();
  }
  {
    // The tuning knobs apply where their variant exists.
    jit::testing::ScopedEnv ov("DECA_GQA_SM90_OVERLAP", "1");
    EXPECT_TRUE(make_gqa_key(c, 90).overlap);
    GqaConfig spec8 = config(64, 8, 128, 8, DType::kFP8E4M3);  // 64 rows: not overlapped
    jit::testing::ScopedEnv mma("DECA_GQA_FP8_MMA", "wgmma");
    EXPECT_FALSE(make_gqa_key(spec8, 90).overlap);
    jit::testing::ScopedEnv wg("DECA_GQA_SM90_WG", "2");
    const GqaKernelKey k = make_gqa_key(c, 90);
    EXPECT_EQ(k.warpgroups, 2) << k.name();
    EXPECT_FALSE(k.overlap) << k.name();  // one warpgroup only
    EXPECT_EQ(make_gqa_key(spec8, 90).warpgroups, 1);  // 64 rows: one warpgroup
  }
  {
    jit::testing::ScopedEnv knob("DECA_GQA_FP8_MMA", "wgmma");
    EXPECT_TRUE(make_gqa_key(c, 90).wgmma());
    EXPECT_FALSE(make_gqa_key(c, 89).wgmma());
    c.kv_dtype = DType::kINT8;
    EXPECT_FALSE(make_gqa_key(c, 90).wgmma());
    c.kv_dtype = DType::kFP8E4M3;
    const int rows[][3] = {{4, 8, 32}, {8, 8, 64}, {8, 16, 64}};  // q_len, group, rows per CTA
    for (const auto& r : rows) {
      GqaConfig s = config(8 * r[1], 8, 128, r[0], DType::kFP8E4M3);
      GqaKernelKey k = make_gqa_key(s, 90);
      EXPECT_TRUE(k.wgmma()) << k.name();
      EXPECT_EQ(k.rows, r[2]) << k.name();
      // 32 and 64 rows take the rows-on-M kernel, unless the knob keeps them on N.
      EXPECT_TRUE(k.rows_on_m) << k.name();
      EXPECT_NE(k.name().find("_wgmma_rm"), std::string::npos) << k.name();
      EXPECT_NE(k.spec().source.find("kRowsOnM = true;"), std::string::npos) << k.spec().source;
      EXPECT_EQ(k.shape().min_ctas, 2) << k.name();
      jit::testing::ScopedEnv on_n("DECA_GQA_SM90_ROWS_M", "0");
      k = make_gqa_key(s, 90);
      EXPECT_FALSE(k.rows_on_m) << k.name();
      EXPECT_EQ(k.name().find("_rm"), std::string::npos) << k.name();
    }
    EXPECT_FALSE(make_gqa_key(c, 90).rows_on_m);  // 8 rows: on N
  }
}

// Shared memory: two CTAs per SM at every rows value (rows on N or, at 32 and 64, on M), at
// least two stages, the epilogue's merge area inside the stages it reuses.
TEST(GqaSm90Nvrtc, ShapeKeepsTwoCtasPerSm) {
  for (int rows : {8, 16, 32, 64, -32, -64}) {
    const bool on_m = rows < 0;
    rows = on_m ? -rows : rows;
    const gqa::Shape s = gqa::sm90::make_shape(rows, 0, 1, on_m);
    const gqa::sm90::SmemPlan plan = gqa::sm90::make_plan(rows, s.stages, 1, on_m);
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
// default; the plan's key carries the choice in its name. The balanced schedule (a knob, up to 16
// rows outside the fixed split) fills every SM with three whatever the grid: two stages.
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
  jit::testing::ScopedEnv env("DECA_GQA_FP8_MMA", nullptr);
  jit::testing::ScopedEnv stages("DECA_GQA_SM90_STAGES", nullptr);
  GqaConfig c = config(64, 8, 128, 1, DType::kFP8E4M3);
  c.max_batch = 99;  // l70-b99-4k: 792 units
  jit::testing::ScopedEnv bal_unset("DECA_GQA_SM90_BALANCED", nullptr);
  GqaKernelKey k = make_gqa_key(c, 90, 132);
  EXPECT_FALSE(k.balanced) << k.name();
  EXPECT_EQ(k.stages, 2) << k.name();
  EXPECT_NE(k.name().find("_wgmma_st2"), std::string::npos) << k.name();
  EXPECT_NE(k.spec().source.find("kStages = 2;"), std::string::npos) << k.spec().source;
  EXPECT_NE(k.spec().source.find("kBalanced = false;"), std::string::npos) << k.spec().source;
  EXPECT_EQ(k.shape().min_ctas, 3) << k.name();
  c.num_q_heads = 64, c.num_kv_heads = 4, c.max_batch = 64;  // q235-b64-4k: 256 units
  k = make_gqa_key(c, 90, 132);
  EXPECT_EQ(k.stages, 0) << k.name();
  EXPECT_EQ(k.name().find("_st"), std::string::npos) << k.name();
  jit::testing::ScopedEnv on("DECA_GQA_SM90_BALANCED", "1");
  k = make_gqa_key(c, 90, 132);
  EXPECT_TRUE(k.balanced) << k.name();
  EXPECT_EQ(k.stages, 2) << k.name();
  EXPECT_NE(k.name().find("_wgmma_st2_bal"), std::string::npos) << k.name();
  EXPECT_NE(k.spec().source.find("kBalanced = true;"), std::string::npos) << k.spec().source;
  c.split_mode = SplitMode::kFixed, c.split_tokens = 512;
  k = make_gqa_key(c, 90, 132);
  EXPECT_FALSE(k.balanced) << k.name();
  EXPECT_EQ(k.name().find("_bal"), std::string::npos) << k.name();
  // Not with the knobs' variants, nor beyond 16 rows.
  c.split_mode = SplitMode::kAuto;
  {
    jit::testing::ScopedEnv ov("DECA_GQA_SM90_OVERLAP", "1");
    EXPECT_FALSE(make_gqa_key(c, 90, 132).balanced);
  }
  {
    jit::testing::ScopedEnv mma("DECA_GQA_FP8_MMA", "wgmma");
    GqaConfig spec4 = config(64, 8, 128, 4, DType::kFP8E4M3);  // 32 rows
    EXPECT_FALSE(make_gqa_key(spec4, 90, 132).balanced);
  }
}

TEST(GqaSm90Nvrtc, SpecializationsCompileWithoutSpillsOrSerializedWgmma) {
  std::vector<GqaKernelKey> keys;
  auto key = [&](int group, int rows) {
    GqaKernelKey k;
    k.arch = 90, k.head_dim = 128, k.group = group, k.rows = rows, k.page_size = 64;
    k.q_dtype = 0, k.kv_dtype = 3, k.out_dtype = 0;
    k.fp8_mma = kv::kWgmma;
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
  // Two warpgroups per CTA (DECA_GQA_SM90_WG=2, up to 32 rows: at 64 the 128 registers a thread
  // has at two CTAs of 256 threads would spill): masks, checked, two stages.
  for (int rows : {8, 16, 32}) {
    GqaKernelKey k = key(8, rows);
    k.warpgroups = 2, k.tree = rows >= 32, k.checked = rows == 16, k.stages = rows == 8 ? 2 : 0;
    keys.push_back(k);
  }
  // The overlapped QK (DECA_GQA_SM90_OVERLAP=1, one warpgroup, up to 16 rows): two and three
  // stages, masks with soft-cap, checked.
  for (int rows : {8, 16}) {
    GqaKernelKey k = key(rows, rows);
    k.overlap = true, k.stages = rows == 8 ? 2 : 0;
    keys.push_back(k);
  }
  GqaKernelKey ovm = key(8, 16);
  ovm.overlap = true, ovm.tree = true, ovm.window = true, ovm.softcap = true, ovm.checked = true;
  keys.push_back(ovm);
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
  // The balanced schedule (a knob, up to 16 rows): plain at 8 and 16 rows, masks with
  // soft-cap and checked, a page size that is not a power of two (ids per row), page 1.
  for (int rows : {8, 16}) {
    GqaKernelKey k = key(rows, rows);
    k.balanced = true, k.stages = 2;
    keys.push_back(k);
  }
  GqaKernelKey balm = key(8, 16);
  balm.balanced = true, balm.stages = 2;
  balm.tree = true, balm.window = true, balm.softcap = true, balm.checked = true, balm.page_size = 48;
  keys.push_back(balm);
  GqaKernelKey balp = key(5, 8);
  balp.balanced = true, balp.stages = 2, balp.page_size = 1, balp.q_dtype = 1, balp.out_dtype = 3;
  keys.push_back(balp);
  for (const GqaKernelKey& k : keys) {
    ASSERT_TRUE(k.wgmma()) << k.name();
    EXPECT_EQ(k.name().find("_ov") != std::string::npos, k.overlap) << k.name();
    EXPECT_EQ(k.spec().source.find("kOverlapQk = true") != std::string::npos, k.overlap) << k.name();
    EXPECT_EQ(k.name().find("_wg2") != std::string::npos, k.warpgroups == 2) << k.name();
    EXPECT_EQ(k.name().find("_bal") != std::string::npos, k.balanced) << k.name();
    EXPECT_EQ(k.spec().source.find("kBalanced = true") != std::string::npos, k.balanced) << k.name();
    EXPECT_EQ(k.name().find("_rm") != std::string::npos, k.rows_on_m) << k.name();
    EXPECT_EQ(k.shape().threads, 128 * k.warpgroups) << k.name();
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::compile(spec);
    ASSERT_FALSE(r.cubin.empty()) << spec.name << ":\n" << r.log;
    ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
    EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
    std::printf("[nvrtc] %-60s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
                r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes, r.ptxas.stack_bytes);
    // Up to 32 rows nothing spills, nor in the rows-on-M kernel. The rows-on-N kernel at 64 rows
    // (a knob since the rows-on-M kernel took them) holds S^T and O^T in 128 of the 255
    // registers: a few bytes spill in the masked variants. The balanced
    // schedule's fullest variant (a knob; masks, soft-cap, checked, page ids per row) keeps its
    // walk of the line beside the loop's state at the 168 registers three CTAs per SM allow: a
    // few words of its per-unit epilogue go to the stack (nvdisasm: stored before the tile loop,
    // loaded after it).
    const bool fullest = k.balanced && k.checked && k.tree && k.window && k.page_size == 48;
    if (fullest) {
      EXPECT_LE(r.ptxas.spill_store_bytes, 64) << spec.name;
    } else if (k.rows <= 32 || k.rows_on_m) {
      EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
      EXPECT_EQ(r.ptxas.stack_bytes, 0) << spec.name;
    } else {
      EXPECT_LE(r.ptxas.spill_store_bytes, 64) << spec.name;
    }
    EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
  }
}

}  // namespace
}  // namespace deca::cuda
