// The differential test's MLA families: sparse and dense decode (common/mla_case.hpp's data,
// viewed as a caller would pass it) and the combine op. A layer is what a decode kernel is
// compiled for (the page size, dense: the cache format; checked or not, which picks the kernel);
// heads, q_len, lengths or top-k, the pool, -1 entries, duplicates, topk_length, sinks and the
// strided views are drawn per case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/diff_case.hpp"
#include "common/mla_case.hpp"
#include "deca/mla.hpp"

namespace deca::test::diff {

// ---- what sparse and dense decode share --------------------------------------------------------

// An MLA decode case: the draw's config (its plan kept per device), the GPU passes, a run (the
// views moved to the side, the schedule reused on the second GPU pass, a checked plan's record
// read) and the GPU suites' bounds: bf16 output, P in bf16 (tests/gpu/mla_sparse_gpu_runner.hpp);
// the 8-bit formats' values are real values rounded to bf16 on both sides. `Args`: MlaSparseArgs
// or MlaDenseArgs, filled by the derived case's constructor.
template <class Args>
class MlaDecodeDiff : public DiffCase {
 public:
  int passes() const override { return passes_; }

  void keep_plan(Device device) override { kept_ = plan_mla_decode(for_device(config_, device)); }

  std::string run(const Side& side, int pass) override {
    std::optional<MlaPlan> made;
    const MlaPlan& plan = plan_for(side, kept_, config_, made, plan_mla_decode);
    Args a = args_;
    to_side(side, plan, a, views(a));
    a.reuse_schedule = side.gpu() && pass == 1;
    if constexpr (std::is_same_v<Args, MlaSparseArgs>) {
      mla_decode_sparse(plan, a);
    } else {
      mla_decode_dense(plan, a);
    }
    if (side.gpu()) check_mla_run(plan, a.workspace, a.stream);
    return plan.kernel_name;
  }

  Tolerance tolerance(const std::string&) const override { return Tolerance{1e-2, 5e-2, 2e-3}; }

 protected:
  MlaDecodeDiff(const MlaConfig& config, int passes) : config_(config), passes_(passes) {}
  // Every view of a call (those not given are skipped).
  virtual std::vector<TensorView*> views(Args& a) const = 0;

  Args args_;

 private:
  MlaConfig config_;
  int passes_;
  std::optional<MlaPlan> kept_;  // keep_plan's
};

// ---- sparse decode ------------------------------------------------------------------------------

struct MlaSparseLayer {
  int page_size = 64;
  bool checked = false;
};

// Layer `index` of a pool: checked and unchecked alternate (they run different kernels).
inline MlaSparseLayer draw_mla_sparse_layer(Rng& rng, int index) {
  MlaSparseLayer l;
  l.page_size = edge_or_uniform(rng, 0.4, {1, 16, 64, 128}, 1, 128);
  l.checked = index % 2 == 1;
  return l;
}

struct MlaSparseDraw {
  MlaCaseSpec spec;
  MlaConfig config;  // each side sets its device
  SparseEdges edges;
  int q_pad = 0, out_pad = 0;  // elements after each head's row (strided views)
  int slot_pad = 0;            // bytes after each 656-byte token (a strided cache)
  int index_pad = 0;           // entries after each row of indices
  int passes = 1;              // 2: the second GPU run reuses the first's schedule
};

inline MlaSparseDraw draw_mla_sparse(Rng& rng, const MlaSparseLayer& l) {
  MlaSparseDraw d;
  MlaCaseSpec& s = d.spec;
  s.page_size = l.page_size;
  s.num_heads = edge_or_uniform(
      rng, 0.5, {1, 2, 3, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128}, 1, 128);
  s.q_len = uniform(rng, 1, 3);
  s.topk = chance(rng, 0.6) ? 64 * log_uniform(rng, 1, 64) : log_uniform(rng, 64, 4096);
  s.batch = log_uniform(rng, 1, 32);
  // The reference's work and the host's data stay bounded: batch x q_len x heads x topk keys.
  constexpr std::int64_t kBudget = 1 << 19;
  const auto work = [&] {
    return static_cast<std::int64_t>(s.batch) * s.q_len * s.num_heads * s.topk;
  };
  while (work() > kBudget && s.batch > 1) s.batch = (s.batch + 1) / 2;
  if (work() > kBudget)
    s.topk = std::max<int>(64, static_cast<int>(kBudget / (s.q_len * s.num_heads)));
  const int tokens = uniform(rng, std::max(1, s.topk / 4), std::min(2 * s.topk, 4096));
  s.pool_blocks = std::max(1, (tokens + s.page_size - 1) / s.page_size);
  s.skip_fraction = pick(rng, {0.f, 0.05f, 0.15f, 0.5f});
  s.duplicates = uniform(rng, 0, 4);
  s.topk_length = chance(rng, 0.5);
  s.attn_sink = chance(rng, 0.4);
  s.lse = chance(rng, 0.75);
  if (chance(rng, 0.3))
    s.softmax_scale = static_cast<float>(uniform_real(rng, 0.5, 1.5) / std::sqrt(576.0));
  d.edges.rows_of_skips = chance(rng, 0.5);
  d.edges.empty_request = chance(rng, 0.5);
  d.edges.poison = chance(rng, 0.8);

  d.config = sparse_config(s, Device::cpu());
  if (chance(rng, 0.3)) d.config.kv_format = MlaCacheFormat::kFP8Sparse;  // what kDefault means
  if (chance(rng, 0.3)) d.config.max_batch += uniform(rng, 1, 8);
  if (chance(rng, 0.3)) d.config.max_q_len = 3;
  d.config.checked = l.checked;
  if (chance(rng, 0.3)) d.q_pad = 8 * uniform(rng, 1, 4);
  if (chance(rng, 0.3)) d.out_pad = 8 * uniform(rng, 1, 4);
  if (chance(rng, 0.25)) d.slot_pad = 16 * uniform(rng, 1, 2);
  if (chance(rng, 0.25)) d.index_pad = uniform(rng, 1, 5);
  d.passes = chance(rng, 0.3) ? 2 : 1;
  return d;
}

class MlaSparseDiff final : public MlaDecodeDiff<MlaSparseArgs> {
 public:
  MlaSparseDiff(const MlaSparseDraw& d, Rng& rng)
      : MlaDecodeDiff(d.config, d.passes), d_(d), c_(build_mla_sparse_case(d.spec, rng)) {
    add_sparse_edges(c_, d.edges);  // may add a poisoned block in front of the pool
    MlaSparseArgs& a = args_;
    a.q = c_.q.view();
    a.out = c_.out.view();
    a.kv_cache = c_.kv.view();
    a.indices = c_.indices.view();
    if (d.q_pad) q_store_ = padded_copy(c_.q, d.q_pad), a.q = padded_view(q_store_, d.q_pad);
    if (d.out_pad)
      out_store_ = padded_copy(c_.out, d.out_pad), a.out = padded_view(out_store_, d.out_pad);
    if (d.slot_pad)
      kv_store_ = padded_copy(c_.kv, d.slot_pad), a.kv_cache = padded_view(kv_store_, d.slot_pad);
    if (d.index_pad) {
      index_store_ = padded_copy(c_.indices, d.index_pad);
      a.indices = padded_view(index_store_, d.index_pad);
    }
    if (c_.spec.topk_length) a.topk_length = c_.topk_length.view();
    if (c_.spec.attn_sink) a.attn_sink = c_.attn_sink.view();
    if (c_.spec.lse) a.lse = c_.lse.view();
    a.softmax_scale = c_.spec.softmax_scale;
  }

  Family family() const override { return Family::kMlaSparse; }

  std::string describe() const override {
    const MlaCaseSpec& s = c_.spec;
    const MlaConfig& c = d_.config;
    std::string lens;
    for (int b = 0; s.topk_length && b < s.batch; ++b) {
      lens += (lens.empty() ? "" : ",") + std::to_string(c_.topk_length.data<int>()[b]);
    }
    return "mla_sparse batch=" + std::to_string(s.batch) + " q_len=" + std::to_string(s.q_len) +
           " heads=" + std::to_string(s.num_heads) + " page=" + std::to_string(s.page_size) +
           " blocks=" + std::to_string(s.pool_blocks) + " topk=" + std::to_string(s.topk) +
           " topk_length=[" + lens + "] skip=" + std::to_string(s.skip_fraction) +
           " dups=" + std::to_string(s.duplicates) + " sink=" + std::to_string(s.attn_sink) +
           " lse=" + std::to_string(s.lse) + " softmax_scale=" + std::to_string(s.softmax_scale) +
           " edges=" + std::to_string(d_.edges.rows_of_skips) +
           std::to_string(d_.edges.empty_request) + std::to_string(d_.edges.poison) +
           " max_batch=" + std::to_string(c.max_batch) +
           " max_q_len=" + std::to_string(c.max_q_len) + " checked=" + std::to_string(c.checked) +
           " q_pad=" + std::to_string(d_.q_pad) + " out_pad=" + std::to_string(d_.out_pad) +
           " slot_pad=" + std::to_string(d_.slot_pad) +
           " index_pad=" + std::to_string(d_.index_pad) + " passes=" + std::to_string(d_.passes);
  }

  std::vector<HostTensor*> tensors() override {
    return case_tensors({&c_.q, &c_.kv, &c_.indices, &c_.topk_length, &c_.attn_sink, &c_.out, &c_.lse},
                        {&q_store_, &out_store_, &kv_store_, &index_store_});
  }

  std::vector<Output> outputs() override {
    return decode_outputs(c_.out, out_store_, d_.out_pad, args_.out, c_.lse, args_.lse, c_.spec.lse);
  }

 private:
  std::vector<TensorView*> views(MlaSparseArgs& a) const override {
    return {&a.q, &a.kv_cache, &a.indices, &a.topk_length, &a.attn_sink, &a.out, &a.lse};
  }

  MlaSparseDraw d_;
  MlaSparseCase c_;
  HostTensor q_store_, out_store_, kv_store_, index_store_;  // padded copies (strided views)
};

// ---- dense decode -------------------------------------------------------------------------------

// What a dense decode kernel is compiled for: the page size, the cache's format (MlaKvFormat:
// bf16, e4m3 with one scale, the 656-byte token) and checked or not.
struct MlaDenseLayer {
  int page_size = 64;
  int kv_format = kMlaKvBF16;
  bool checked = false;
};

// Layer `index` of a pool: the first three take each format; checked and unchecked alternate.
inline MlaDenseLayer draw_mla_dense_layer(Rng& rng, int index) {
  MlaDenseLayer l;
  l.page_size = edge_or_uniform(rng, 0.4, {1, 16, 64, 128, 256}, 1, 128);
  l.kv_format = index < 3 ? index : uniform(rng, kMlaKvBF16, kMlaKvFP8Sparse);
  l.checked = index % 2 == 1;
  return l;
}

inline MlaCacheFormat cache_format(int kv_format) {
  switch (kv_format) {
    case kMlaKvFP8E4M3: return MlaCacheFormat::kFP8E4M3;
    case kMlaKvFP8Sparse: return MlaCacheFormat::kFP8Sparse;
    default: return MlaCacheFormat::kBF16;
  }
}

struct MlaDenseDraw {
  MlaCaseSpec spec;
  MlaConfig config;            // each side sets its device
  int q_pad = 0, out_pad = 0;  // elements after each head's row (strided views)
  int slot_pad = 0;            // elements of the cache's dtype after each token (a strided cache)
  int drop_column = 0;         // 1: the block table's view leaves its spare column out
  int passes = 1;              // 2: the second GPU run reuses the first's schedule
};

inline MlaDenseDraw draw_mla_dense(Rng& rng, const MlaDenseLayer& l) {
  MlaDenseDraw d;
  MlaCaseSpec& s = d.spec;
  s.page_size = l.page_size;
  s.kv_format = l.kv_format;
  s.num_heads = edge_or_uniform(rng, 0.5, {1, 2, 3, 16, 17, 63, 64, 65, 100, 128}, 1, 128);
  s.q_len = chance(rng, 0.5) ? 1 : uniform(rng, 2, 4);
  s.batch = log_uniform(rng, 1, 32);
  const int longest = log_uniform(rng, s.q_len, 8192);
  s.seq_lens.clear();
  for (int b = 0; b < s.batch; ++b)
    s.seq_lens.push_back(chance(rng, 0.08) ? 0 : log_uniform(rng, s.q_len, longest));
  // The host builds 576 values a token and the reference reads each for every head and query.
  std::int64_t tokens = 0;
  for (int len : s.seq_lens) tokens += len;
  const double f = std::min(
      {1.0, 4096.0 / std::max<std::int64_t>(tokens, 1),
       (1 << 19) / static_cast<double>(std::max<std::int64_t>(tokens * s.num_heads * s.q_len, 1))});
  for (int& len : s.seq_lens) len = len == 0 ? 0 : std::max(s.q_len, static_cast<int>(len * f));
  if (s.kv_format == kMlaKvFP8E4M3 && chance(rng, 0.5)) {
    s.kv_scale = static_cast<float>(uniform_real(rng, 0.005, 0.02));  // not a power of two
  }
  s.spare_blocks = uniform(rng, 0, 3);
  s.lse = chance(rng, 0.75);
  if (chance(rng, 0.3))
    s.softmax_scale = static_cast<float>(uniform_real(rng, 0.5, 1.5) / std::sqrt(576.0));

  MlaConfig& c = d.config;
  c.num_heads = s.num_heads;
  c.page_size = s.page_size;
  c.sparse = false;
  c.kv_format = s.kv_format == kMlaKvBF16 && chance(rng, 0.5) ? MlaCacheFormat::kDefault
                                                              : cache_format(s.kv_format);
  c.max_batch = s.batch + (chance(rng, 0.3) ? uniform(rng, 1, 8) : 0);
  c.max_q_len = chance(rng, 0.3) ? 4 : s.q_len;
  int max_len = 1;
  for (int len : s.seq_lens) max_len = std::max(max_len, len);
  c.max_seq_len = max_len + (chance(rng, 0.5) ? 0 : uniform(rng, 0, max_len));
  c.lse = s.lse;
  c.checked = l.checked;
  if (chance(rng, 0.3)) d.q_pad = 8 * uniform(rng, 1, 4);
  if (chance(rng, 0.3)) d.out_pad = 8 * uniform(rng, 1, 4);
  // Rows stay 16-byte aligned: 8 bf16 elements, 16 bytes of the 8-bit formats.
  if (chance(rng, 0.25)) d.slot_pad = (s.kv_format == kMlaKvBF16 ? 8 : 16) * uniform(rng, 1, 2);
  d.drop_column = chance(rng, 0.3) ? 1 : 0;
  d.passes = chance(rng, 0.3) ? 2 : 1;
  return d;
}

class MlaDenseDiff final : public MlaDecodeDiff<MlaDenseArgs> {
 public:
  MlaDenseDiff(const MlaDenseDraw& d, Rng& rng)
      : MlaDecodeDiff(d.config, d.passes), d_(d), c_(build_mla_dense_case(d.spec, rng)) {
    MlaDenseArgs& a = args_;
    a.q = c_.q.view();
    a.out = c_.out.view();
    a.kv_cache = c_.kv.view();
    if (d.q_pad) q_store_ = padded_copy(c_.q, d.q_pad), a.q = padded_view(q_store_, d.q_pad);
    if (d.out_pad)
      out_store_ = padded_copy(c_.out, d.out_pad), a.out = padded_view(out_store_, d.out_pad);
    if (d.slot_pad)
      kv_store_ = padded_copy(c_.kv, d.slot_pad), a.kv_cache = padded_view(kv_store_, d.slot_pad);
    // The table has one spare column (huge ids) past the longest request's blocks; a view
    // without it keeps the row stride of the whole table.
    const std::int64_t cols = c_.block_table.shape()[1];
    const std::int64_t view_cols = std::max<std::int64_t>(1, cols - d.drop_column);
    a.block_table =
        make_tensor(c_.block_table.raw(), DType::kINT32, {c_.spec.batch, view_cols}, {cols, 1});
    a.cache_seqlens = c_.seq_lens.view();
    if (c_.spec.lse) a.lse = c_.lse.view();
    a.softmax_scale = c_.spec.softmax_scale;
    a.kv_scale = c_.spec.kv_format == kMlaKvFP8E4M3 ? c_.kv_scale : 1.f;
  }

  Family family() const override { return Family::kMlaDense; }

  std::string describe() const override {
    const MlaCaseSpec& s = c_.spec;
    const MlaConfig& c = d_.config;
    const std::string lens = joined(c_.lens);
    return "mla_dense batch=" + std::to_string(s.batch) + " q_len=" + std::to_string(s.q_len) +
           " heads=" + std::to_string(s.num_heads) + " page=" + std::to_string(s.page_size) +
           " lens=[" + lens + "] format=" + mla_cache_format_name(c.kv_format) +
           " kv_scale=" + std::to_string(args_.kv_scale) + " lse=" + std::to_string(s.lse) +
           " softmax_scale=" + std::to_string(s.softmax_scale) +
           " max_batch=" + std::to_string(c.max_batch) +
           " max_q_len=" + std::to_string(c.max_q_len) +
           " max_seq_len=" + std::to_string(c.max_seq_len) +
           " checked=" + std::to_string(c.checked) +
           " spare_blocks=" + std::to_string(s.spare_blocks) +
           " columns=" + std::to_string(args_.block_table.shape[1]) + "/" +
           std::to_string(c_.block_table.shape()[1]) + " q_pad=" + std::to_string(d_.q_pad) +
           " out_pad=" + std::to_string(d_.out_pad) + " slot_pad=" + std::to_string(d_.slot_pad) +
           " passes=" + std::to_string(d_.passes);
  }

  std::vector<HostTensor*> tensors() override {
    return case_tensors({&c_.q, &c_.kv, &c_.block_table, &c_.seq_lens, &c_.out, &c_.lse},
                        {&q_store_, &out_store_, &kv_store_});
  }

  std::vector<Output> outputs() override {
    return decode_outputs(c_.out, out_store_, d_.out_pad, args_.out, c_.lse, args_.lse, c_.spec.lse);
  }

 private:
  std::vector<TensorView*> views(MlaDenseArgs& a) const override {
    return {&a.q, &a.kv_cache, &a.block_table, &a.cache_seqlens, &a.out, &a.lse};
  }

  MlaDenseDraw d_;
  MlaDenseCase c_;
  HostTensor q_store_, out_store_, kv_store_;  // padded copies (strided views)
};

// ---- combine ------------------------------------------------------------------------------------

struct CombineDraw {
  int splits = 1, batch = 1, q_len = 1, heads = 1, dim_v = 512;
  DType out_dtype = DType::kFP32;
  bool sink = false, lse = true;
  double dead = 0;        // share of partial LSEs that are -inf (a split that saw no key)
  bool dead_row = false;  // one row whose every split is -inf (zeros, LSE -inf)
  int out_pad = 0, po_pad = 0, pl_pad = 0;
};

inline CombineDraw draw_combine(Rng& rng) {
  CombineDraw d;
  d.splits = log_uniform(rng, 1, 64);
  d.batch = log_uniform(rng, 1, 16);
  d.q_len = uniform(rng, 1, 4);
  d.heads = edge_or_uniform(rng, 0.5, {1, 7, 8, 9, 64, 128}, 1, 128);
  d.dim_v = chance(rng, 0.5) ? pick(rng, {64, 128, 512}) : uniform(rng, 1, 600);
  constexpr std::int64_t kBudget = 1 << 21;  // partial_out floats
  while (static_cast<std::int64_t>(d.splits) * d.batch * d.q_len * d.heads * d.dim_v > kBudget) {
    if (d.batch > 1) d.batch = (d.batch + 1) / 2;
    else d.splits = (d.splits + 1) / 2;
  }
  d.out_dtype = pick(rng, {DType::kBF16, DType::kFP16, DType::kFP32});
  d.sink = chance(rng, 0.4);
  d.lse = chance(rng, 0.75);
  d.dead = pick(rng, {0.0, 0.2, 0.6});
  d.dead_row = chance(rng, 0.3);
  if (chance(rng, 0.3)) d.out_pad = uniform(rng, 1, 9);
  if (chance(rng, 0.3)) d.po_pad = uniform(rng, 1, 9);
  if (chance(rng, 0.3)) d.pl_pad = uniform(rng, 1, 3);
  return d;
}

class CombineDiff final : public DiffCase {
 public:
  CombineDiff(const CombineDraw& d, Rng& rng) : d_(d) {
    std::normal_distribution<float> normal(0.f, 1.f);
    po_ = HostTensor(DType::kFP32, {d.splits, d.batch, d.q_len, d.heads, d.dim_v + d.po_pad});
    pl_ = HostTensor(DType::kFP32, {d.splits, d.batch, d.q_len, d.heads + d.pl_pad});
    out_ = HostTensor(d.out_dtype, {d.batch, d.q_len, d.heads, d.dim_v + d.out_pad});
    lse_ = HostTensor(DType::kFP32, {d.batch, d.q_len, d.heads});
    sink_ = HostTensor(DType::kFP32, {d.heads});
    for (std::int64_t i = 0; i < po_.numel(); ++i) po_.data<float>()[i] = normal(rng);
    for (std::int64_t i = 0; i < pl_.numel(); ++i) {
      pl_.data<float>()[i] = chance(rng, d.dead) ? -INFINITY : 2.f * normal(rng);
    }
    if (d.dead_row) {
      const int b = uniform(rng, 0, d.batch - 1), i = uniform(rng, 0, d.q_len - 1);
      const int h = uniform(rng, 0, d.heads - 1);
      for (int j = 0; j < d.splits; ++j) {
        pl_.data<float>()[((static_cast<std::int64_t>(j) * d.batch + b) * d.q_len + i) *
                              (d.heads + d.pl_pad) +
                          h] = -INFINITY;
      }
    }
    // A sink of -inf is no sink; the others are logits of the partials' size.
    for (int h = 0; h < d.heads; ++h)
      sink_.data<float>()[h] = chance(rng, 0.1) ? -INFINITY : 2.f * normal(rng);
    args_.partial_out = padded_view(po_, d.po_pad);
    args_.partial_lse = padded_view(pl_, d.pl_pad);
    if (d.sink) args_.attn_sink = sink_.view();
    args_.out = padded_view(out_, d.out_pad);
    if (d.lse) args_.lse = lse_.view();
  }

  Family family() const override { return Family::kCombine; }

  std::string describe() const override {
    return "combine splits=" + std::to_string(d_.splits) + " batch=" + std::to_string(d_.batch) +
           " q_len=" + std::to_string(d_.q_len) + " heads=" + std::to_string(d_.heads) +
           " dim_v=" + std::to_string(d_.dim_v) + " out=" + dtype_name(d_.out_dtype) +
           " sink=" + std::to_string(d_.sink) + " lse=" + std::to_string(d_.lse) +
           " dead=" + std::to_string(d_.dead) + " dead_row=" + std::to_string(d_.dead_row) +
           " out_pad=" + std::to_string(d_.out_pad) + " po_pad=" + std::to_string(d_.po_pad) +
           " pl_pad=" + std::to_string(d_.pl_pad);
  }

  std::vector<HostTensor*> tensors() override { return {&po_, &pl_, &sink_, &out_, &lse_}; }

  std::vector<Output> outputs() override {
    std::vector<Output> o = {{"out", &out_, args_.out, false}};
    if (d_.lse) o.push_back({"lse", &lse_, args_.lse, true});
    return o;
  }

  std::string run(const Side& side, int) override {
    CombineArgs a = args_;
    for (TensorView* v : {&a.partial_out, &a.partial_lse, &a.attn_sink, &a.out, &a.lse}) {
      if (v->defined()) *v = side.move(*v);
    }
    a.stream = side.stream;
    combine(a);
    return side.gpu() ? "combine" : "";
  }

  // Both sides merge in floating point of at least fp32; the output's own rounding dominates.
  Tolerance tolerance(const std::string&) const override {
    const double out =
        d_.out_dtype == DType::kFP32 ? 1e-5 : (d_.out_dtype == DType::kFP16 ? 4e-3 : 1e-2);
    return Tolerance{out, 5 * out, 1e-4};
  }

 private:
  CombineDraw d_;
  HostTensor po_, pl_, sink_, out_, lse_;
  CombineArgs args_;
};

}  // namespace deca::test::diff
