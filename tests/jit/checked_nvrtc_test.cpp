// Checked mode (issue 9): NVRTC compiles the "_chk" specializations of the GQA kernel and of the
// portable MLA sparse decode kernel for sm_90a (and sm_80) without a GPU, each exports its entry
// and the benchmarked shapes do not spill; an unchecked key's generated source does not mention
// the checked mode at all (same text, same cache key, same code as before the mode existed).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "cuda/mla_spec.hpp"
#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::cuda {
namespace {

constexpr int kBf16 = 0, kFp8 = 3;

GqaKernelKey gqa_key(int d, int g, int rows, int page, int kv) {
  GqaKernelKey k;
  k.arch = 90;
  k.head_dim = d, k.group = g, k.rows = rows, k.page_size = page;
  k.kv_dtype = kv;
  k.fp8_mma = kv::kWidenLdsm;  // sm_90a's default for 8-bit caches (gqa_spec.cpp)
  return k;
}

// The shapes of the bench table plus the paths the checks touch differently: beams (the shared
// prefix scan and per-beam items), a window, split-free and q in shared memory (head_dim 256).
std::vector<GqaKernelKey> checked_keys() {
  std::vector<GqaKernelKey> keys = {gqa_key(128, 8, 16, 32, kBf16), gqa_key(128, 8, 16, 64, kFp8),
                                    gqa_key(128, 8, 64, 64, kFp8), gqa_key(256, 2, 16, 64, kBf16)};
  GqaKernelKey beam = gqa_key(128, 8, 32, 16, kFp8);
  beam.beam_width = 4, beam.window = true;
  keys.push_back(beam);
  GqaKernelKey tree = gqa_key(128, 8, 32, 64, kFp8);
  tree.tree = true, tree.softcap = true;
  keys.push_back(tree);
  for (GqaKernelKey& k : keys) k.checked = true;
  return keys;
}

TEST(GqaCheckedNvrtc, ChkSpecializationsCompileForSm90aWithoutSpilling) {
  for (GqaKernelKey k : checked_keys()) {
    const std::string name = k.name();
    ASSERT_EQ(name.substr(name.size() - 4), "_chk") << name;
    const jit::JitSpec spec = k.spec();
    EXPECT_NE(spec.source.find("kChecked = true"), std::string::npos) << spec.source;
    const jit::CompileResult r = jit::compile(spec);
    ASSERT_FALSE(r.cubin.empty()) << spec.name;
    ASSERT_TRUE(r.ptxas.found) << spec.name;
    EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
    GqaKernelKey plain = k;
    plain.checked = false;
    const jit::CompileResult u = jit::compile(plain.spec());
    std::printf("[nvrtc] %-60s %7.0f ms  regs=%d (unchecked %d) spill_stores=%d\n",
                spec.name.c_str(), r.compile_ms, r.ptxas.registers, u.ptxas.registers,
                r.ptxas.spill_store_bytes);
    if (k.head_dim <= 128) EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
  }
}

TEST(GqaCheckedNvrtc, UncheckedSourceIsUnchangedAndNamesDiffer) {
  GqaKernelKey k = gqa_key(128, 8, 16, 32, kBf16);
  const jit::JitSpec plain = k.spec();
  EXPECT_EQ(plain.source.find("kChecked"), std::string::npos) << plain.source;
  EXPECT_EQ(k.name(), "gqa_sm90_d128_g8_r16_p32_qbf16_kvbf16_obf16");
  k.checked = true;
  EXPECT_EQ(k.name(), "gqa_sm90_d128_g8_r16_p32_qbf16_kvbf16_obf16_chk");
  EXPECT_NE(k.spec().source, plain.source);
}

TEST(GqaCheckedNvrtc, ConfigFlagReachesTheKey) {
  GqaConfig c;
  c.num_q_heads = 8, c.num_kv_heads = 1, c.max_seq_len = 64;
  c.checked = true;
  EXPECT_TRUE(make_gqa_key(c, 90).checked);
  c.checked = false;
  EXPECT_FALSE(make_gqa_key(c, 90).checked);
}

TEST(MlaCheckedNvrtc, PortableChkDecodeCompilesForSm90aAndSm80WithoutSpilling) {
  for (int arch : {90, 80}) {
    MlaConfig c;
    c.num_heads = 128, c.sparse = true, c.topk = 2048, c.checked = true;
    // sm_90 runs the sm90 kernels' checked builds (mla_sm90_nvrtc_test.cpp); the portable one is
    // what sm_80 (and DECA_MLA_KERNEL=portable) runs, compiled here for both.
    const MlaKernelKey key = mla_decode_key(arch, "portable", c);
    EXPECT_EQ(mla_plan_variant(arch, c), mla_decode_variant(arch));
    EXPECT_EQ(key.name(), "mla_sparse_decode_portable_chk_sm" + std::to_string(arch));
    const jit::JitSpec spec = key.spec();
    EXPECT_NE(spec.source.find("sm80/entry_checked.cuh"), std::string::npos) << spec.source;
    const jit::CompileResult r = jit::compile(spec);
    ASSERT_FALSE(r.cubin.empty()) << spec.name;
    ASSERT_TRUE(r.ptxas.found) << spec.name;
    EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
    std::printf("[nvrtc] %-40s %7.0f ms  regs=%d spill_stores=%d\n", spec.name.c_str(),
                r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes);
    EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
  }
}

TEST(MlaCheckedNvrtc, CheckedPlansRunTheirVariantsCheckedBuild) {
  MlaConfig c;
  c.num_heads = 128, c.sparse = true, c.topk = 2048;
  c.checked = true;
  EXPECT_EQ(mla_plan_variant(90, c), mla_decode_variant(90));
  EXPECT_EQ(mla_plan_variant(80, c), "portable");
  c.checked = false;
  EXPECT_EQ(mla_plan_variant(90, c), mla_decode_variant(90));
  MlaKernelKey plain = mla_decode_key(90, "portable", c);
  EXPECT_FALSE(plain.checked);
  EXPECT_EQ(plain.spec().source.find("checked"), std::string::npos) << plain.spec().source;
  // The sm90 kernels' checked builds (mla_sm90_nvrtc_test.cpp): a checked config marks either
  // variant's key.
  c.checked = true;
  EXPECT_TRUE(mla_decode_key(90, "sm90", c).checked);
}

}  // namespace
}  // namespace deca::cuda
