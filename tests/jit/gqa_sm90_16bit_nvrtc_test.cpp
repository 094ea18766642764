// The Hopper GQA kernels for bf16 / fp16 caches (kernels/gqa/sm90/, Traits::k16) without a GPU
// (this runs in CI): plans send 16-bit caches to them where the table below says
// (make_gqa_key's hopper_16bit, which plans pass unless DECA_GQA_SM90_16BIT=0), and NVRTC
// compiles their specializations for sm_90a over the rows
// values (8 / 16 on N, 32 / 64 on M), head_dim 64, 128 and 256, q_len 1..4 with causal masks, both
// 16-bit types, fp8 out,
// checked mode, masks and the fused step: entry exported, nothing spilled, no wgmma serialized,
// registers within the CTAs per SM the shared memory is sized for.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/compile_check.hpp"
#include "jit/gqa_sm90_config.hpp"

namespace deca::cuda {
namespace {

// q (and out) in the cache's type, unchecked (GqaConfig's default is checked; the tests set it
// where they want it).
GqaConfig config16(int q_heads, int kv_heads, int head_dim, int q_len, DType kv) {
  GqaConfig c = testing::sm90_config(q_heads, kv_heads, head_dim, q_len, kv);
  c.q_dtype = kv == DType::kFP16 ? DType::kFP16 : DType::kBF16;
  c.out_dtype = c.q_dtype;
  c.checked = false;
  return c;
}

TEST(GqaSm90Nvrtc16, PlansTakeTheHopperKernelUnlessTurnedOff) {
  struct Row {
    int q_heads, kv_heads, head_dim, q_len, beams;
    DType kv;
    int arch;
    bool skip;
    bool wgmma;  // as plans choose (hopper_16bit)
    int rows;    // as plans choose
  };
  const Row table[] = {
      {64, 8, 128, 1, 1, DType::kBF16, 90, false, true, 8},    // l70: group 8
      {64, 8, 128, 1, 1, DType::kFP16, 90, false, true, 8},    // fp16
      {64, 4, 128, 1, 1, DType::kBF16, 90, false, true, 16},   // q235: group 16
      {64, 8, 128, 2, 1, DType::kBF16, 90, false, true, 16},   // q_len 2
      {64, 8, 128, 3, 1, DType::kFP16, 90, false, true, 32},   // q_len 3: rows on M
      {64, 8, 128, 4, 1, DType::kBF16, 90, false, true, 32},   // spec q4
      {64, 8, 128, 8, 1, DType::kBF16, 90, false, true, 64},   // spec q8
      {10, 2, 128, 1, 1, DType::kBF16, 90, false, true, 8},    // group 5
      {8, 8, 128, 1, 1, DType::kFP16, 90, false, true, 8},     // MHA
      {64, 8, 128, 1, 2, DType::kBF16, 90, false, false, 16},  // beams: portable
      {64, 8, 64, 1, 1, DType::kBF16, 90, false, true, 8},     // head_dim 64 (gpt-oss): 128-token tiles
      {64, 8, 64, 4, 1, DType::kFP16, 90, false, true, 32},    // head_dim 64, rows on M
      {64, 8, 80, 1, 1, DType::kBF16, 90, false, false, 16},   // head_dim 80: portable
      {32, 16, 256, 1, 1, DType::kBF16, 90, false, true, 8},   // g3-b32-8k: head_dim 256, 32-token tiles
      {64, 8, 256, 2, 1, DType::kFP16, 90, false, true, 16},   // head_dim 256, 16 rows
      {64, 8, 256, 4, 1, DType::kBF16, 90, false, true, 32},   // head_dim 256, rows on M
      {64, 4, 256, 4, 1, DType::kFP16, 90, false, true, 64},
      {64, 8, 256, 1, 2, DType::kBF16, 90, false, false, 16},  // head_dim 256 with beams: portable
      {64, 8, 192, 1, 1, DType::kBF16, 90, false, false, 16},  // head_dim 192: portable
      {64, 8, 128, 1, 1, DType::kBF16, 90, true, true, 8},     // skip-softmax up to 16 rows: Hopper
      {64, 4, 64, 1, 1, DType::kFP16, 90, true, true, 16},
      {64, 8, 256, 2, 1, DType::kBF16, 90, true, true, 16},
      {64, 8, 128, 4, 1, DType::kBF16, 90, true, true, 32},    // 32 rows: the rows-on-M skip kernel
      {64, 8, 64, 8, 1, DType::kFP16, 90, true, true, 64},     // 64 rows, head_dim 64
      {64, 8, 128, 1, 2, DType::kFP16, 90, true, false, 16},   // beams: portable
      {64, 8, 128, 1, 1, DType::kBF16, 89, false, false, 16},  // no wgmma below sm_90
      {64, 8, 128, 1, 1, DType::kFP16, 80, false, false, 16},
  };
  for (const Row& r : table) {
    GqaConfig c = config16(r.q_heads, r.kv_heads, r.head_dim, r.q_len, r.kv);
    c.beam_width = r.beams;
    c.skip_softmax_factor = r.skip ? 0.5f : 0.f;
    const GqaKernelKey plain = make_gqa_key(c, r.arch);  // DECA_GQA_SM90_16BIT=0: portable
    EXPECT_FALSE(plain.wgmma()) << plain.name();
    EXPECT_EQ(plain.name().find("_wgmma"), std::string::npos) << plain.name();
    const GqaKernelKey k = make_gqa_key(c, r.arch, 132, 0, true);
    EXPECT_EQ(k.wgmma(), r.wgmma) << k.name();
    EXPECT_EQ(k.name().find("_wgmma") != std::string::npos, r.wgmma) << k.name();
    EXPECT_EQ(k.spec().source.find("kernels/gqa/sm90/entry.cuh") != std::string::npos, r.wgmma) << k.name();
    if (!r.wgmma) {
      EXPECT_EQ(k.name(), plain.name());  // hopper_16bit changes nothing it does not cover
      continue;
    }
    EXPECT_EQ(k.rows, r.rows) << k.name();
    EXPECT_EQ(k.rows_on_m, r.rows >= 32) << k.name();
    EXPECT_EQ(k.shape().tile, 8192 / r.head_dim) << k.name();  // 16 KB per K or V
    EXPECT_EQ(k.shape().kv_bytes, 2) << k.name();
    // Skip-softmax: up to 16 rows the three-stage plan whose six slots hold the skip ring
    // (sm90/skip.cuh); at 32 / 64 rows the rows-on-M kernel's two-stage plan (sm90/skip_rows.cuh).
    const bool on_m = r.rows >= 32;
    EXPECT_EQ(k.name().find("_wgmma_st3_skip") != std::string::npos, r.skip && !on_m) << k.name();
    EXPECT_EQ(k.name().find("_wgmma_rm_skip") != std::string::npos, r.skip && on_m) << k.name();
    if (r.skip && !on_m) EXPECT_EQ(k.shape().stages, 3) << k.name();
  }
  // fp8 plans are the same kernels either way.
  const GqaConfig f8 = config16(64, 8, 128, 1, DType::kFP8E4M3);
  EXPECT_EQ(make_gqa_key(f8, 90, 132, 0, true).name(), make_gqa_key(f8, 90).name());
  // A test's path_arch of another arch keeps the portable kernel.
  const GqaConfig b = config16(64, 8, 128, 1, DType::kBF16);
  EXPECT_FALSE(make_gqa_key(b, 90, 132, 80, true).wgmma());
  EXPECT_TRUE(make_gqa_key(b, 90, 132, 90, true).wgmma());
  // The grid rule is fp8's: two stages where it fills three CTAs per SM.
  GqaConfig big = b;
  big.max_batch = 99;  // l70-b99-4k: 792 units
  const GqaKernelKey k99 = make_gqa_key(big, 90, 132, 0, true);
  EXPECT_EQ(k99.stages, 2) << k99.name();
  EXPECT_EQ(k99.shape().min_ctas, 3) << k99.name();
  // Head_dim 256: 8 rows keep the rule (three CTAs at two stages); 16 rows at two stages fit only
  // two CTAs by shared memory, so they keep three stages.
  GqaConfig g3 = config16(32, 16, 256, 1, DType::kBF16);
  g3.max_batch = 32;  // g3-b32-8k: 512 units
  const GqaKernelKey kg3 = make_gqa_key(g3, 90, 132, 0, true);
  EXPECT_EQ(kg3.stages, 2) << kg3.name();
  EXPECT_EQ(kg3.shape().min_ctas, 3) << kg3.name();
  GqaConfig g16 = config16(64, 8, 256, 2, DType::kBF16);
  g16.max_batch = 64;
  const GqaKernelKey k16 = make_gqa_key(g16, 90, 132, 0, true);
  EXPECT_EQ(k16.rows, 16) << k16.name();
  EXPECT_EQ(k16.stages, 0) << k16.name();
  EXPECT_EQ(k16.shape().stages, 3) << k16.name();
  EXPECT_EQ(k16.shape().min_ctas, 2) << k16.name();
}

// The same ring and shared-memory plan as fp8 (16 KB per K or V per stage: 64 tokens at head_dim
// 128, 128 at 64), so the same CTAs per SM at every rows value; the loader's chunks cover a tile.
TEST(GqaSm90Nvrtc16, ShapeMatchesTheFp8Ring) {
  for (int rows : {8, 16, -32, -64}) {
    const bool on_m = rows < 0;
    rows = on_m ? -rows : rows;
    for (int stages : {0, 2}) {
      if (on_m && stages == 2) continue;
      for (int d : {64, 128}) {
        const gqa::Shape s8 = gqa::sm90::make_shape(rows, stages, on_m, 1);
        const gqa::Shape s16 = gqa::sm90::make_shape(rows, stages, on_m, 2, d);
        EXPECT_EQ(s16.tile, 128 * 64 / d) << rows;
        EXPECT_EQ(s16.chunks_per_row, d / 8) << rows;
        EXPECT_EQ(s16.loads_per_thread * s16.threads, s16.tile * s16.chunks_per_row) << rows;
        EXPECT_EQ(s16.stage_bytes, s16.tile * s16.row_stride) << rows;
        EXPECT_EQ(s16.stages, s8.stages) << rows;
        EXPECT_EQ(s16.smem_bytes, s8.smem_bytes) << rows;
        EXPECT_EQ(s16.min_ctas, s8.min_ctas) << rows;
        EXPECT_LE(s16.merge_bytes, s16.pipe_bytes) << rows;
        std::printf("[sm90 16-bit shape] d%d rows %2d%s: stages %d, smem %d B, min_ctas %d\n", d, rows,
                    on_m ? " (M)" : "", s16.stages, s16.smem_bytes, s16.min_ctas);
      }
    }
  }
}

// Head_dim 256: 32-token tiles of the same 16 KB per K or V; q of 512 B rows and (rows on M) no
// V^T tile, so its own plan: two CTAs per SM at every rows value (three at 8 rows on two stages),
// rows on M at two stages with the merge area over the stages and q.
TEST(GqaSm90Nvrtc16, HeadDim256Shape) {
  struct Row {
    int rows, stages;
    bool on_m;
    int want_stages, want_min_ctas;
  };
  const Row table[] = {{8, 0, false, 3, 2},  {8, 2, false, 2, 3},  {16, 0, false, 3, 2},
                       {16, 2, false, 2, 2}, {32, 0, true, 2, 2}, {64, 0, true, 2, 2}};
  for (const Row& r : table) {
    const gqa::Shape s = gqa::sm90::make_shape(r.rows, r.stages, r.on_m, 2, 256);
    const gqa::sm90::SmemPlan plan = gqa::sm90::make_kernel_plan(r.rows, s.stages, r.on_m, 2, 256);
    EXPECT_EQ(s.tile, 32) << r.rows;
    EXPECT_EQ(s.chunks_per_row, 32) << r.rows;
    EXPECT_EQ(s.loads_per_thread, 8) << r.rows;
    EXPECT_EQ(s.stage_bytes, s.tile * s.row_stride) << r.rows;
    EXPECT_EQ(s.stages, r.want_stages) << r.rows;
    EXPECT_EQ(s.min_ctas, r.want_min_ctas) << r.rows;
    EXPECT_EQ(plan.p_hi - plan.q_hi, (r.on_m ? 64 : r.rows) * 512) << r.rows;  // q: 4 column blocks
    EXPECT_EQ(plan.vt, plan.p_lo + (r.on_m ? 0 : r.rows * 128)) << r.rows;
    EXPECT_EQ(plan.red, plan.vt) << r.rows;  // no V^T tile
    EXPECT_LE(s.merge_bytes, plan.p_hi) << r.rows;
    EXPECT_EQ(s.merge_bytes <= s.pipe_bytes, !(r.on_m && r.rows == 64)) << r.rows;
    EXPECT_LE(s.min_ctas * (s.smem_bytes + 1024), 228 * 1024) << r.rows;
    std::printf("[sm90 16-bit shape] d256 rows %2d%s: stages %d, smem %d B, min_ctas %d\n", r.rows,
                r.on_m ? " (M)" : "", s.stages, s.smem_bytes, s.min_ctas);
  }
}

TEST(GqaSm90Nvrtc16, SpecializationsCompileWithoutSpillsOrSerializedWgmma) {
  std::vector<GqaKernelKey> keys;
  std::set<std::string> names;
  auto add = [&](GqaConfig c, auto&& tweak) {
    tweak(c);
    const GqaKernelKey k = make_gqa_key(c, 90, 132, 0, true);
    if (names.insert(k.name()).second) keys.push_back(k);  // q_len 3 and 4: the same 32-row kernel
  };
  auto none = [](GqaConfig&) {};
  for (DType kv : {DType::kBF16, DType::kFP16}) {
    // q_len 1..4 at group 8 (rows 8, 16, 32, 32) and group 16 at q_len 4 (64 rows), causal masks.
    for (int q_len : {1, 2, 3, 4}) add(config16(64, 8, 128, q_len, kv), none);
    add(config16(64, 4, 128, 4, kv), none);
  }
  // Features on both sides (rows on N and on M), across both types.
  for (int q_len : {1, 4}) {
    add(config16(64, 8, 128, q_len, DType::kBF16), [](GqaConfig& c) { c.checked = true, c.tree_mask = true; });
    add(config16(10, 2, 128, q_len, DType::kFP16), [](GqaConfig& c) {
      c.window = 128, c.softcap = 30.f, c.page_size = 48, c.sinks = true, c.lse = true;
    });
    add(config16(64, 8, 128, q_len, DType::kBF16), [](GqaConfig& c) {
      c.out_dtype = DType::kFP8E4M3, c.page_size = 1, c.q_dtype = DType::kFP16;
    });
    add(config16(64, 8, 128, q_len, DType::kFP16), [](GqaConfig& c) {
      c.rope_style = RopeStyle::kNeox, c.checked = true;
    });
  }
  // head_dim 64 (128-token tiles): rows 8 / 16 on N, 32 / 64 on M, the gpt-oss window layer.
  for (DType kv : {DType::kBF16, DType::kFP16}) {
    for (int q_len : {1, 2, 4}) add(config16(64, 8, 64, q_len, kv), none);
    add(config16(64, 4, 64, 4, kv), none);
  }
  add(config16(64, 8, 64, 1, DType::kBF16), [](GqaConfig& c) {
    c.window = 128, c.sinks = true, c.page_size = 16, c.checked = true, c.lse = true;
  });
  add(config16(64, 8, 64, 4, DType::kFP16), [](GqaConfig& c) {
    c.tree_mask = true, c.softcap = 30.f, c.out_dtype = DType::kFP8E4M3, c.rope_style = RopeStyle::kGptj;
  });
  // head_dim 256 (32-token tiles): rows 8 / 16 on N, 32 / 64 on M, both types, q_len 1..4, and
  // the features across them.
  for (DType kv : {DType::kBF16, DType::kFP16}) {
    for (int q_len : {1, 2, 3, 4}) add(config16(64, 8, 256, q_len, kv), none);
    add(config16(64, 4, 256, 4, kv), none);
    add(config16(32, 16, 256, 1, kv), [](GqaConfig& c) { c.max_batch = 32; });  // g3: two stages
  }
  for (int q_len : {1, 4}) {
    add(config16(64, 8, 256, q_len, DType::kBF16), [](GqaConfig& c) {
      c.checked = true, c.tree_mask = true, c.lse = true, c.sinks = true;
    });
    add(config16(10, 2, 256, q_len, DType::kFP16), [](GqaConfig& c) {
      c.window = 128, c.softcap = 30.f, c.page_size = 16, c.out_dtype = DType::kFP8E4M3;
    });
    add(config16(64, 8, 256, q_len, DType::kBF16), [](GqaConfig& c) {
      c.rope_style = RopeStyle::kNeox, c.checked = true, c.page_size = 1;
    });
  }
  add(config16(64, 4, 256, 4, DType::kFP16), [](GqaConfig& c) {
    c.checked = true, c.lse = true, c.out_dtype = DType::kFP8E4M3, c.rope_style = RopeStyle::kGptj;
  });
  // Pages holding whole tiles (larger than one: the loader's one id per tile) at 128 and 256.
  add(config16(64, 8, 128, 1, DType::kFP16), [](GqaConfig& c) { c.page_size = 128, c.checked = true; });
  add(config16(64, 8, 256, 4, DType::kBF16), [](GqaConfig& c) { c.page_size = 128, c.checked = true; });
  GqaConfig st2 = config16(64, 8, 128, 1, DType::kBF16);  // two stages (three CTAs per SM)
  st2.max_batch = 99;
  add(st2, [](GqaConfig& c) { c.window = 512, c.checked = true; });
  for (const GqaKernelKey& k : keys) {
    ASSERT_TRUE(k.wgmma()) << k.name();
    EXPECT_EQ(k.shape().threads, 128) << k.name();
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::testing::compile_and_check(spec);
    jit::testing::expect_no_spills(r, spec.name);
    EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
    EXPECT_LE(r.ptxas.registers * k.shape().threads * k.shape().min_ctas, 65536) << spec.name;
  }
}

}  // namespace
}  // namespace deca::cuda
