// NVRTC compiles a representative matrix of the portable GQA kernel's specializations for sm_90a,
// sm_89 and sm_80 (no GPU needed: this runs in CI): for each arch, the key a plan makes there
// (8-bit caches on that arch's path: fp8 widen_ldsm on sm_80 and sm_90 (the shapes the Hopper
// kernel does not take), two_term on sm_89; int8 two_term_qk on sm_90, widen_ldsm elsewhere), and
// on sm_90a the other arches' 8-bit paths the GPU suite runs there too (make_gqa_key's
// path_arch). Each cubin exports the kernel symbol without spilling. Prints cold compile time,
// registers and spills per specialization.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::cuda {
namespace {

GqaConfig config(int q_heads, int kv_heads, int head_dim, int page, DType q, DType kv, DType out) {
  GqaConfig c;
  c.num_q_heads = q_heads, c.num_kv_heads = kv_heads, c.head_dim = head_dim, c.page_size = page;
  c.q_dtype = q, c.kv_dtype = kv, c.out_dtype = out;
  c.max_batch = 8, c.max_seq_len = 4096;
  c.checked = false;
  return c;
}

// The benchmarked model shapes and the ones the kernel treats differently: head_dim % 32 == 16 (a
// lone last 16-dim k step), head_dim 256 (16-token chunks, q in shared memory), 32 and 64 rows,
// beams, masks, fp16 q, fp8 output.
std::vector<GqaConfig> representative_configs() {
  const DType bf16 = DType::kBF16, fp16 = DType::kFP16, fp8 = DType::kFP8E4M3, int8 = DType::kINT8;
  std::vector<GqaConfig> cs;
  for (DType kv : {bf16, fp8, int8}) {
    cs.push_back(config(64, 8, 128, 32, bf16, kv, bf16));   // l70
    cs.push_back(config(64, 4, 128, 64, bf16, kv, bf16));   // q235
    cs.push_back(config(16, 8, 256, 64, bf16, kv, bf16));   // g3: head_dim 256
    cs.push_back(config(32, 2, 112, 16, fp16, kv, fp16));   // head_dim % 32 == 16, fp16
    GqaConfig spec8 = config(64, 8, 128, 64, bf16, kv, bf16);  // speculative q_len 8: 64 rows
    spec8.max_q_len = 8, spec8.tree_mask = true;
    cs.push_back(spec8);
    GqaConfig beam = config(64, 8, 128, 16, bf16, kv, bf16);  // 4 beams share a CTA: 32 rows
    beam.beam_width = 4, beam.max_batch = 16, beam.window = 512;
    cs.push_back(beam);
  }
  cs.push_back(config(8, 8, 128, 64, bf16, bf16, bf16));        // mha
  GqaConfig w = config(64, 8, 64, 16, bf16, bf16, bf16);         // gpt-oss: window + sinks
  w.window = 128, w.sinks = true;
  cs.push_back(w);
  w.kv_dtype = int8;
  cs.push_back(w);
  GqaConfig t = config(64, 8, 128, 64, bf16, fp8, bf16);         // q_len 4, tree + soft-cap
  t.max_q_len = 4, t.tree_mask = true, t.softcap = 30.f;
  cs.push_back(t);
  t.kv_dtype = int8;
  cs.push_back(t);
  cs.push_back(config(64, 8, 80, 16, bf16, fp8, fp8));           // odd head_dim, fp8 out
  cs.push_back(config(24, 4, 96, 16, bf16, int8, fp8));          // group 6, fp8 out
  cs.push_back(config(32, 8, 128, 16, fp16, int8, fp16));        // int8, fp16
  return cs;
}

// The portable kernel's keys a plan makes on `arch`, and on sm_90 the other arches' 8-bit paths.
std::vector<GqaKernelKey> keys_for(int arch) {
  std::vector<GqaKernelKey> keys;
  std::set<std::string> names;
  auto add = [&](const GqaKernelKey& k) {
    if (!k.wgmma() && names.insert(k.name()).second) keys.push_back(k);  // wgmma: sm90 test
  };
  for (const GqaConfig& c : representative_configs()) {
    add(make_gqa_key(c, arch));
    if (arch == 90 && c.kv_dtype != DType::kBF16) {
      for (int path_arch : {80, 89}) add(make_gqa_key(c, arch, 132, path_arch));
    }
  }
  return keys;
}

TEST(GqaNvrtcMatrix, CompilesForSm90aSm89AndSm80) {
  for (int arch : {90, 89, 80}) {
    for (const GqaKernelKey& k : keys_for(arch)) {
      EXPECT_EQ(k.name().find("_2term") != std::string::npos, k.two_term()) << k.name();
      EXPECT_EQ(k.name().find("_2tqk") != std::string::npos, k.fp8_path() == kv::kTwoTermQk) << k.name();
      EXPECT_EQ(k.name().find("_ldsm") != std::string::npos, k.fp8_path() == kv::kWidenLdsm) << k.name();
      const jit::JitSpec spec = k.spec();
      const jit::CompileResult r = jit::compile(spec);
      ASSERT_FALSE(r.cubin.empty()) << spec.name;
      ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
      EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
      std::printf("[nvrtc] %-60s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
                  r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
                  r.ptxas.stack_bytes);
      // A spill is a local-memory round trip per tile: none up to head_dim 128, nor for int8 at
      // any head_dim. Beyond 128 the bf16 and fp8 kernels hold O (head_dim / 2 registers) at the
      // two-CTA bound of 255 and a few words spill. sm_89's two-term fp8 path compiled for sm_90a
      // is not a plan's choice there (ptxas emulates the e4m3 mma.sync with fp16 HMMA and unpacks
      // q's terms: 255 registers, a few bytes spill); it is compiled so that the GPU suite can
      // run sm_89's code on an H200.
      const bool emulated = arch == 90 && k.two_term();
      if (!emulated && (k.head_dim <= 128 || k.kv_dtype == static_cast<int>(DType::kINT8))) {
        EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
      }
    }
  }
}

// The 8-bit path a plan's key takes, per arch (gqa_spec.hpp), and the path_arch a test gives.
TEST(GqaNvrtcMatrix, EightBitPathPerArch) {
  GqaConfig c = config(64, 8, 128, 64, DType::kBF16, DType::kINT8, DType::kBF16);
  for (int arch : {80, 86, 89, 90, 100}) {
    c.kv_dtype = DType::kINT8;
    GqaKernelKey k = make_gqa_key(c, arch);
    EXPECT_EQ(k.fp8_path(), arch == 90 ? kv::kTwoTermQk : kv::kWidenLdsm) << k.name();
    EXPECT_EQ(k.name().find("_2tqk") != std::string::npos, arch == 90) << k.name();
    c.kv_dtype = DType::kFP8E4M3;
    k = make_gqa_key(c, arch);
    EXPECT_EQ(k.fp8_path(), arch == 89 ? kv::kTwoTerm : (arch == 90 ? kv::kWgmma : kv::kWidenLdsm))
        << k.name();
    c.head_dim = 64;  // the Hopper kernel takes head_dim 128 only
    EXPECT_EQ(make_gqa_key(c, arch).fp8_path(), arch == 89 ? kv::kTwoTerm : kv::kWidenLdsm) << arch;
    c.head_dim = 128;
    c.kv_dtype = DType::kBF16;
    k = make_gqa_key(c, arch);
    EXPECT_EQ(k.fp8_path(), kv::k16Bit) << k.name();
    EXPECT_EQ(k.name().find("_ldsm"), std::string::npos) << k.name();
    EXPECT_NE(k.spec().source.find("kFp8Mma = 0;"), std::string::npos) << k.spec().source;
  }
  // path_arch: another arch's choice, compiled for this one.
  c.kv_dtype = DType::kINT8;
  EXPECT_EQ(make_gqa_key(c, 80, 132, 90).fp8_path(), kv::kTwoTermQk);  // IMMA: native on sm_80
  EXPECT_EQ(make_gqa_key(c, 90, 132, 80).fp8_path(), kv::kWidenLdsm);
  c.kv_dtype = DType::kFP8E4M3;
  EXPECT_EQ(make_gqa_key(c, 90, 132, 89).fp8_path(), kv::kTwoTerm);
  EXPECT_EQ(make_gqa_key(c, 90, 132, 80).fp8_path(), kv::kWidenLdsm);
  EXPECT_EQ(make_gqa_key(c, 80, 132, 89).fp8_path(), kv::kWidenLdsm);  // e4m3 mma.sync: sm_89+
  EXPECT_EQ(make_gqa_key(c, 89, 132, 90).fp8_path(), kv::kWidenLdsm);  // wgmma: sm_90a only
  // A key asking for a path its cache type does not have reads as the widening.
  GqaKernelKey odd;
  odd.kv_dtype = static_cast<int>(DType::kINT8), odd.fp8_mma = kv::kTwoTerm;
  EXPECT_EQ(odd.fp8_path(), kv::kWidenLdsm);
  odd.kv_dtype = static_cast<int>(DType::kFP8E4M3), odd.fp8_mma = kv::kTwoTermQk;
  EXPECT_EQ(odd.fp8_path(), kv::kWidenLdsm);
}

}  // namespace
}  // namespace deca::cuda
