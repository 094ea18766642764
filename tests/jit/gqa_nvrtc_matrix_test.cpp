// NVRTC compiles a representative matrix of GQA kernel specializations for sm_90a and sm_80
// (no GPU needed: this runs in CI) and each cubin exports the expected kernel symbol without
// spilling. Prints cold compile time, registers and spills per specialization.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "jit/nvrtc_compile.hpp"
#include "jit/elf_symbols.hpp"

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

TEST(GqaNvrtcMatrix, CompilesForSm90aAndSm80) {
  const int bf16 = 0, fp8 = 3;
  for (int arch : {90, 80}) {
    for (GqaKernelKey k : representative_keys()) {
      k.arch = arch;
      const jit::JitSpec spec = k.spec();
      const jit::CompileResult r = jit::compile(spec);
      ASSERT_FALSE(r.cubin.empty()) << spec.name;
      ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log";
      EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
      std::printf("[nvrtc] %-52s %7.0f ms  regs=%d spill_stores=%d stack=%d\n", spec.name.c_str(),
                  r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
                  r.ptxas.stack_bytes);
      // The benchmarked shapes (bf16 / fp8 cache, head_dim <= 128) must not spill: a spill is a
      // local-memory round trip per tile.
      if (k.head_dim <= 128 && (k.kv_dtype == bf16 || k.kv_dtype == fp8)) {
        EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << spec.name;
      }
    }
  }
}

}  // namespace
}  // namespace deca::cuda
