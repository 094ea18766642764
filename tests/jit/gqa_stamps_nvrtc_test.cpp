// The phase stamps' build of the Hopper GQA kernels (kernels/gqa/stamps.cuh; GqaKernelKey::stamps,
// "_stamp") without a GPU: only the stamp build's source defines DECA_GQA_STAMPS, so every other
// kernel's source (and cache key, and machine code) stays as it was; NVRTC compiles the stamp
// builds of the bench's split and multi-wave rows, rows on M and the 16-bit head dims for sm_90a
// without spills, at the plain kernel's CTAs per SM (so the stamped launch is placed as the timed
// one), with the record buffer and the mark kernel in the module and neither in the plain one.
#include <gtest/gtest.h>

#include <string>

#include "cuda/gqa_spec.hpp"
#include "deca/gqa.hpp"
#include "jit/compile_check.hpp"
#include "jit/gqa_sm90_config.hpp"

namespace deca::cuda {
namespace {

struct StampRow {
  int q_heads, kv_heads, head_dim, q_len, batch, seq_len;
  DType kv;
  const char* why;
};

constexpr StampRow kRows[] = {
    {64, 8, 128, 1, 1, 16384, DType::kBF16, "l70-b1-16k bf16: rows on N, 3 stages, 32 splits"},
    {64, 8, 128, 1, 1, 16384, DType::kFP8E4M3, "l70-b1-16k fp8: the two-term path"},
    {64, 8, 128, 1, 99, 4096, DType::kFP8E4M3, "l70-b99-4k fp8: two stages, several waves"},
    {64, 8, 128, 4, 32, 4096, DType::kFP8E4M3, "spec-b32-4k q4: rows on M"},
    {32, 4, 64, 1, 8, 4096, DType::kFP16, "16-bit head_dim 64"},
    {16, 8, 256, 1, 8, 4096, DType::kBF16, "16-bit head_dim 256"},
};

GqaKernelKey key_of(const StampRow& r, bool checked = false) {
  GqaConfig c = testing::sm90_config(r.q_heads, r.kv_heads, r.head_dim, r.q_len, r.kv);
  c.max_batch = r.batch;
  c.max_seq_len = r.seq_len;
  c.q_dtype = c.out_dtype = r.kv == DType::kFP16 ? DType::kFP16 : DType::kBF16;
  c.checked = checked;  // deca-bench's rows are unchecked; the GPU suite's plans checked
  return make_gqa_key(c, 90, 132, 0, /*hopper_16bit=*/true);
}

TEST(GqaStampsNvrtc, OnlyTheStampBuildDefinesTheSwitch) {
  for (const StampRow& r : kRows) {
    GqaKernelKey key = key_of(r);
    ASSERT_TRUE(key.wgmma()) << r.why;
    const std::string plain = key.spec().source;
    EXPECT_EQ(plain.find("DECA_GQA_STAMPS"), std::string::npos) << plain;
    key.stamps = true;
    const std::string stamped = key.spec().source;
    EXPECT_EQ(key.name(), key_of(r).name() + "_stamp");
    // Before struct Cfg and every include; the rest of the source as the plain kernel's.
    const std::string define = "#define DECA_GQA_STAMPS 1\n";
    const std::size_t at = stamped.find(define);
    ASSERT_NE(at, std::string::npos) << stamped;
    EXPECT_LT(at, stamped.find("struct Cfg")) << stamped;
    const std::string rest = stamped.substr(at + define.size());
    EXPECT_EQ(rest, plain.substr(plain.find("struct Cfg"))) << r.why;
  }
}

TEST(GqaStampsNvrtc, StampBuildsCompileWithoutSpillsAtThePlainOccupancy) {
  for (const StampRow& r : kRows) {
    GqaKernelKey key = key_of(r);
    key.stamps = true;
    const jit::JitSpec spec = key.spec();
    const jit::CompileResult s = jit::testing::compile_and_check(spec);
    jit::testing::expect_no_spills(s, spec.name);
    EXPECT_EQ(s.log.find("serialized"), std::string::npos) << spec.name << ":\n" << s.log;
    // The registers still fit the CTAs per SM the plain kernel is sized for (__launch_bounds__).
    const int min_ctas = key.shape().min_ctas;
    EXPECT_LE(s.ptxas.registers * key.shape().threads * min_ctas, 64 * 1024) << spec.name;
    EXPECT_TRUE(jit::testing::elf_has_symbol(s.cubin, "deca_gqa_stamps")) << spec.name;
    EXPECT_TRUE(jit::testing::elf_has_symbol(s.cubin, "deca_gqa_stamp_mark")) << spec.name;
  }
  GqaKernelKey checked = key_of(kRows[0], /*checked=*/true);
  checked.stamps = true;
  const jit::CompileResult c = jit::testing::compile_and_check(checked.spec());
  jit::testing::expect_no_spills(c, checked.name());
  // The plain kernel's module has neither (one row: the switch is the same for all).
  const jit::JitSpec plain = key_of(kRows[0]).spec();
  const jit::CompileResult p = jit::testing::compile_and_check(plain);
  EXPECT_FALSE(jit::testing::elf_has_symbol(p.cubin, "deca_gqa_stamps")) << plain.name;
  EXPECT_FALSE(jit::testing::elf_has_symbol(p.cubin, "deca_gqa_stamp_mark")) << plain.name;
}

}  // namespace
}  // namespace deca::cuda
