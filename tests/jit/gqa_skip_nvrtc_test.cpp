// NVRTC compiles the skip-softmax kernels ("_skip", GqaConfig::skip_softmax_factor > 0) for sm_90a,
// sm_89 and sm_80 (no GPU needed): the portable kernel for every KV dtype and 8-bit path, with beams, masks,
// window, soft-cap, checked mode and 16 / 32 / 64 rows, and the Hopper kernel's skip variants for
// fp8 and 16-bit caches (head_dim 64, 128, 256) at 8 / 16 rows (skip.cuh) and 32 / 64 rows
// (skip_rows.cuh). Each exports the kernel symbol without spilling. The exact kernels' sources
// (so their code) do not change with the feature: no kSkip in them.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/compile_check.hpp"

namespace deca::cuda {
namespace {

GqaConfig skip_config(int q_heads, int kv_heads, int head_dim, int page, DType kv) {
  GqaConfig c;
  c.num_q_heads = q_heads, c.num_kv_heads = kv_heads, c.head_dim = head_dim, c.page_size = page;
  c.kv_dtype = kv;
  c.max_batch = 8, c.max_seq_len = 131072;
  c.checked = false;
  c.skip_softmax_factor = 1.f;
  return c;
}

std::vector<GqaConfig> skip_configs() {
  const DType bf16 = DType::kBF16, fp16 = DType::kFP16, fp8 = DType::kFP8E4M3, int8 = DType::kINT8;
  std::vector<GqaConfig> cs;
  for (DType kv : {bf16, fp16, fp8, int8}) {
    GqaConfig c = skip_config(64, 8, 128, 32, kv);  // l70
    if (kv == fp16) c.q_dtype = c.out_dtype = fp16;
    cs.push_back(c);
    GqaConfig spec = c;  // speculative q_len 8 with a tree mask, soft-cap, sinks: 64 rows
    spec.max_q_len = 8, spec.tree_mask = true, spec.softcap = 30.f, spec.sinks = true, spec.lse = true;
    cs.push_back(spec);
    GqaConfig beam = c;  // 4 beams share a CTA (32 rows), window, checked
    beam.beam_width = 4, beam.max_batch = 16, beam.window = 512, beam.checked = true;
    cs.push_back(beam);
    cs.push_back(skip_config(16, 8, 256, 64, kv));  // head_dim 256: q in shared memory
    cs.push_back(skip_config(32, 2, 112, 16, kv));  // head_dim % 32 == 16, 16 rows
  }
  return cs;
}

// The Hopper kernel's skip variant (up to 16 rows; fp8 at head_dim 128, bf16 / fp16 at 64, 128
// and 256): 8 and 16 rows, every mask.
std::vector<GqaConfig> hopper_skip_configs() {
  std::vector<GqaConfig> cs;
  cs.push_back(skip_config(64, 8, 128, 32, DType::kFP8E4M3));  // l70: 8 rows
  GqaConfig g16 = skip_config(64, 4, 128, 64, DType::kFP8E4M3);  // group 16: 16 rows
  g16.sinks = true, g16.lse = true, g16.per_head_kv_scale = true;
  cs.push_back(g16);
  GqaConfig t = skip_config(64, 8, 128, 16, DType::kFP8E4M3);  // q_len 2 x group 8, every feature
  t.max_q_len = 2, t.tree_mask = true, t.softcap = 30.f, t.window = 1024, t.checked = true;
  cs.push_back(t);
  GqaConfig p1 = skip_config(8, 1, 128, 1, DType::kFP8E4M3);  // page size 1
  cs.push_back(p1);
  // 16-bit caches (q and out in the cache's type): each head_dim's tile (128, 64 or 32 tokens) at
  // 8 and 16 rows, and the features across them.
  for (DType kv : {DType::kBF16, DType::kFP16}) {
    for (int head_dim : {64, 128, 256}) {
      GqaConfig c = skip_config(64, 8, head_dim, 32, kv);  // 8 rows
      c.q_dtype = c.out_dtype = kv;
      cs.push_back(c);
      GqaConfig g = skip_config(64, 4, head_dim, 64, kv);  // group 16: 16 rows, sinks, LSE
      g.q_dtype = g.out_dtype = kv, g.sinks = true, g.lse = true;
      cs.push_back(g);
      GqaConfig f = skip_config(64, 8, head_dim, 16, kv);  // q_len 2 x group 8, every feature
      f.q_dtype = f.out_dtype = kv;
      f.max_q_len = 2, f.tree_mask = true, f.softcap = 30.f, f.window = 1024, f.checked = true;
      cs.push_back(f);
    }
  }
  GqaConfig p1b = skip_config(10, 2, 128, 1, DType::kBF16);  // group 5, page size 1, fp8 out
  p1b.out_dtype = DType::kFP8E4M3, p1b.checked = true;
  cs.push_back(p1b);
  GqaConfig big = skip_config(64, 8, 256, 128, DType::kFP16);  // pages holding whole tiles
  big.q_dtype = big.out_dtype = DType::kFP16;
  cs.push_back(big);
  return cs;
}

// The keys a plan makes on sm_90a (fp8 at up to 16 rows: the Hopper kernel), the other arches'
// 8-bit paths compiled for it, and the keys plans make on sm_89 and sm_80.
std::vector<GqaKernelKey> skip_keys() {
  std::vector<GqaKernelKey> keys;
  std::set<std::string> names;
  auto add = [&](const GqaKernelKey& k) {
    if (names.insert(k.name()).second) keys.push_back(k);
  };
  for (const GqaConfig& c : skip_configs()) {
    for (int path_arch : {90, 89, 80}) {
      if (path_arch != 90 && c.kv_dtype != DType::kFP8E4M3 && c.kv_dtype != DType::kINT8) continue;
      add(make_gqa_key(c, 90, 132, path_arch));
    }
    for (int arch : {89, 80}) add(make_gqa_key(c, arch));
  }
  return keys;
}

TEST(GqaSkipNvrtc, CompilesWithoutSpills) {
  for (const GqaKernelKey& k : skip_keys()) {
    ASSERT_TRUE(k.skip);
    EXPECT_EQ(k.name().substr(k.name().size() - 5), "_skip") << k.name();
    const jit::JitSpec spec = k.spec();
    EXPECT_NE(spec.source.find("kSkip = true"), std::string::npos) << spec.source;
    const jit::CompileResult r = jit::testing::compile_and_check(spec);
    // No spill up to head_dim 128 (sm_89's two-term fp8 path compiled for sm_90a is emulated
    // there: gqa_nvrtc_matrix_test.cpp). Beyond, O holds head_dim / 2 registers at the two-CTA
    // bound of 255 and a few words spill: the exact bf16 / fp8 kernels' case, and here int8's on
    // sm_80 too (12 bytes: the skip loop's second page-id array).
    const bool emulated = k.arch == 90 && k.two_term();
    if (!emulated && k.head_dim <= 128) jit::testing::expect_no_spills(r, spec.name);
  }
}

TEST(GqaSkipNvrtc, HopperKernelCompilesForSm90aWithoutSpills) {
  std::set<std::string> names;
  for (const GqaConfig& c : hopper_skip_configs()) {
    const GqaKernelKey k = make_gqa_key(c, 90, 132, 0, true);  // as plans choose (hopper_16bit)
    ASSERT_TRUE(k.wgmma() && k.skip && !k.rows_on_m) << k.name();
    EXPECT_NE(k.name().find("_wgmma_st3"), std::string::npos) << k.name();
    EXPECT_EQ(k.shape().stages, 3) << k.name();
    if (!names.insert(k.name()).second) continue;
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::testing::compile_and_check(spec);
    jit::testing::expect_no_spills(r, spec.name);
    // 16-bit: no wgmma serialized (its PV runs outside the vote's branch, sm90/skip.cuh). The fp8
    // skip kernel's are (ptxas C7518, docs/perf-notes.md "Skip-softmax").
    if (c.kv_dtype != DType::kFP8E4M3) {
      EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
    }
    EXPECT_LE(r.ptxas.registers * k.shape().threads * k.shape().min_ctas, 65536) << spec.name;
  }
}

// The rows-on-M kernel's skip variant (sm90/skip_rows.cuh: 32 and 64 rows, q_len 4 and 8 of a
// group of 8): fp8 and bf16 / fp16 at head_dim 64, 128 and 256, every mask and feature across
// them. No spill, no wgmma serialized, two CTAs per SM by registers; the name is the exact rows-on-M
// kernel's with "_skip" (stages as the exact plan's: two).
std::vector<GqaConfig> rows_on_m_skip_configs() {
  std::vector<GqaConfig> cs;
  for (DType kv : {DType::kFP8E4M3, DType::kBF16, DType::kFP16}) {
    const bool b16 = kv != DType::kFP8E4M3;
    for (int head_dim : {64, 128, 256}) {
      if (!b16 && head_dim != 128) continue;
      for (int q_len : {4, 8}) {
        GqaConfig c = skip_config(64, 8, head_dim, 64, kv);
        if (b16) c.q_dtype = c.out_dtype = kv;
        c.max_q_len = q_len;
        cs.push_back(c);
        GqaConfig f = c;  // a tree, soft-cap, window, checked, sinks, LSE, per-head scales
        f.tree_mask = true, f.softcap = 30.f, f.window = 1024, f.checked = true, f.sinks = true, f.lse = true;
        f.per_head_kv_scale = !b16, f.page_size = 16;
        cs.push_back(f);
      }
    }
  }
  GqaConfig p1 = skip_config(40, 5, 128, 1, DType::kFP8E4M3);  // q_len 4 x group 8, page size 1, causal
  p1.max_q_len = 4;
  cs.push_back(p1);
  return cs;
}

TEST(GqaSkipNvrtc, RowsOnMKernelCompilesForSm90aWithoutSpills) {
  std::set<std::string> names;
  for (const GqaConfig& c : rows_on_m_skip_configs()) {
    const GqaKernelKey k = make_gqa_key(c, 90, 132, 0, true);  // as plans choose (hopper_16bit)
    ASSERT_TRUE(k.wgmma() && k.skip && k.rows_on_m) << k.name();
    EXPECT_NE(k.name().find("_wgmma_rm"), std::string::npos) << k.name();
    EXPECT_EQ(k.shape().stages, 2) << k.name();
    GqaConfig exact = c;
    exact.skip_softmax_factor = 0.f;
    EXPECT_EQ(make_gqa_key(exact, 90, 132, 0, true).name() + "_skip", k.name());
    if (!names.insert(k.name()).second) continue;
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::testing::compile_and_check(spec);
    jit::testing::expect_no_spills(r, spec.name);
    EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
    EXPECT_LE(r.ptxas.registers * k.shape().threads * k.shape().min_ctas, 65536) << spec.name;
    std::printf("[rows-on-M skip] %s: %d registers\n", spec.name.c_str(), r.ptxas.registers);
  }
}

// The factor is a run-time argument: plans of two factors share one kernel; factor 0 is the exact
// kernel, whose source names no kSkip.
TEST(GqaSkipNvrtc, FactorIsNotPartOfTheKernel) {
  GqaConfig c = skip_config(64, 8, 128, 32, DType::kBF16);
  const std::string a = make_gqa_key(c, 90).name();
  c.skip_softmax_factor = 0.25f;
  EXPECT_EQ(make_gqa_key(c, 90).name(), a);
  c.skip_softmax_factor = 0.f;
  const GqaKernelKey exact = make_gqa_key(c, 90);
  EXPECT_FALSE(exact.skip);
  EXPECT_EQ(exact.name() + "_skip", a);
  EXPECT_EQ(exact.spec().source.find("kSkip"), std::string::npos);
}

}  // namespace
}  // namespace deca::cuda
