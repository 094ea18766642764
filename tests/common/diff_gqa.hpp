// The differential test's GQA decode family: a draw (what decides a case, no data yet) and the
// case built from it (common/paged_gqa_case.hpp's data, viewed as a caller would pass it).
//
// A layer is what a kernel is compiled for (head_dim, group, page size, dtypes, the feature
// switches, beams, q_len, checked, the split mode): the draws share a pool of layers so that a run
// compiles tens of kernels, not one per case. Everything else is drawn per case: batch, lengths
// (empty requests included), KV heads, layout, the strided views, scales, sinks, LSE, window and
// soft-cap values, the plan's maxima above the call's sizes.
//
// Two more families share the case: the fused decode step (a layer's rope style and rotary_dim;
// per case k_new / v_new, the cos/sin cache's dtype, explicit or derived positions; the caches
// after the call compared bitwise) and skip-softmax (the GPU's "_skip" kernel against the CPU's
// exact attention within the documented bound, on random or peaked data; or a factor too small to
// drop a tile, whose GPU run must give the exact kernel's bits on the same fixed split).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/diff_case.hpp"
#include "common/fused_gqa_case.hpp"
#include "common/paged_gqa_case.hpp"
#include "common/skip_case.hpp"
#include "deca/gqa.hpp"

namespace deca::test::diff {

struct GqaLayer {
  int head_dim = 128;
  int group = 1;
  int page_size = 16;
  int max_q_len = 1;
  int beam_width = 1;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16, out_dtype = DType::kBF16;
  bool window = false, tree = false, softcap = false, checked = false, fixed_split = false;
  RopeStyle rope_style = RopeStyle::kNone;  // the fused family's layers: kNeox or kGptj
  int rotary_dim = 0;                       // fused: 0 = head_dim
  bool skip = false;                        // the skip family's layers
};

// Layer `index` of a pool: random, except that the first layers each force one feature on, so
// that a pool of a dozen layers or more holds every one of them whatever the seed.
inline GqaLayer draw_gqa_layer(Rng& rng, int index) {
  GqaLayer l;
  l.head_dim = 16 * edge_or_uniform(rng, 0.5, {4, 8, 16}, 4, 16);
  l.group = edge_or_uniform(rng, 0.5, {1, 4, 5, 8, 16}, 1, 16);
  l.page_size = edge_or_uniform(rng, 0.4, {1, 16, 32, 64, 128}, 1, 128);
  l.max_q_len = chance(rng, 0.5) ? 1 : uniform(rng, 2, 4);
  l.beam_width = chance(rng, 0.85) ? 1 : pick(rng, {2, 3, 4});
  l.q_dtype = chance(rng, 0.7) ? DType::kBF16 : DType::kFP16;
  l.kv_dtype =
      pick(rng, {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kFP8E4M3, DType::kINT8});
  l.out_dtype =
      chance(rng, 0.6) ? l.q_dtype : pick(rng, {DType::kBF16, DType::kFP16, DType::kFP8E4M3});
  l.window = chance(rng, 0.25);
  l.tree = l.max_q_len > 1 && chance(rng, 0.3);
  l.softcap = chance(rng, 0.2);
  l.checked = chance(rng, 0.5);
  l.fixed_split = chance(rng, 0.15);
  // A share of the pool runs the Hopper fp8 kernel (e4m3 KV, head_dim 128, no beams), the path
  // the fp8 benchmarks measure.
  if (chance(rng, 0.25) || index == 0) {
    l.kv_dtype = DType::kFP8E4M3, l.head_dim = 128, l.beam_width = 1;
  }
  switch (index) {
    case 0: l.checked = false; break;  // the Hopper fp8 kernel (a checked plan may not run it)
    case 1: l.beam_width = 4, l.kv_dtype = DType::kBF16; break;
    case 2: l.max_q_len = 4, l.tree = true; break;
    case 3: l.window = true, l.kv_dtype = DType::kINT8, l.page_size = 1; break;
    case 4: l.softcap = true, l.q_dtype = DType::kFP16, l.group = 16; break;
    case 5: l.fixed_split = true, l.kv_dtype = DType::kFP16, l.head_dim = 256; break;
    case 6: l.out_dtype = DType::kFP8E4M3, l.checked = true; break;
    case 7: l.beam_width = 2, l.kv_dtype = DType::kFP8E4M3, l.window = true; break;
    default: break;
  }
  return l;
}

// A fused layer: a GQA layer (every feature and KV dtype) with a rope style and a rotary_dim
// (whole or partial); the first two take each style with a partial rotation.
inline GqaLayer draw_gqa_fused_layer(Rng& rng, int index) {
  GqaLayer l = draw_gqa_layer(rng, index % 8);
  l.rope_style = (index % 2 == 0) ? RopeStyle::kNeox : RopeStyle::kGptj;
  const int pairs16 = l.head_dim / 16;
  l.rotary_dim = index < 2 ? 16 * std::max(1, pairs16 / 2)
                           : (chance(rng, 0.5) ? 0 : 16 * uniform(rng, 1, pairs16));
  return l;
}

// A skip-softmax layer: a GQA layer whose output keeps 8 significant bits or more (the bound's
// rounding share is relative to the row), the "_skip" kernel.
inline GqaLayer draw_gqa_skip_layer(Rng& rng, int index) {
  GqaLayer l = draw_gqa_layer(rng, index % 8);
  if (l.out_dtype == DType::kFP8E4M3) l.out_dtype = l.q_dtype;
  l.skip = true;
  // Two layers on the Hopper rows-on-M skip kernel (sm90/skip_rows.cuh: more than 16 rows, no
  // beams): fp8 with a tree at 32 rows (q_len 4 of a group of 8), bf16 at 64 (q_len 4 of 16).
  if (index == 2) l.kv_dtype = DType::kFP8E4M3, l.head_dim = 128, l.beam_width = 1, l.group = 8, l.checked = false;
  if (index == 4) l.kv_dtype = DType::kBF16, l.head_dim = 128, l.beam_width = 1, l.max_q_len = 4;
  return l;
}

struct GqaDraw {
  GqaCaseSpec spec;       // the data (sizes, dtypes, features, cache layout)
  GqaConfig config;       // the plan's config; each side sets its device
  int own_pages = 0;      // beams: pages at the end of a request each beam owns
  int q_pad = 0;          // elements after each head's row of q (a strided view); 0: contiguous
  int out_pad = 0;        // the same for out
  int table_columns = 0;  // page_table view's columns, <= the table's (its rows then strided)
  float scale_16bit = 0;  // 16-bit caches: the K and V scales (and per-head bases); 0: 1
  int passes = 1;
  FusedSpec fused;        // fused plans (config.rope_style set): positions, cos/sin dtype
  // Skip plans (config.skip_softmax_factor > 0): peaked data (`heavy` keys `gap` above the bulk),
  // and `tiny`: a factor no tile falls under, the second GPU pass the exact kernel (bitwise).
  bool peaked = false, tiny = false;
  int heavy = 8;
  float gap = 12.f;
};

// Lengths of `requests` requests (beams repeated next to each other), empty ones included, their
// K/V elements kept within a budget (the host builds every element and the reference reads it).
inline std::vector<int> draw_gqa_lengths(Rng& rng, int requests, int beams, int q_len,
                                         int kv_elems_per_token) {
  const int longest = log_uniform(rng, q_len, 16384);
  const bool uniform_batch = chance(rng, 0.3);
  std::vector<int> lens;
  for (int r = 0; r < requests; ++r) {
    const int len =
        chance(rng, 0.08) ? 0 : (uniform_batch ? longest : log_uniform(rng, q_len, longest));
    for (int j = 0; j < beams; ++j) {
      const bool other = j > 0 && len > 0 && chance(rng, 0.3);
      lens.push_back(other ? std::max(q_len, len + uniform(rng, -20, 20)) : len);
    }
  }
  constexpr std::int64_t kBudget = 1 << 20;  // K (and as many V) elements over the batch
  std::int64_t total = 0;
  for (int l : lens) total += static_cast<std::int64_t>(l) * kv_elems_per_token;
  if (total > kBudget) {
    const double f = static_cast<double>(kBudget) / static_cast<double>(total);
    for (int& l : lens) l = l == 0 ? 0 : std::max(q_len, static_cast<int>(l * f));
  }
  return lens;
}

// At most about 8 splits: the GPU refuses more than its merge holds (the CPU has no splits).
inline void fix_split(Rng& rng, GqaConfig& c) {
  c.split_mode = SplitMode::kFixed;
  c.split_tokens = uniform(rng, (c.max_seq_len + 7) / 8, std::max(c.max_seq_len, 1));
}

inline void draw_fused_parts(Rng& rng, GqaDraw& d) {
  d.fused.style = d.config.rope_style;
  d.fused.rotary_dim = d.config.rotary_dim;
  d.fused.positions = chance(rng, 0.5);
  d.fused.position_shift = uniform(rng, 0, 5);
  d.fused.cos_sin_dtype = pick(rng, {DType::kFP32, DType::kFP32, DType::kBF16, DType::kFP16});
}

inline void draw_skip_parts(Rng& rng, GqaDraw& d) {
  d.out_pad = 0;  // the bound reads the outputs as the case lays them out
  d.peaked = chance(rng, 0.5);
  d.heavy = uniform(rng, 1, 16);
  d.gap = static_cast<float>(uniform_real(rng, 4, 12));
  // A tiny factor's bits equal the exact kernel's where both run the same kernel family: every
  // plan's skip variant is its exact kernel's (on Hopper up to 16 rows sm90/skip.cuh against
  // decode.cuh, 32 / 64 rows sm90/skip_rows.cuh against decode_rows.cuh; docs/semantics.md,
  // "Skip-softmax"), so any draw may take it.
  d.tiny = chance(rng, 0.25);
  const double f = std::exp(uniform_real(rng, std::log(0.01), std::log(10.0)));
  d.config.skip_softmax_factor = d.tiny ? 1e-30f : static_cast<float>(f);
  if (d.tiny) {
    d.passes = 2;
    if (d.config.split_mode == SplitMode::kAuto) fix_split(rng, d.config);
  }
}

inline GqaDraw draw_gqa(Rng& rng, const GqaLayer& l) {
  GqaDraw d;
  GqaCaseSpec& s = d.spec;
  s.num_kv_heads = edge_or_uniform(rng, 0.5, {1, 2, 8}, 1, 8);
  s.num_q_heads = s.num_kv_heads * l.group;
  s.head_dim = l.head_dim;
  s.page_size = l.page_size;
  s.q_len = chance(rng, 0.5) ? l.max_q_len
                             : uniform(rng, 1, l.max_q_len);  // drafts: often the full length
  const int requests = chance(rng, 0.02) ? 0 : log_uniform(rng, 1, 24);
  s.batch = requests * l.beam_width;
  s.seq_lens = draw_gqa_lengths(rng, requests, l.beam_width, s.q_len, s.num_kv_heads * s.head_dim);
  s.layout = chance(rng, 0.5) ? KvLayout::kNHD : KvLayout::kHND;
  s.q_dtype = l.q_dtype, s.kv_dtype = l.kv_dtype, s.out_dtype = l.out_dtype;
  s.spare_pages = uniform(rng, 0, 3);
  s.spare_columns = uniform(rng, 0, 2);
  s.kv_one_allocation = chance(rng, 0.25);
  s.per_head_scales = chance(rng, 0.3);
  s.lse = chance(rng, 0.75);
  s.sinks = chance(rng, 0.3);
  s.tree_mask = l.tree;
  int longest = 1;
  for (int len : s.seq_lens) longest = std::max(longest, len);
  s.window = l.window ? log_uniform(rng, 1, 2 * longest) : 0;
  s.softcap = l.softcap ? static_cast<float>(std::exp(uniform_real(rng, 0, std::log(50.0)))) : 0.f;
  if (chance(rng, 0.3))
    s.softmax_scale = static_cast<float>(uniform_real(rng, 0.5, 1.5) / std::sqrt(s.head_dim));
  // fp8 output stores real / out_scale: outputs are at most a few units, so 2^-8..2^-4 keeps them
  // in e4m3's normal range. Other outputs ignore it (drawn anyway: it must not matter).
  if (s.out_dtype == DType::kFP8E4M3 || chance(rng, 0.2)) {
    s.out_scale = static_cast<float>(std::ldexp(uniform_real(rng, 1, 2), -uniform(rng, 5, 8)));
  }

  GqaConfig& c = d.config;
  c.num_q_heads = s.num_q_heads, c.num_kv_heads = s.num_kv_heads, c.head_dim = s.head_dim;
  c.page_size = s.page_size, c.layout = s.layout;
  c.q_dtype = s.q_dtype, c.kv_dtype = s.kv_dtype, c.out_dtype = s.out_dtype;
  c.beam_width = l.beam_width;
  c.max_batch =
      std::max(s.batch, l.beam_width) + (chance(rng, 0.3) ? uniform(rng, 0, 4) * l.beam_width : 0);
  c.max_q_len = l.max_q_len;
  c.max_seq_len = longest + (chance(rng, 0.5) ? 0 : uniform(rng, 0, longest));
  c.tree_mask = s.tree_mask, c.sinks = s.sinks, c.lse = s.lse,
  c.per_head_kv_scale = s.per_head_scales;
  c.window = s.window, c.softcap = s.softcap;
  c.checked = l.checked;
  if (l.fixed_split) fix_split(rng, c);
  d.own_pages = uniform(rng, 0, 2);
  if (chance(rng, 0.3)) d.q_pad = 8 * uniform(rng, 1, 4);
  if (chance(rng, 0.3)) d.out_pad = 16 * uniform(rng, 1, 2);
  d.table_columns = chance(rng, 0.3) ? -uniform(rng, 0, s.spare_columns) : 0;  // columns dropped
  const bool quant = s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kINT8;
  if (!quant && chance(rng, 0.4)) d.scale_16bit = static_cast<float>(uniform_real(rng, 0.7, 1.4));
  d.passes = chance(rng, 0.25) ? 2 : 1;
  c.rope_style = l.rope_style, c.rotary_dim = l.rotary_dim;
  if (l.rope_style != RopeStyle::kNone) draw_fused_parts(rng, d);
  if (l.skip) draw_skip_parts(rng, d);
  return d;
}

inline const char* layout_name(KvLayout l) { return l == KvLayout::kNHD ? "NHD" : "HND"; }

class GqaDiff final : public DiffCase {
 public:
  GqaDiff(const GqaDraw& d, Rng& rng) : d_(d), c_(build_gqa_case(d.spec, rng)) {
    c_.bind();
    const GqaCaseSpec& s = c_.spec;
    const bool fused = d.config.rope_style != RopeStyle::kNone;
    if (d.config.beam_width > 1)
      share_prefix_pages(c_, d.config.beam_width, d.own_pages, fused ? s.q_len : 0);
    const bool quant = s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kINT8;
    if (!quant) {
      // 16-bit caches store real values, so any scale is a valid call; kept near 1 so that the
      // logits stay at the size the LSE bound assumes.
      const float base = d.scale_16bit != 0.f ? d.scale_16bit : 1.f;
      c_.k_scale = base, c_.v_scale = 1.f / base;
      for (int h = 0; s.per_head_scales && h < s.num_kv_heads; ++h) {
        c_.k_scales.data<float>()[h] = base * (1.f - 0.03f * h);
        c_.v_scales.data<float>()[h] = (1.f + 0.05f * h) / base;
      }
    }
    if (d.peaked) make_peaked(c_, rng, d.heavy, d.gap);
    if (fused) fused_ = make_fused_inputs(c_, d.fused, rng);
    if (d.q_pad) q_store_ = padded_copy(c_.q, d.q_pad);
    if (d.out_pad) out_store_ = padded_copy(c_.out, d.out_pad);

    GqaDecodeArgs& a = args_;
    a.q = d.q_pad ? padded_view(q_store_, d.q_pad) : c_.q.view();
    a.out = d.out_pad ? padded_view(out_store_, d.out_pad) : c_.out.view();
    const GqaParams& p = c_.params;  // the cache strides the case laid out
    const std::int64_t pages = c_.k_pool.shape()[0];
    const bool nhd = s.layout == KvLayout::kNHD;
    const std::int64_t shape[4] = {pages, nhd ? s.page_size : s.num_kv_heads,
                                   nhd ? s.num_kv_heads : s.page_size, s.head_dim};
    const std::int64_t stride[4] = {p.k_stride_page, nhd ? p.k_stride_slot : p.k_stride_head,
                                    nhd ? p.k_stride_head : p.k_stride_slot, 1};
    a.k_cache = make_tensor(const_cast<void*>(p.k_cache), s.kv_dtype, 4, shape, stride);
    // A pool of no pages (every request empty): V of the shared allocation would start past its
    // end; no element is read, so it may name K's first byte.
    const void* v_data = pages > 0 ? p.v_cache : p.k_cache;
    a.v_cache = make_tensor(const_cast<void*>(v_data), s.kv_dtype, 4, shape, stride);
    const std::int64_t cols = c_.page_table.shape()[1];
    const std::int64_t view_cols = std::max<std::int64_t>(1, cols + d.table_columns);
    a.page_table = make_tensor(c_.page_table.raw(), DType::kINT32, {s.batch, view_cols}, {cols, 1});
    a.seq_lens = c_.seq_lens.view();
    if (s.lse) a.lse = c_.lse.view();
    if (s.tree_mask) a.tree_mask = c_.tree_mask.view();
    if (s.sinks) a.sinks = c_.sinks.view();
    if (s.per_head_scales) a.k_scales = c_.k_scales.view(), a.v_scales = c_.v_scales.view();
    a.k_scale = c_.k_scale, a.v_scale = c_.v_scale;
    a.softmax_scale = s.softmax_scale;
    a.out_scale = s.out_scale;
    if (fused) {
      a.k_new = fused_.k_new.view(), a.v_new = fused_.v_new.view();
      a.cos_sin_cache = fused_.cos_sin.view();
      if (d.fused.positions) a.positions = fused_.positions.view();
    }
  }

  Family family() const override {
    if (d_.config.rope_style != RopeStyle::kNone) return Family::kGqaFused;
    return d_.config.skip_softmax_factor > 0.f ? Family::kGqaSkip : Family::kGqa;
  }

  std::string describe() const override {
    const GqaCaseSpec& s = c_.spec;
    const GqaConfig& c = d_.config;
    const std::string lens = joined(c_.lens);
    std::string t =
        "gqa batch=" + std::to_string(s.batch) + " q_len=" + std::to_string(s.q_len) +
        " hq=" + std::to_string(s.num_q_heads) + " hkv=" + std::to_string(s.num_kv_heads) +
        " d=" + std::to_string(s.head_dim) + " page=" + std::to_string(s.page_size) + " lens=[" +
        lens + "] " + layout_name(s.layout) + " q=" + dtype_name(s.q_dtype) +
        " kv=" + dtype_name(s.kv_dtype) + " out=" + dtype_name(s.out_dtype) +
        " beam=" + std::to_string(c.beam_width) + " own_pages=" + std::to_string(d_.own_pages) +
        " window=" + std::to_string(c.window) + " softcap=" + std::to_string(c.softcap) +
        " tree=" + std::to_string(c.tree_mask) + " sinks=" + std::to_string(c.sinks) +
        " lse=" + std::to_string(c.lse) + " per_head=" + std::to_string(c.per_head_kv_scale) +
        " k_scale=" + std::to_string(c_.k_scale) + " v_scale=" + std::to_string(c_.v_scale) +
        " softmax_scale=" + std::to_string(s.softmax_scale) +
        " out_scale=" + std::to_string(s.out_scale) + " max_batch=" + std::to_string(c.max_batch) +
        " max_q_len=" + std::to_string(c.max_q_len) +
        " max_seq_len=" + std::to_string(c.max_seq_len) +
        " split=" + (c.split_mode == SplitMode::kFixed ? std::to_string(c.split_tokens) : "auto") +
        " checked=" + std::to_string(c.checked) +
        " one_alloc=" + std::to_string(s.kv_one_allocation) +
        " spare_pages=" + std::to_string(s.spare_pages) +
        " columns=" + std::to_string(args_.page_table.shape[1]) + "/" +
        std::to_string(c_.page_table.shape()[1]) + " q_pad=" + std::to_string(d_.q_pad) +
        " out_pad=" + std::to_string(d_.out_pad) + " passes=" + std::to_string(d_.passes);
    if (c.rope_style != RopeStyle::kNone) {
      t += std::string(" rope=") + (c.rope_style == RopeStyle::kNeox ? "neox" : "gptj") +
           " rotary_dim=" + std::to_string(c.rotary_dim) +
           " positions=" + std::to_string(d_.fused.positions) +
           " shift=" + std::to_string(d_.fused.position_shift) +
           " cos_sin=" + dtype_name(d_.fused.cos_sin_dtype);
    }
    if (c.skip_softmax_factor > 0.f) {
      t += " skip_factor=" + std::to_string(c.skip_softmax_factor) +
           " tiny=" + std::to_string(d_.tiny) + " peaked=" + std::to_string(d_.peaked) +
           " heavy=" + std::to_string(d_.heavy) + " gap=" + std::to_string(d_.gap);
    }
    return t;
  }

  std::vector<HostTensor*> tensors() override {
    return case_tensors({&c_.q, &c_.k_pool, &c_.page_table, &c_.seq_lens, &c_.out, &c_.lse},
                        {&c_.v_pool, &c_.tree_mask, &c_.sinks, &c_.k_scales, &c_.v_scales, &q_store_,
                         &out_store_, &fused_.k_new, &fused_.v_new, &fused_.cos_sin,
                         &fused_.positions});
  }

  // The fused step appends to the caches: they are outputs too, compared bitwise.
  std::vector<Output> outputs() override {
    std::vector<Output> o =
        decode_outputs(c_.out, out_store_, d_.out_pad, args_.out, c_.lse, args_.lse, c_.spec.lse);
    if (d_.config.rope_style == RopeStyle::kNone) return o;
    o.push_back({"k_cache", &c_.k_pool, c_.k_pool.view(), false, true});
    if (!c_.v_pool.shape().empty()) o.push_back({"v_cache", &c_.v_pool, c_.v_pool.view(), false, true});
    return o;
  }

  int passes() const override { return d_.passes; }

  void keep_plan(Device device) override { kept_ = plan_gqa_decode(for_device(d_.config, device)); }

  // The config a run plans: the draw's, except for skip plans the CPU's (exact attention, what the
  // GPU's skip kernel is bounded against) and a tiny factor's second GPU pass (the exact kernel).
  GqaConfig run_config(const Side& side, int pass) const {
    GqaConfig c = d_.config;
    if (c.skip_softmax_factor > 0.f && (!side.gpu() || (d_.tiny && pass == 1)))
      c.skip_softmax_factor = 0.f;
    return c;
  }

  std::string run(const Side& side, int pass) override {
    const GqaConfig config = run_config(side, pass);
    // Both sides must take the draw's config (a one-sided refusal is a failure).
    if (!(config == d_.config)) (void)plan_gqa_decode(for_device(d_.config, side.device));
    return run_as(side, config);
  }

  // Runs the case with `config` (the draw's, or a variant of it) planned on side.device.
  std::string run_as(const Side& side, const GqaConfig& config) {
    std::optional<GqaPlan> made;
    const GqaPlan& plan =
        config == d_.config ? plan_for(side, kept_, config, made, plan_gqa_decode)
                            : made.emplace(plan_gqa_decode(for_device(config, side.device)));
    GqaDecodeArgs a = args_;
    to_side(side, plan, a,
            {&a.q, &a.k_cache, &a.v_cache, &a.page_table, &a.seq_lens, &a.out, &a.lse, &a.tree_mask,
             &a.sinks, &a.k_scales, &a.v_scales, &a.k_new, &a.v_new, &a.cos_sin_cache,
             &a.positions});
    gqa_decode(plan, a);
    if (side.gpu()) check_gqa_run(plan, a.workspace, a.stream);
    return plan.kernel_name;
  }

  // The GQA GPU suite's bounds (tests/gpu/gqa_gpu_test.cpp), whose data have unit logits: the
  // kernels multiply in the cache's 16-bit type, so an fp16 q against a bf16 cache is rounded to
  // bf16 first; the Hopper fp8 kernel's e4m3 products keep ~14 bits of a logit; e4m3 output
  // keeps 4 significant bits. A logit's error grows with its size, so the LSE bound grows with
  // the factor by which the drawn softmax scale and 16-bit caches' K scales enlarge the logits.
  Tolerance tolerance(const std::string& kernel) const override {
    const GqaCaseSpec& s = c_.spec;
    const bool q_rounded = s.kv_dtype == DType::kBF16 && s.q_dtype == DType::kFP16;
    const bool wgmma = kernel.find("_wgmma") != std::string::npos;
    const bool eight_bit = s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kINT8;
    double logits =
        s.softmax_scale != 0.f ? s.softmax_scale * std::sqrt(static_cast<double>(s.head_dim)) : 1.0;
    if (!eight_bit) {  // 8-bit caches' scales only map their codes back to unit values
      double k = s.per_head_scales ? 0.0 : c_.k_scale;
      for (int h = 0; s.per_head_scales && h < s.num_kv_heads; ++h)
        k = std::max(k, double{c_.k_scales.data<float>()[h]});
      logits *= k;
    }
    Tolerance t;
    t.lse_abs = (q_rounded ? 1e-2 : (wgmma ? 5e-3 : 2e-3)) * std::max(1.0, logits);
    // The Hopper fp8 kernel's logit error grows with the logit (lse_tolerance,
    // tests/gpu/gqa_gpu_runner.hpp): 2^-8 of the largest one, which peaked data (keys `gap` above
    // the bulk) make 5 to 20 (the fused step's new keys are not in the logical arrays).
    if (wgmma && eight_bit && d_.config.rope_style == RopeStyle::kNone)
      t.lse_abs = std::max(t.lse_abs, max_abs_logit(c_) / 256.0);
    switch (s.out_dtype) {
      case DType::kFP8E4M3: t.out_rel = 6e-2; break;
      case DType::kFP16:
        t.out_rel = (q_rounded || eight_bit || s.q_dtype != s.kv_dtype) ? 1e-2 : 4e-3;
        break;
      default: t.out_rel = 1e-2;
    }
    t.row_rel = 5 * t.out_rel;
    return t;
  }

  // Skip plans: the GPU's outputs within the skip bound of the CPU's exact ones (out_pad is 0:
  // outputs()' storage is the case's out and lse); the rest as compare_output finds it.
  void compare(const std::vector<Output>& outs, const std::vector<HostTensor>& ref,
               const std::vector<HostTensor>& got, const Tolerance& t, Mismatch& m) const override {
    DiffCase::compare(outs, ref, got, t, m);
    if (d_.config.skip_softmax_factor == 0.f) return;
    const HostTensor& none = ref[0];  // lse absent: skip_bound reads no LSE
    const SkipBound b = skip_bound(c_, ref[0], c_.spec.lse ? ref[1] : none, got[0],
                                   c_.spec.lse ? got[1] : none, d_.config.skip_softmax_factor,
                                   t.out_rel, t.lse_abs);
    m.bound_share = b.bad + b.lse_bad > 0 ? std::max(b.worst, 1.0 + 1e-9) : b.worst;
  }

  const GqaDraw& draw() const { return d_; }
  const GqaCase& gqa_case() const { return c_; }
  const FusedInputs& fused_inputs() const { return fused_; }

 private:
  GqaDraw d_;
  GqaCase c_;
  FusedInputs fused_;               // fused plans: k_new, v_new, cos/sin cache, positions
  HostTensor q_store_, out_store_;  // padded copies of q / out when their views are strided
  GqaDecodeArgs args_;              // host views
  std::optional<GqaPlan> kept_;     // keep_plan's
};

}  // namespace deca::test::diff
