// Beam search on the GPU against the CPU reference: the beams of a request share a CTA and read
// their common pages once (kernels/gqa/sm80/cta.cuh's work items), over 16-bit, fp8 and int8
// caches and the 8-bit paths of each arch. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

// Beam search: the beams of a request share their first pages (the common prefix) and own their
// last ones. The kernel reads shared pages once for all beams; the results must equal the CPU
// reference, which treats every beam as an independent request.
struct BeamCase {
  std::string name;
  GqaCaseSpec spec;
  int beams;
  int own_pages;  // trailing pages each beam owns (the rest are beam 0's)
  GpuOptions opt;
};

std::vector<BeamCase> beam_cases() {
  std::vector<BeamCase> m;
  {
    GqaCaseSpec s = base_spec(32, 4, 128, 16, DType::kBF16);
    s.batch = 12, s.seq_lens = {500, 500, 500, 500, 130, 131, 129, 135, 17, 17, 17, 17};
    GpuOptions o;
    o.beam_width = 4;
    m.push_back({"beam4_bf16", s, 4, 2, o});
    s.kv_dtype = DType::kFP8E4M3;
    s.layout = KvLayout::kHND;
    m.push_back({"beam4_fp8_hnd", s, 4, 1, o});
  }
  {
    GqaCaseSpec s = base_spec(64, 8, 128, 32, DType::kFP8E4M3);
    s.batch = 4, s.seq_lens = {9000, 9000, 9003, 8990};
    s.window = 300;
    s.sinks = true;
    GpuOptions o;
    o.beam_width = 4;
    m.push_back({"beam4_split_window_sinks", s, 4, 3, o});
    s.window = 0, s.sinks = false;
    m.push_back({"beam4_split", s, 4, 3, o});
    o.path_arch = 89;  // fp8 on the e4m3 mma.sync (sm_89's path)
    m.push_back({"beam4_split_two_term", s, 4, 3, o});
    s.window = 300, s.sinks = true;
    m.push_back({"beam4_split_window_sinks_two_term", s, 4, 3, o});
    // int8 QK on IMMA (sm_90's path): the beams' shared pages read once, items per beam masked
    // for the others.
    s.kv_dtype = DType::kINT8;
    o.path_arch = 90;
    m.push_back({"beam4_int8_split_window_sinks_two_term_qk", s, 4, 3, o});
    s.window = 0, s.sinks = false;
    m.push_back({"beam4_int8_split_two_term_qk", s, 4, 3, o});
  }
  {
    GqaCaseSpec s = base_spec(32, 4, 128, 16, DType::kINT8);
    s.batch = 12, s.seq_lens = {500, 500, 500, 500, 130, 131, 129, 135, 17, 17, 17, 17};
    s.layout = KvLayout::kHND;
    GpuOptions o;
    o.beam_width = 4;
    o.path_arch = 90;
    m.push_back({"beam4_int8_hnd_two_term_qk", s, 4, 1, o});
  }
  {
    GqaCaseSpec s = base_spec(16, 2, 64, 16, DType::kBF16);
    s.batch = 4, s.q_len = 2, s.seq_lens = {100, 101, 40, 40};
    s.tree_mask = true;
    GpuOptions o;
    o.beam_width = 2;
    m.push_back({"beam2_tree_qlen2", s, 2, 1, o});
  }
  {
    GqaCaseSpec s = base_spec(64, 4, 128, 16, DType::kBF16);  // 4 beams x 16 heads: two row blocks
    s.batch = 4, s.seq_lens = {333, 333, 333, 333};
    GpuOptions o;
    o.beam_width = 4;
    m.push_back({"beam4_two_row_blocks", s, 4, 1, o});
  }
  // Pages longer than a tile (head_dim 256 at 32 rows: 32-token tiles for 16-bit caches, 64 for
  // 8-bit), split boundaries a tile or more inside a page the beams do not share: the beams'
  // shared prefix is empty there, not a negative count (which re-read the keys before the split).
  {
    GqaCaseSpec s = base_spec(8, 2, 256, 89, DType::kFP16);  // group 4 x q_len 2 x 3 beams: 24 rows
    s.batch = 6, s.q_len = 2, s.seq_lens = {120, 120, 120, 109, 70, 118};
    s.q_dtype = DType::kFP16;
    GpuOptions o;
    o.beam_width = 3;
    o.split_mode = SplitMode::kFixed;
    o.split_tokens = 32;
    m.push_back({"beam3_d256_page89_fixed_split", s, 3, 2, o});
    o.split_mode = SplitMode::kAuto;
    o.split_tokens = 0;
    m.push_back({"beam3_d256_page89_split", s, 3, 2, o});
  }
  {
    GqaCaseSpec s = base_spec(16, 1, 256, 128, DType::kFP8E4M3);  // group 16 x 2 beams: 32 rows
    s.batch = 4, s.seq_lens = {739, 739, 380, 386};      // shared pages 0-3 and 0-1
    s.layout = KvLayout::kHND;
    s.softcap = 12.f;
    s.sinks = true;
    GpuOptions o;
    o.beam_width = 2;
    o.split_mode = SplitMode::kFixed;
    o.split_tokens = 64;
    m.push_back({"beam2_d256_fp8_page128_fixed_split", s, 2, 2, o});
  }
  return m;
}

void PrintTo(const BeamCase& c, std::ostream* os) { *os << c.name; }

class GqaGpuBeams : public ::testing::TestWithParam<BeamCase> {};

TEST_P(GqaGpuBeams, MatchesCpuReference) {
  DECA_REQUIRE_GPU();
  const BeamCase& bc = GetParam();
  auto rng = make_rng(std::hash<std::string>{}(bc.name));
  GqaCase c = build_gqa_case(bc.spec, rng);
  share_prefix_pages(c, bc.beams, bc.own_pages);
  const GpuRun gpu = run_gqa_on_gpu(c, bc.opt);
  expect_matches_reference(bc.name, c, gpu);
  if (bc.spec.kv_dtype == DType::kFP8E4M3 && bc.opt.path_arch == 89 && cuda::compute_capability(0) >= 89) {
    EXPECT_NE(gpu.plan.kernel_name.find("_2term"), std::string::npos) << gpu.plan.kernel_name;
    EXPECT_LE(compare(c, gpu).rel_l2, 4e-3) << seed_message();
  }
  if (bc.spec.kv_dtype == DType::kINT8 && bc.opt.path_arch == 90) {
    EXPECT_NE(gpu.plan.kernel_name.find("_2tqk"), std::string::npos) << gpu.plan.kernel_name;
    EXPECT_LE(compare(c, gpu).rel_l2, 4e-3) << seed_message();
  }
}

INSTANTIATE_TEST_SUITE_P(Beams, GqaGpuBeams, ::testing::ValuesIn(beam_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace deca::test
