// NVRTC compiles of the fused decode step's kernels (GqaConfig::rope_style) for sm_90a, no GPU
// needed: the portable kernel for every KV dtype and 8-bit path and the Hopper fp8 kernel (both row
// layouts, 32 and 64 rows on M, the two-stage ring),
// both styles, a partial rotary_dim, q_len 8 with a tree mask, beams,
// head_dim 256, checked mode. Each exports the kernel without spilling (head_dim <= 128; the sm_89
// two-term path compiled for sm_90a aside, see below). A plain
// config's kernel source names no rope constant (its code stays the plain kernel's).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::cuda {
namespace {

GqaConfig fused_config(DType kv, RopeStyle style, int rotary_dim) {
  GqaConfig c;
  c.num_q_heads = 64, c.num_kv_heads = 8, c.head_dim = 128, c.page_size = 32;
  c.kv_dtype = kv;
  c.max_batch = 8, c.max_seq_len = 4096;
  c.checked = false;
  c.rope_style = style;
  c.rotary_dim = rotary_dim;
  return c;
}

std::vector<GqaConfig> fused_configs() {
  const DType bf16 = DType::kBF16, fp8 = DType::kFP8E4M3, int8 = DType::kINT8;
  std::vector<GqaConfig> cs;
  for (DType kv : {bf16, fp8, int8}) {
    cs.push_back(fused_config(kv, RopeStyle::kNeox, 0));
    cs.push_back(fused_config(kv, RopeStyle::kGptj, 64));
    GqaConfig spec8 = fused_config(kv, RopeStyle::kNeox, 0);
    spec8.max_q_len = 8, spec8.tree_mask = true, spec8.window = 256, spec8.softcap = 30.f;
    cs.push_back(spec8);
    GqaConfig beam = fused_config(kv, RopeStyle::kNeox, 0);
    beam.beam_width = 4, beam.max_batch = 16;
    cs.push_back(beam);
  }
  GqaConfig fp16 = fused_config(DType::kFP16, RopeStyle::kGptj, 32);
  fp16.q_dtype = fp16.out_dtype = DType::kFP16;
  cs.push_back(fp16);
  GqaConfig chk = fused_config(fp8, RopeStyle::kNeox, 0);
  chk.checked = true;
  cs.push_back(chk);
  GqaConfig d256 = fused_config(bf16, RopeStyle::kNeox, 128);
  d256.num_q_heads = 16, d256.head_dim = 256;
  cs.push_back(d256);
  // The Hopper kernel's other fused shapes (the GPU test's cases): 32 rows on M (padding operand
  // rows), and 8 rows on N on the two-stage ring a grid of three CTAs per SM takes.
  GqaConfig rows32 = fused_config(fp8, RopeStyle::kGptj, 64);
  rows32.max_q_len = 4;
  cs.push_back(rows32);
  GqaConfig two_stage = fused_config(fp8, RopeStyle::kNeox, 0);
  two_stage.max_batch = 128;
  cs.push_back(two_stage);
  // An fp8 output after the fused step, checked (the GPU test's fp8_out_fp8_cache).
  GqaConfig out8 = fused_config(fp8, RopeStyle::kNeox, 0);
  out8.out_dtype = DType::kFP8E4M3, out8.max_q_len = 2, out8.checked = true;
  cs.push_back(out8);
  return cs;
}

TEST(GqaFusedNvrtc, CompilesForSm90aWithoutSpills) {
  for (const GqaConfig& c : fused_configs()) {
    const GqaKernelKey k = make_gqa_key(c, 90);
    const std::string suffix = (c.rope_style == RopeStyle::kNeox ? "_neox" : "_gptj") +
                               std::to_string(c.rotary_dim ? c.rotary_dim : c.head_dim);
    ASSERT_NE(k.name().find(suffix), std::string::npos) << k.name();
    const jit::JitSpec spec = k.spec();
    const jit::CompileResult r = jit::compile(spec);
    ASSERT_FALSE(r.cubin.empty()) << spec.name;
    ASSERT_TRUE(r.ptxas.found) << spec.name;
    EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
    std::printf("[nvrtc] %-70s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(), r.compile_ms,
                r.ptxas.registers, r.ptxas.spill_store_bytes, r.ptxas.stack_bytes);
    if (c.head_dim <= 128) EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
    // The Hopper kernel's fused variant: its wgmma chains stay asynchronous.
    if (k.wgmma()) EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
  }
}

// The portable kernel's fused variant on the other arches' paths (sm_80 widening, sm_89 two-term
// e4m3), every 8-bit dtype, and the rotate / append kernels alone (deca-bench's baseline).
TEST(GqaFusedNvrtc, CompilesForSm80AndSm89) {
  for (int arch : {80, 89}) {
    for (DType kv : {DType::kFP8E4M3, DType::kINT8}) {
      const GqaKernelKey k = make_gqa_key(fused_config(kv, RopeStyle::kGptj, 64), arch);
      const jit::CompileResult r = jit::compile(k.spec());
      ASSERT_FALSE(r.cubin.empty()) << k.name();
      EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, "deca_gqa_decode")) << k.name();
      EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << k.name();
    }
  }
  // The portable kernel's fp8 paths compiled for sm_90a (path_arch: the GPU test's fp8 cases
  // that do not take the Hopper kernel). The two-term e4m3 mma.sync is sm_89's: ptxas for sm_90a
  // lowers it to fp16 mma and spills a little there, plain kernel included (the test-only path),
  // so only the widening is held to no spills.
  for (int path : {80, 89}) {
    GqaConfig c = fused_config(DType::kFP8E4M3, RopeStyle::kNeox, 0);
    c.max_q_len = 3;
    c.checked = true;  // as the GPU test runs them
    const GqaKernelKey k = make_gqa_key(c, 90, 132, path);
    ASSERT_FALSE(k.wgmma()) << k.name();
    const jit::CompileResult r = jit::compile(k.spec());
    ASSERT_FALSE(r.cubin.empty()) << k.name();
    EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, "deca_gqa_decode")) << k.name();
    if (path == 80) EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << k.name();
  }
  for (DType kv : {DType::kBF16, DType::kFP8E4M3, DType::kINT8}) {
    const jit::JitSpec spec = gqa_rope_append_spec(fused_config(kv, RopeStyle::kNeox, 0), 90);
    const jit::CompileResult r = jit::compile(spec);
    ASSERT_FALSE(r.cubin.empty()) << spec.name;
    EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
    EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
  }
}

// fp8 at head_dim 128 without beams takes the Hopper kernel fused as plain, both of its kernels.
TEST(GqaFusedNvrtc, Fp8TakesTheHopperKernel) {
  GqaConfig c = fused_config(DType::kFP8E4M3, RopeStyle::kNeox, 0);
  EXPECT_TRUE(make_gqa_key(c, 90).wgmma());
  c.max_q_len = 8;
  EXPECT_TRUE(make_gqa_key(c, 90).rows_on_m);
  c.max_q_len = 4;
  EXPECT_EQ(make_gqa_key(c, 90).rows, 32);
  EXPECT_TRUE(make_gqa_key(c, 90).rows_on_m);
  c.max_q_len = 1, c.max_batch = 128;  // 1024 units on 132 SMs: three CTAs per SM, two stages
  EXPECT_EQ(make_gqa_key(c, 90, 132).stages, 2);
  c.beam_width = 2, c.max_q_len = 1;
  EXPECT_FALSE(make_gqa_key(c, 90).wgmma());
}

TEST(GqaFusedNvrtc, PlainSourceNamesNoRopeConstant) {
  GqaConfig c = fused_config(DType::kFP8E4M3, RopeStyle::kNone, 0);
  for (int arch : {80, 90}) {
    const std::string src = make_gqa_key(c, arch).spec().source;
    EXPECT_EQ(src.find("kRope"), std::string::npos) << src;
    EXPECT_EQ(src.find("kRotaryDim"), std::string::npos) << src;
  }
  c.rope_style = RopeStyle::kGptj;
  const std::string fused = make_gqa_key(c, 90).spec().source;
  EXPECT_NE(fused.find("kRopeStyle = 2"), std::string::npos) << fused;
  EXPECT_NE(fused.find("kRotaryDim = 128"), std::string::npos) << fused;
}

}  // namespace
}  // namespace deca::cuda
