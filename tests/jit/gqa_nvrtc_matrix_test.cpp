// NVRTC compiles a representative matrix of GQA kernel specializations for sm_90a, sm_89 and
// sm_80, 8-bit caches on both the widening and the two-term path (fp8: e4m3 mma, sm_89+; int8:
// IMMA, every arch) (no GPU needed: this runs in CI) and each cubin exports the expected kernel
// symbol without spilling. Prints cold compile time, registers and spills per specialization.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/nvrtc_compile.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/scoped_env.hpp"

namespace deca::cuda {
namespace {

std::vector<GqaKernelKey> representative_keys() {
  std::vector<GqaKernelKey> keys;
  auto key = [](int d, int g, int rows, int page, int q, int kv, int out) {
    GqaKernelKey k;
    k.head_dim = d, k.group = g, k.rows = rows, k.page_size = page;
    k.q_dtype = q, k.kv_dtype = kv, k.out_dtype = out;
    return k;
  };
  const int bf16 = 0, fp16 = 1, fp8 = 3, int8 = 4;
  keys.push_back(key(128, 8, 16, 32, bf16, bf16, bf16));   // l70 bf16
  keys.push_back(key(128, 8, 16, 64, bf16, fp8, bf16));    // l70 fp8
  keys.push_back(key(128, 16, 16, 64, bf16, fp8, bf16));   // q235
  keys.push_back(key(128, 1, 16, 64, bf16, bf16, bf16));   // mha
  keys.push_back(key(256, 2, 16, 64, bf16, bf16, bf16));   // g3
  keys.push_back(key(128, 8, 64, 64, bf16, fp8, bf16));    // spec q_len 8
  keys.push_back(key(128, 4, 32, 16, fp16, int8, fp16));   // int8, fp16
  keys.push_back(key(80, 8, 16, 16, bf16, fp8, fp8));      // odd head_dim, fp8 out
  GqaKernelKey w = key(64, 8, 16, 16, bf16, bf16, bf16);   // gpt-oss: window + sinks
  w.window = true;
  keys.push_back(w);
  GqaKernelKey t = key(128, 8, 32, 64, bf16, fp8, bf16);   // tree mask + soft-cap
  t.tree = true, t.softcap = true;
  keys.push_back(t);
  GqaKernelKey beam = key(128, 8, 32, 16, bf16, fp8, bf16);  // beam search: 4 beams share a CTA
  beam.beam_width = 4, beam.window = true;
  keys.push_back(beam);
  return keys;
}

// Every 8-bit key again on the ldmatrix-fed widening and the two-term path (fp8: sm_89+; int8:
// every arch), plus the shapes those treat differently: head_dim % 32 == 16 (a lone last 16-dim k
// step), chunks of 16 tokens (head_dim 256: half PV steps, q in shared memory), fp16 q.
std::vector<GqaKernelKey> keys_for(int arch) {
  std::vector<GqaKernelKey> keys = representative_keys();
  std::vector<GqaKernelKey> fp8 = {};
  for (const GqaKernelKey& k : keys) {
    if (k.kv_dtype == 3 || k.kv_dtype == 4) fp8.push_back(k);  // int8 takes the ldmatrix path too
  }
  GqaKernelKey d256;
  d256.head_dim = 256, d256.group = 2, d256.rows = 16, d256.page_size = 64, d256.kv_dtype = 3;
  fp8.push_back(d256);
  GqaKernelKey d112 = d256;
  d112.head_dim = 112, d112.group = 16, d112.q_dtype = 1, d112.out_dtype = 1;
  fp8.push_back(d112);
  d256.kv_dtype = 4, d112.kv_dtype = 4;
  fp8.push_back(d256);
  fp8.push_back(d112);
  for (int mode : {kv::kWidenLdsm, kv::kTwoTerm}) {
    for (GqaKernelKey k : fp8) {
      if (mode == kv::kTwoTerm && k.kv_dtype == 3 && arch < 89) continue;  // e4m3 mma: sm_89+
      k.fp8_mma = mode;
      keys.push_back(k);
    }
  }
  return keys;
}

TEST(GqaNvrtcMatrix, CompilesForSm90aSm89AndSm80) {
  const int bf16 = 0, fp8 = 3, int8 = 4;
  for (int arch : {90, 89, 80}) {
    for (GqaKernelKey k : keys_for(arch)) {
      k.arch = arch;
      EXPECT_EQ(k.name().find("_2term") != std::string::npos, k.two_term()) << k.name();
      EXPECT_EQ(k.name().find("_ldsm") != std::string::npos, k.fp8_path() == kv::kWidenLdsm) << k.name();
      const jit::JitSpec spec = k.spec();
      const jit::CompileResult r = jit::compile(spec);
      ASSERT_FALSE(r.cubin.empty()) << spec.name;
      ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
      EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
      std::printf("[nvrtc] %-52s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
                  r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
                  r.ptxas.stack_bytes);
      // The benchmarked shapes (bf16 / fp8 cache, head_dim <= 128) must not spill: a spill is a
      // local-memory round trip per tile. The two-term path on sm_90a is not a default (ptxas
      // emulates e4m3 mma.sync there with fp16 HMMA and unpacks q's terms, 255 registers: a few
      // bytes spill); it is compiled for the side-by-side timing knob DECA_GQA_FP8_MMA only.
      const bool sm90_two_term = arch == 90 && k.two_term() && k.kv_dtype == fp8;
      if (k.head_dim <= 128 && (k.kv_dtype == bf16 || k.kv_dtype == fp8) && !sm90_two_term) {
        EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
      }
      // The int8 two-term path runs on native IMMA everywhere and fits every head_dim.
      if (k.kv_dtype == int8 && k.two_term()) EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
    }
  }
}

// The int8 two-term paths (IMMA for QK and PV, or QK only) beside the int8 widening on the shapes
// the GPU suite runs them on: all compile for every arch without spilling; registers side by side (the two-term kernel
// takes what the 2-CTA launch bound leaves: ptxas keeps the IMMA temporaries of many n8 blocks
// in flight; capped at 216 it still does not spill).
TEST(GqaNvrtcMatrix, Int8TwoTermBesideWidening) {
  const int bf16 = 0, fp16 = 1, fp8 = 3, int8 = 4;
  auto key = [&](int d, int g, int rows, int page) {
    GqaKernelKey k;
    k.head_dim = d, k.group = g, k.rows = rows, k.page_size = page;
    k.q_dtype = bf16, k.kv_dtype = int8, k.out_dtype = bf16;
    return k;
  };
  std::vector<GqaKernelKey> keys = {key(128, 8, 16, 64), key(64, 16, 16, 16), key(96, 6, 16, 16),
                                    key(256, 4, 16, 16), key(128, 8, 32, 64), key(128, 8, 64, 64)};
  keys[1].window = true;                        // gpt-oss-like: window + sinks
  keys[2].out_dtype = fp8;                      // non-power-of-two group, fp8 output
  keys[3].q_dtype = fp16, keys[3].out_dtype = fp16;
  keys[4].tree = true, keys[4].softcap = true;  // q_len 4 tree
  keys[5].tree = true;                          // q_len 8: one warp column
  GqaKernelKey beam = key(128, 8, 32, 32);
  beam.beam_width = 4, beam.window = true;
  keys.push_back(beam);
  for (int arch : {90, 89, 80}) {
    for (GqaKernelKey k : keys) {
      k.arch = arch;
      int regs[4] = {0, 0, 0, 0};  // by kv::Fp8Mma
      for (int mode : {kv::kWidenLdsm, kv::kTwoTerm, kv::kTwoTermQk}) {
        k.fp8_mma = mode;
        EXPECT_EQ(k.two_term(), mode == kv::kTwoTerm) << k.name();
        EXPECT_EQ(k.name().find("_2term") != std::string::npos, mode == kv::kTwoTerm) << k.name();
        EXPECT_EQ(k.name().find("_2tqk") != std::string::npos, mode == kv::kTwoTermQk) << k.name();
        const jit::JitSpec spec = k.spec();
        const jit::CompileResult r = jit::compile(spec);
        ASSERT_FALSE(r.cubin.empty()) << spec.name;
        ASSERT_TRUE(r.ptxas.found) << spec.name;
        EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
        EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
        regs[mode] = r.ptxas.registers;
      }
      k.fp8_mma = kv::kTwoTerm;
      std::printf("[int8] %-58s regs widen_ldsm=%d two_term=%d two_term_qk=%d\n", k.name().c_str(),
                  regs[kv::kWidenLdsm], regs[kv::kTwoTerm], regs[kv::kTwoTermQk]);
    }
  }
}

// The path a plan's key takes for an int8 cache: two_term_qk by default on sm_90 (measured
// fastest on the H200), the widening on the other arches (not measured there), two_term wherever
// DECA_GQA_FP8_MMA asks (IMMA is native on sm_80+), where an fp8 cache refuses it below sm_89.
TEST(GqaNvrtcMatrix, Int8TwoTermSelectedByTheKnobOnEveryArch) {
  GqaConfig c;
  c.num_q_heads = 64, c.num_kv_heads = 8, c.head_dim = 128, c.page_size = 64;
  c.max_batch = 8, c.max_seq_len = 4096;
  for (int arch : {80, 86, 89, 90}) {
    c.kv_dtype = DType::kINT8;
    {
      jit::testing::ScopedEnv env("DECA_GQA_FP8_MMA", nullptr);
      const GqaKernelKey k = make_gqa_key(c, arch);
      EXPECT_EQ(k.fp8_path(), arch == 90 ? kv::kTwoTermQk : kv::kWidenLdsm) << k.name();
      EXPECT_FALSE(k.two_term()) << k.name();
    }
    {
      jit::testing::ScopedEnv env("DECA_GQA_FP8_MMA", "two_term");
      const GqaKernelKey k = make_gqa_key(c, arch);
      EXPECT_TRUE(k.two_term()) << k.name();
      EXPECT_NE(k.name().find("_kvint8_"), std::string::npos) << k.name();
      EXPECT_NE(k.name().find("_2term"), std::string::npos) << k.name();
      EXPECT_NE(k.spec().source.find("kFp8Mma = 1;"), std::string::npos) << k.spec().source;
      c.kv_dtype = DType::kFP8E4M3;
      EXPECT_EQ(make_gqa_key(c, arch).two_term(), arch >= 89) << arch;
    }
    {
      jit::testing::ScopedEnv env("DECA_GQA_FP8_MMA", "two_term_qk");
      c.kv_dtype = DType::kINT8;
      const GqaKernelKey k = make_gqa_key(c, arch);
      EXPECT_EQ(k.fp8_path(), kv::kTwoTermQk) << k.name();
      EXPECT_NE(k.name().find("_2tqk"), std::string::npos) << k.name();
      c.kv_dtype = DType::kFP8E4M3;  // int8 only: an fp8 cache keeps its default
      EXPECT_EQ(make_gqa_key(c, arch).fp8_path(),
                arch == 89 ? kv::kTwoTerm : (arch == 90 ? kv::kWgmma : kv::kWidenLdsm))
          << arch;
    }
  }
}

}  // namespace
}  // namespace deca::cuda
