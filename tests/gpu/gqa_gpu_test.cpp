// GQA decode on the GPU against the CPU reference, over a matrix that covers every feature of the
// kernel and their combinations (docs/semantics.md, "GQA / MQA / MHA decode"). Fresh random data
// per case (seed: DECA_TEST_SEED), unused KV slots poisoned with NaN, unused page-table columns
// with huge ids, outputs poisoned before each run. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

struct MatrixCase {
  std::string name;
  GqaCaseSpec spec;
  GpuOptions opt;
};

// The matrix's cases, by what they cover; each add(name, spec, options) is one case.
struct CaseList {
  std::vector<MatrixCase>& m;
  void operator()(std::string name, GqaCaseSpec s, GpuOptions o = {}) const {
    m.push_back({std::move(name), std::move(s), o});
  }
};

// Lengths at the edges, dtypes, head dims, group sizes, page sizes, K and V in one allocation.
void shape_cases(const CaseList& add) {
  // Lengths at the edges: 1, page-1, page, page+1, a tile +-1, long; several per batch.
  const std::vector<int> edges = {1, 15, 16, 17, 63, 64, 65, 127, 129, 300, 1000};
  for (DType kv : {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kINT8}) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      GqaCaseSpec s = base_spec(16, 2, 128, 16, kv);
      s.batch = static_cast<int>(edges.size());
      s.seq_lens = edges;
      s.layout = layout;
      s.q_dtype = kv == DType::kFP16 ? DType::kFP16 : DType::kBF16;
      s.out_dtype = s.q_dtype;
      add(std::string("edges_") + dtype_name(kv) + (layout == KvLayout::kNHD ? "_nhd" : "_hnd"), s);
    }
  }
  // Mixed q / kv / out dtypes.
  {
    GqaCaseSpec s = base_spec(8, 1, 128, 32, DType::kFP8E4M3);
    s.batch = 3, s.seq_lens = {100, 1, 777};
    s.q_dtype = DType::kFP16;
    s.out_dtype = DType::kBF16;
    add("q_fp16_kv_fp8", s);
    s.kv_dtype = DType::kBF16;
    s.out_dtype = DType::kFP16;
    add("q_fp16_kv_bf16_out_fp16", s);
    s.kv_dtype = DType::kINT8;
    s.q_dtype = DType::kFP16;
    add("q_fp16_kv_int8", s);
    s.kv_dtype = DType::kFP8E4M3;
    s.q_dtype = DType::kBF16;
    s.out_dtype = DType::kFP8E4M3;
    s.out_scale = 0.01f;
    add("out_fp8", s);
  }
  // Head dims (every multiple of 16 the tile logic treats differently) and group sizes.
  for (int d : {64, 80, 96, 112, 144, 192, 256}) {
    for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
      GqaCaseSpec s = base_spec(8, 2, d, 16, kv);
      s.batch = 2, s.seq_lens = {200, 33};
      add("d" + std::to_string(d) + "_" + dtype_name(kv), s);
    }
  }
  for (int g : {1, 2, 4, 8, 16, 32, 64}) {
    GqaCaseSpec s = base_spec(g * 2, 2, 128, 32, g % 2 ? DType::kBF16 : DType::kFP8E4M3);
    s.batch = 2, s.seq_lens = {250, 70};
    add("group" + std::to_string(g), s);
  }
  // Page sizes (and one page per request: a contiguous cache).
  for (int page : {1, 8, 32, 64, 128, 256}) {
    GqaCaseSpec s = base_spec(8, 1, 128, page, page >= 64 ? DType::kFP8E4M3 : DType::kBF16);
    s.batch = 3, s.seq_lens = {page + 1, 2 * page - 1, 5};
    add("page" + std::to_string(page), s);
  }
  {
    GqaCaseSpec s = base_spec(8, 2, 128, 512, DType::kBF16);
    s.batch = 2, s.seq_lens = {512, 301};
    add("contiguous_512", s);
  }
  // K and V as views of one allocation (interleaved per page).
  {
    GqaCaseSpec s = base_spec(8, 2, 128, 16, DType::kFP8E4M3);
    s.batch = 2, s.seq_lens = {90, 17};
    s.kv_one_allocation = true;
    add("kv_one_allocation", s);
  }
}

// Features (window, sinks, soft-cap, per-head scales, LSE off, speculative decoding) and split-KV.
void feature_cases(const CaseList& add) {
  // Features: window, sinks, soft-cap, per-head scales, LSE off, speculative decoding.
  {
    GqaCaseSpec s = base_spec(64, 8, 64, 16, DType::kBF16);
    s.batch = 3, s.seq_lens = {1000, 100, 5};
    s.window = 128;
    s.sinks = true;
    add("window_sinks_gptoss", s);
    s.window = 1;
    add("window_1", s);
    s.window = 0;
    s.softcap = 30.f;
    add("softcap", s);
  }
  {
    GqaCaseSpec s = base_spec(16, 4, 128, 32, DType::kINT8);
    s.batch = 2, s.seq_lens = {400, 40};
    s.per_head_scales = true;
    s.lse = false;
    add("per_head_scales_no_lse", s);
    s.kv_dtype = DType::kFP8E4M3;
    add("per_head_scales_fp8", s);
  }
  for (int q_len : {2, 4, 8}) {
    GqaCaseSpec s = base_spec(64, 8, 128, 64, q_len == 4 ? DType::kBF16 : DType::kFP8E4M3);
    s.batch = 3, s.q_len = q_len, s.seq_lens = {500, q_len, q_len + 3};
    add("causal_qlen" + std::to_string(q_len), s);
    s.tree_mask = true;
    add("tree_qlen" + std::to_string(q_len), s);
    s.window = 64;
    add("tree_window_qlen" + std::to_string(q_len), s);
  }
  {
    GqaCaseSpec s = base_spec(64, 4, 128, 64, DType::kBF16);  // 16 x 8 = 128 rows: two row blocks
    s.batch = 2, s.q_len = 8, s.seq_lens = {300, 9};
    s.tree_mask = true;
    add("tree_two_row_blocks", s);
  }
  {
    GqaCaseSpec s = base_spec(128, 1, 128, 32, DType::kFP8E4M3);  // group 128: row blocks of 64
    s.batch = 2, s.seq_lens = {333, 1};
    add("group128", s);
  }
  // Split-KV: long requests with few CTAs force many splits; a tiny batch too.
  {
    GqaCaseSpec s = base_spec(64, 8, 128, 64, DType::kBF16);
    s.batch = 1, s.seq_lens = {20000};
    add("split_long_bf16", s);
    s.kv_dtype = DType::kFP8E4M3;
    add("split_long_fp8", s);
    s.batch = 4, s.seq_lens = {9000, 1, 0, 64};
    add("split_mixed_lengths", s);
    s.window = 200;
    s.sinks = true;
    add("split_window", s);
  }
  // The split merge with lanes sharing an output quad's splits (epilogue.cuh): one row per CTA
  // (group 1) and two rows at head_dim 64 leave most threads without a quad of their own.
  {
    GqaCaseSpec s = base_spec(4, 4, 128, 64, DType::kBF16);
    s.batch = 1, s.seq_lens = {20000};
    add("split_group1", s);
    s = base_spec(8, 4, 64, 64, DType::kFP8E4M3);
    s.batch = 2, s.seq_lens = {12000, 5};
    s.sinks = true;
    add("split_group2_d64_sinks", s);
  }
  {
    GqaCaseSpec s = base_spec(8, 1, 128, 16, DType::kBF16);
    s.batch = 5, s.seq_lens = {3000, 10, 1500, 64, 65};
    GpuOptions o;
    o.split_mode = SplitMode::kFixed;
    o.split_tokens = 256;
    add("fixed_split", s, o);
    o.max_seq_len = 8192;  // a promise larger than the data: empty trailing splits
    add("fixed_split_empty_tail", s, o);
  }
  {
    // A promised max_q_len larger than the run's q_len would change rows; a larger max_batch
    // and max_seq_len than the run's must not change results.
    GqaCaseSpec s = base_spec(32, 8, 128, 16, DType::kFP8E4M3);
    s.batch = 2, s.seq_lens = {700, 50};
    GpuOptions o;
    o.max_batch = 64;
    o.max_seq_len = 32768;
    add("promised_maxima", s, o);
  }
}

// The Hopper fp8 kernel's own paths.
void sm90_cases(const CaseList& add) {
  // The Hopper fp8 kernel (kernels/gqa/sm90/, sm_90a's default for fp8 at head_dim 128) over what
  // its own code handles differently from the portable kernel: rows on wgmma's N (8 / 16 / 32 / 64,
  // groups that are not powers of two padded inside), two row blocks of 64, q_len 4 and 8 with
  // causal and tree masks and a window, page sizes that are not powers of two, splits with empty
  // and one-token requests, sinks, soft-cap, per-head scales with HND, fp8 output, the fixed split.
  // Elsewhere these run the portable kernel's default path.
  {
    for (int g : {3, 5, 6, 12}) {
      GqaCaseSpec s = base_spec(g * 2, 2, 128, 32, DType::kFP8E4M3);
      s.batch = 3, s.seq_lens = {250, 70, 129};
      add("fp8_group" + std::to_string(g), s);
    }
    for (int page : {1, 8, 48}) {
      GqaCaseSpec s = base_spec(8, 1, 128, page, DType::kFP8E4M3);
      s.batch = 3, s.seq_lens = {page + 1, 2 * page + 130, 5};
      add("fp8_page" + std::to_string(page), s);
    }
    for (int q_len : {4, 8}) {
      GqaCaseSpec s = base_spec(q_len == 4 ? 64 : 32, q_len == 4 ? 8 : 2, 128, 64, DType::kFP8E4M3);
      s.batch = 3, s.q_len = q_len, s.seq_lens = {700, q_len, q_len + 130};
      add("fp8_causal_qlen" + std::to_string(q_len), s);
      s.tree_mask = true;
      add("fp8_tree_qlen" + std::to_string(q_len), s);
      s.window = 100;
      s.sinks = true;
      add("fp8_tree_window_sinks_qlen" + std::to_string(q_len), s);
    }
    GqaCaseSpec s = base_spec(64, 4, 128, 64, DType::kFP8E4M3);  // 16 x 8 = 128 rows: two blocks of 64
    s.batch = 2, s.q_len = 8, s.seq_lens = {300, 9};
    s.tree_mask = true;
    add("fp8_tree_two_row_blocks", s);
  }
  {
    GqaCaseSpec s = base_spec(64, 8, 128, 64, DType::kFP8E4M3);
    s.batch = 4, s.seq_lens = {9000, 1, 0, 64};
    s.window = 200;
    s.sinks = true;
    add("fp8_split_window_sinks", s);
    s.layout = KvLayout::kHND;
    s.per_head_scales = true;
    add("fp8_split_window_sinks_hnd_scales", s);
    s.window = 0, s.sinks = false;
    s.softcap = 30.f;
    add("fp8_split_softcap_hnd", s);
  }
  {
    GqaCaseSpec s = base_spec(8, 1, 128, 16, DType::kFP8E4M3);
    s.batch = 5, s.seq_lens = {3000, 10, 1500, 0, 65};
    GpuOptions o;
    o.split_mode = SplitMode::kFixed;
    o.split_tokens = 256;
    add("fp8_fixed_split", s, o);
    s.out_dtype = DType::kFP8E4M3;
    s.out_scale = 0.01f;
    add("fp8_fixed_split_out_fp8", s, o);
  }
}

// The rows-on-M kernel's own paths.
void rows_on_m_cases(const CaseList& add) {
  // The rows-on-M kernel (kernels/gqa/sm90/decode_rows.cuh, 32 or 64 rows) over what it does its
  // own way: query rows mapped to operand rows (32: one real row per thread, padding skipped),
  // groups that are not powers of two (30 and 40 rows), masks per (row, token) in the permuted K
  // order, splits with empty and short requests, two row blocks, page sizes 1 and 48, HND with
  // per-head scales, fp8 output, soft-cap, sinks, the fixed split.
  {
    GpuOptions o;
    GqaCaseSpec s = base_spec(20, 2, 128, 48, DType::kFP8E4M3);  // group 10, q_len 3: 30 rows
    s.batch = 3, s.q_len = 3, s.seq_lens = {500, 3, 131};
    s.tree_mask = true;
    add("fp8_rm_rows30_tree_page48", s, o);
    s = base_spec(40, 5, 128, 1, DType::kFP8E4M3);  // group 8, q_len 5: 40 rows
    s.batch = 2, s.q_len = 5, s.seq_lens = {260, 7};
    s.window = 90;
    s.sinks = true;
    add("fp8_rm_rows40_window_sinks_page1", s, o);
    s = base_spec(64, 8, 128, 64, DType::kFP8E4M3);  // spec q4: 32 rows, split
    s.batch = 4, s.q_len = 4, s.seq_lens = {9000, 4, 5, 64};
    s.layout = KvLayout::kHND;
    s.per_head_scales = true;
    s.softcap = 30.f;
    add("fp8_rm_q4_split_softcap_hnd_scales", s, o);
    s = base_spec(64, 8, 128, 16, DType::kFP8E4M3);  // spec q8: 64 rows, fixed split, fp8 out
    s.batch = 3, s.q_len = 8, s.seq_lens = {3000, 8, 700};
    s.out_dtype = DType::kFP8E4M3;
    s.out_scale = 0.01f;
    GpuOptions f = o;
    f.split_mode = SplitMode::kFixed;
    f.split_tokens = 256;
    add("fp8_rm_q8_fixed_split_out_fp8", s, f);
    s = base_spec(64, 2, 128, 32, DType::kFP8E4M3);  // group 32, q_len 4: two row blocks of 64
    s.batch = 2, s.q_len = 4, s.seq_lens = {1000, 4};
    s.tree_mask = true;
    s.sinks = true;
    add("fp8_rm_two_row_blocks_tree_sinks", s, o);
  }
}

// The int8 two-term QK's features.
void int8_two_term_cases(const CaseList& add) {
  // The int8 two-term QK (IMMA, sm_90's path; PV widened) over the features the fp8 cases above
  // cover and the int8 ones do not: head dims (a lone 16-dim k step at d80, 16-token chunks and q
  // in shared memory at d256), groups (non-powers of two), pages, q_len 4/8 causal and tree,
  // splits with window and sinks, fixed splits, soft-cap, fp8 output. The widening of int8 shares
  // its code with fp8's, which the cases above run on every path.
  auto add_int8 = [&](std::string name, GqaCaseSpec s, GpuOptions o = {}) {
    s.kv_dtype = DType::kINT8;
    o.path_arch = 90;
    add("int8_" + name + "_two_term_qk", std::move(s), o);
  };
  for (int d : {64, 80, 96, 256}) {
    GqaCaseSpec s = base_spec(8, 2, d, 16, DType::kINT8);
    s.batch = 2, s.seq_lens = {200, 33};
    add_int8("d" + std::to_string(d), s);
  }
  for (int g : {3, 6, 12, 16}) {
    GqaCaseSpec s = base_spec(g * 2, 2, 128, 32, DType::kINT8);
    s.batch = 2, s.seq_lens = {250, 70};
    add_int8("group" + std::to_string(g), s);
  }
  for (int page : {1, 8, 64, 256}) {
    GqaCaseSpec s = base_spec(8, 1, 128, page, DType::kINT8);
    s.batch = 3, s.seq_lens = {page + 1, 2 * page - 1, 5};
    add_int8("page" + std::to_string(page), s);
  }
  for (int q_len : {4, 8}) {
    GqaCaseSpec s = base_spec(64, 8, 128, 64, DType::kINT8);
    s.batch = 3, s.q_len = q_len, s.seq_lens = {500, q_len, q_len + 3};
    add_int8("causal_qlen" + std::to_string(q_len), s);
    s.tree_mask = true;
    add_int8("tree_qlen" + std::to_string(q_len), s);
    s.window = 64;
    add_int8("tree_window_qlen" + std::to_string(q_len), s);
  }
  {
    GqaCaseSpec s = base_spec(64, 8, 64, 16, DType::kINT8);
    s.batch = 3, s.seq_lens = {1000, 100, 5};
    s.window = 128;
    s.sinks = true;
    add_int8("window_sinks_gptoss", s);
    s.window = 0, s.sinks = false;
    s.softcap = 30.f;
    add_int8("softcap", s);
  }
  {
    GqaCaseSpec s = base_spec(64, 8, 128, 64, DType::kINT8);
    s.batch = 1, s.seq_lens = {20000};
    add_int8("split_long", s);
    s.batch = 4, s.seq_lens = {9000, 1, 0, 64};
    s.window = 200;
    s.sinks = true;
    add_int8("split_window_sinks", s);
    s.layout = KvLayout::kHND;
    add_int8("split_window_sinks_hnd", s);
  }
  {
    GqaCaseSpec s = base_spec(8, 1, 128, 16, DType::kINT8);
    s.batch = 5, s.seq_lens = {3000, 10, 1500, 64, 65};
    GpuOptions o;
    o.split_mode = SplitMode::kFixed;
    o.split_tokens = 256;
    add_int8("fixed_split", s, o);
  }
  {
    GqaCaseSpec s = base_spec(8, 1, 128, 32, DType::kINT8);
    s.batch = 3, s.seq_lens = {100, 1, 777};
    s.out_dtype = DType::kFP8E4M3;
    s.out_scale = 0.01f;
    add_int8("out_fp8", s);
  }
  {
    GqaCaseSpec s = base_spec(16, 4, 128, 32, DType::kINT8);
    s.batch = 2, s.seq_lens = {400, 40};
    s.per_head_scales = true;
    s.layout = KvLayout::kHND;
    add_int8("per_head_scales_hnd", s);
  }
}

// The Hopper kernels for 16-bit caches (the default on sm_90a; DECA_GQA_SM90_16BIT=0 not): every
// bf16 / fp16 case of the matrix they cover (head_dim 64, 128 or 256 without beams) through them
// ("_wgmma16", the plans' default) and through the portable kernel (the unsuffixed case, with
// DECA_GQA_SM90_16BIT=0),
// and every case of the fp8 Hopper kernel's own lists (the "fp8_" cases of sm90_cases, before
// sm90_end, and of rows_on_m_cases, from rows_on_m_begin on) with its cache in bf16, or fp16 with
// fp16 q every other case, at head_dim 128 and again at 256 (the other type: "_d256_wgmma16").
void hopper_16bit_cases(std::vector<MatrixCase>& m, std::size_t sm90_end, std::size_t rows_on_m_begin) {
  const std::size_t n = m.size();
  auto hopper = [](const MatrixCase& c) {
    return hopper_16bit_covers(c.spec.head_dim, DType::kBF16, c.opt.beam_width) && c.opt.path_arch == 0 &&
           c.opt.skip_softmax_factor == 0.f;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const DType kv = m[i].spec.kv_dtype;
    const bool sixteen = kv == DType::kBF16 || kv == DType::kFP16;
    const bool fp8_own = kv == DType::kFP8E4M3 && m[i].name.rfind("fp8_", 0) == 0 &&
                         (i < sm90_end || i >= rows_on_m_begin);
    if (!hopper(m[i]) || !(sixteen || fp8_own) || (fp8_own && m[i].spec.head_dim != 128)) continue;
    if (sixteen) m[i].opt.hopper_16bit = 0;  // the unsuffixed case: the portable kernel
    const int dims[2] = {m[i].spec.head_dim, 256};  // the fp8 lists' cases at 128, then 256
    for (int k = 0; k < (fp8_own ? 2 : 1); ++k) {
      const int d = dims[k];
      MatrixCase v = m[i];
      if (fp8_own) {
        const bool fp16 = (i % 2 == 1) != (d == 256);
        v.spec.kv_dtype = fp16 ? DType::kFP16 : DType::kBF16;
        v.spec.q_dtype = fp16 ? DType::kFP16 : DType::kBF16;
        v.spec.head_dim = d;
        v.name = (fp16 ? "fp16" : "bf16") + v.name.substr(3) + (d == 256 ? "_d256" : "");
      }
      v.name += "_wgmma16";
      v.opt.hopper_16bit = 1;
      m.push_back(std::move(v));
    }
  }
}

std::vector<MatrixCase> matrix() {
  std::vector<MatrixCase> m;
  const CaseList add{m};
  shape_cases(add);
  feature_cases(add);
  sm90_cases(add);
  // Every 8-bit case once more on the other arches' paths, compiled for this GPU (the unsuffixed
  // case runs this GPU's own): fp8 and int8 on the ldmatrix-fed widening (sm_80's), fp8 on the
  // two-term e4m3 mma.sync (sm_89's; this GPU sm_89+), int8 with QK on IMMA (sm_90's). The
  // two-term products must meet the same tolerance as widening (simulated 0.18 % relative RMS
  // against 1 % allowed for bf16 out).
  const std::size_t n = m.size();
  for (std::size_t i = 0; i < n; ++i) {
    const DType kv = m[i].spec.kv_dtype;
    if (kv != DType::kFP8E4M3 && kv != DType::kINT8) continue;
    const struct {
      const char* suffix;
      int path_arch;
    } paths[] = {{"_widen_ldsm", 80}, {kv == DType::kFP8E4M3 ? "_two_term" : "_two_term_qk",
                                       kv == DType::kFP8E4M3 ? 89 : 90}};
    for (const auto& path : paths) {
      MatrixCase v = m[i];
      v.name += path.suffix;
      v.opt.path_arch = path.path_arch;
      m.push_back(std::move(v));
    }
  }
  const std::size_t n_fp8_sm90 = m.size();
  rows_on_m_cases(add);
  hopper_16bit_cases(m, n, n_fp8_sm90);
  int8_two_term_cases(add);
  return m;
}

void PrintTo(const MatrixCase& c, std::ostream* os) { *os << c.name; }

class GqaGpuMatrix : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(GqaGpuMatrix, MatchesCpuReference) {
  DECA_REQUIRE_GPU();
  const MatrixCase& mc = GetParam();
  auto rng = make_rng(std::hash<std::string>{}(mc.name));
  GqaCase c = build_gqa_case(mc.spec, rng);
  const GpuRun gpu = run_gqa_on_gpu(c, mc.opt);
  expect_matches_reference(mc.name, c, gpu);
  const int cc = cuda::compute_capability(0);
  const bool fp8 = mc.spec.kv_dtype == DType::kFP8E4M3;
  const bool int8 = mc.spec.kv_dtype == DType::kINT8;
  const bool out16 = mc.spec.out_dtype != DType::kFP8E4M3;
  if (fp8 && mc.opt.path_arch == 89 && cc >= 89) {
    // sm_89's path took effect (e4m3 mma.sync), and the error stays within the 8-bit paths' budget
    // (0.4 % relative RMS against the reference on the same stored cache) wherever the output is
    // 16-bit.
    EXPECT_NE(gpu.plan.kernel_name.find("_2term"), std::string::npos) << gpu.plan.kernel_name;
    if (out16) EXPECT_LE(compare(c, gpu).rel_l2, 4e-3) << seed_message();
  }
  // The Hopper fp8 kernel takes every fp8 case at head_dim 128 without beams on sm_90a unless
  // another arch's path is asked for (rows on wgmma's M beyond 16 rows), within the same error
  // budget as the two-term path it computes.
  const int rows = mc.spec.q_len * (mc.spec.num_q_heads / mc.spec.num_kv_heads);
  const bool wgmma_case = fp8 && mc.spec.head_dim == 128 && mc.opt.beam_width == 1 && cc == 90 &&
                          (mc.opt.path_arch == 0 || mc.opt.path_arch == 90);
  // Unless DECA_GQA_SM90_16BIT=0, the 16-bit cases at head_dim 64 / 128 / 256 without beams or
  // skip-softmax take it too.
  const bool wgmma16_case = hopper_16bit_covers(mc.spec.head_dim, mc.spec.kv_dtype, mc.opt.beam_width) &&
                            mc.opt.hopper_16bit != 0 && mc.opt.skip_softmax_factor == 0.f && cc == 90 &&
                            mc.opt.path_arch == 0;
  if (wgmma16_case) {
    EXPECT_NE(gpu.plan.kernel_name.find("_wgmma"), std::string::npos) << gpu.plan.kernel_name;
    EXPECT_EQ(gpu.plan.kernel_name.find("_rm") != std::string::npos, rows > 16) << gpu.plan.kernel_name;
  }
  EXPECT_EQ(gpu.plan.kernel_name.find("_wgmma") != std::string::npos, wgmma_case || wgmma16_case)
      << gpu.plan.kernel_name;
  if (wgmma_case) {
    EXPECT_EQ(gpu.plan.kernel_name.find("_rm") != std::string::npos, rows > 16) << gpu.plan.kernel_name;
    if (out16) EXPECT_LE(compare(c, gpu).rel_l2, 4e-3) << seed_message();
  }
  if (int8 && (mc.opt.path_arch == 90 || (mc.opt.path_arch == 0 && cc == 90))) {
    EXPECT_NE(gpu.plan.kernel_name.find("_2tqk"), std::string::npos) << gpu.plan.kernel_name;
    if (out16) EXPECT_LE(compare(c, gpu).rel_l2, 4e-3) << seed_message();
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, GqaGpuMatrix, ::testing::ValuesIn(matrix()),
                         [](const auto& info) { return info.param.name; });

// A k_scale of either sign, or zero, through the Hopper kernels: the rows-on-M kernel folds the
// logit scale's sign into q and takes the rows' maxima before scaling, so a negative scale must
// flip the logits (the largest raw S is then the smallest logit), and a zero scale give every
// visible key the same weight with masked keys still at zero weight.
// The same through the 16-bit Hopper kernels (bf16, DECA_GQA_SM90_16BIT=1).
TEST(GqaGpu, HopperKScaleOfEitherSignOrZero) {
  DECA_REQUIRE_GPU();
  for (DType kv : {DType::kFP8E4M3, DType::kBF16}) {
    GpuOptions o;
    o.hopper_16bit = kv == DType::kBF16 ? 1 : -1;
    for (int q_len : {1, 4, 8}) {  // 8 rows on wgmma's N, 32 and 64 on its M
      for (float factor : {-1.f, 0.f}) {
        auto rng = make_rng(21 + q_len);
        GqaCaseSpec s = base_spec(64, 8, 128, 64, kv);
        s.batch = 2, s.q_len = q_len, s.seq_lens = {700, q_len + 40};
        s.window = 300;
        GqaCase c = build_gqa_case(s, rng);
        c.k_scale *= factor;
        c.bind();
        const GpuRun gpu = run_gqa_on_gpu(c, o);
        if (cuda::compute_capability(0) == 90) {
          EXPECT_NE(gpu.plan.kernel_name.find("_wgmma"), std::string::npos) << gpu.plan.kernel_name;
        }
        expect_matches_reference(std::string("k_scale x") + (factor < 0 ? "-1" : "0") + " q_len " +
                                     std::to_string(q_len) + " " + gpu.plan.kernel_name,
                                 c, gpu);
      }
    }
  }
}

// Default mode: the same inputs give bitwise the same outputs, run after run (the split merge
// goes in a fixed order, not in arrival order): fp8 at group 8, and group 1 in bf16, whose merge
// shares each output quad's splits among lanes.
TEST(GqaGpu, RunToRunBitwiseIdentical) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(11);
  GqaCaseSpec fp8 = base_spec(64, 8, 128, 64, DType::kFP8E4M3);
  fp8.batch = 2, fp8.seq_lens = {30000, 7000};
  GqaCaseSpec mha = base_spec(4, 4, 128, 64, DType::kBF16);
  mha.batch = 1, mha.seq_lens = {20000};
  for (const GqaCaseSpec& s : {fp8, mha}) {
    GqaCase c = build_gqa_case(s, rng);
    const GpuRun a = run_gqa_on_gpu(c), b = run_gqa_on_gpu(c);
    ASSERT_GT(a.plan.num_splits, 1) << a.plan.kernel_name;
    EXPECT_TRUE(same_bytes(a.out, b.out, static_cast<long long>(a.out.bytes()))) << a.plan.kernel_name;
    EXPECT_TRUE(same_bytes(a.lse, b.lse, static_cast<long long>(a.lse.bytes()))) << a.plan.kernel_name;
  }
}

// Fixed-split mode: a request's result does not depend on what else is in the batch.
TEST(GqaGpu, FixedSplitIsBatchInvariant) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(12);
  GqaCaseSpec s = base_spec(32, 4, 128, 32, DType::kBF16);
  s.batch = 6, s.seq_lens = {5000, 100, 2000, 1, 7000, 64};
  GqaCase c = build_gqa_case(s, rng);
  for (int hopper_16bit : {0, 1}) {  // the portable kernel, the 16-bit Hopper kernel
    GpuOptions o;
    o.split_mode = SplitMode::kFixed;
    o.split_tokens = 512;
    o.max_batch = 64;
    o.max_seq_len = 8192;
    o.hopper_16bit = hopper_16bit;
    const GpuRun full = run_gqa_on_gpu(c, o);
    o.run_batch = 1;
    const GpuRun alone = run_gqa_on_gpu(c, o);
    const long long req_bytes = static_cast<long long>(s.q_len) * s.num_q_heads * s.head_dim *
                                static_cast<long long>(dtype_size(s.out_dtype));
    EXPECT_TRUE(same_bytes(full.out, alone.out, req_bytes)) << full.plan.kernel_name;
    EXPECT_TRUE(same_bytes(full.lse, alone.lse, static_cast<long long>(s.q_len) * s.num_q_heads * 4))
        << full.plan.kernel_name;
  }
}

// The split counters reset themselves: many launches on one workspace with no memset between
// them all give the right answer.
// bf16 (the portable kernel's split-KV) and fp8 (the Hopper kernel's on sm_90a).
TEST(GqaGpu, WorkspaceReusedWithoutReset) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(13);
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    GqaCaseSpec s = base_spec(64, 8, 128, 64, kv);
    s.batch = 2, s.seq_lens = {12000, 300};
    GqaCase c = build_gqa_case(s, rng);
    const GqaPlan plan = gpu_plan(c);
    ASSERT_GT(plan.num_splits, 1);
    DeviceCase dev(c, plan);
    for (int i = 0; i < 5; ++i) cuda::gqa_decode(plan, dev.params, nullptr);
    dev.out.fill(0xFF);
    cuda::gqa_decode(plan, dev.params, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_matches_reference("workspace_reused_" + std::string(dtype_name(kv)) + "_" + plan.kernel_name, c,
                             dev.results(c, plan));
  }
}

// The launch allocates nothing and syncs nothing: it can be captured in a CUDA graph and replayed.
TEST(GqaGpu, CapturedInCudaGraph) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(14);
  GqaCaseSpec s = base_spec(32, 8, 128, 16, DType::kFP8E4M3);
  s.batch = 3, s.seq_lens = {4000, 20, 900};
  GqaCase c = build_gqa_case(s, rng);
  const GqaPlan plan = gpu_plan(c);
  DeviceCase dev(c, plan);
  GraphReplay graph;
  ASSERT_NO_FATAL_FAILURE(
      graph.capture([&](cudaStream_t stream) { cuda::gqa_decode(plan, dev.params, stream); }));
  dev.out.fill(0xFF);
  ASSERT_NO_FATAL_FAILURE(graph.replay(3));
  expect_matches_reference("cuda_graph", c, dev.results(c, plan));
}

}  // namespace
}  // namespace deca::test
