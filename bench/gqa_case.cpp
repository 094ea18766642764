#include "gqa_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "api/gqa_prepare.hpp"
#include "cpu/reference.hpp"
#include "data.hpp"
#include "deca/error.hpp"
#include "gpu_timer.hpp"
#include "gqa_fused_case.hpp"
#include "gqa_layers.hpp"
#include "launch_floor.hpp"
#include "skip_bench.hpp"
#include "stamps_report.hpp"
#include "timing.hpp"

namespace deca::bench {
namespace {

// Draft trees of speculative decoding: draft i hangs under a random earlier draft (or the
// context), and sees itself and its ancestors.
std::vector<std::uint32_t> random_tree_masks(int batch, int q_len, Rng& rng) {
  const int words = (q_len + 31) / 32;
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(batch) * q_len * words, 0);
  for (int b = 0; b < batch; ++b) {
    std::uint32_t* rows = mask.data() + static_cast<std::size_t>(b) * q_len * words;
    for (int i = 0; i < q_len; ++i) {
      const int parent = static_cast<int>(rng.below(static_cast<std::uint32_t>(i + 1))) - 1;
      if (parent >= 0) std::copy(rows + parent * words, rows + (parent + 1) * words, rows + i * words);
      rows[i * words + i / 32] |= 1u << (i % 32);
    }
  }
  return mask;
}

// Keys visible to query token i of a request of length len (docs/semantics.md).
long long visible_keys(const GqaShape& s, int len, int i, const std::uint32_t* mask_row) {
  const int p = len - s.q_len + i;
  long long count = 0;
  const int lo = s.window > 0 ? std::max(0, p - s.window + 1) : 0;
  if (!mask_row) return std::max(0, p + 1 - lo);
  const int first_draft = len - s.q_len;
  count += std::max(0, first_draft - lo);
  for (int j = 0; j < s.q_len; ++j) {
    const int t = first_draft + j;
    if (t >= lo && (mask_row[j / 32] >> (j % 32) & 1u)) ++count;
  }
  return count;
}

struct HostCase {
  std::vector<int> lengths;
  PageTable pages;
  Bytes k, v, q, out;
  std::vector<float> sinks;
  std::vector<std::uint32_t> mask;
  std::size_t cache_elems = 0, q_elems = 0;
  std::int64_t cache_shape[4] = {}, cache_stride[4] = {};
};

GqaParams reference_params(const GqaShape& s, const GqaConfig& cfg, const HostCase& h,
                           const float kv_scale, int batch, const void* q, const int* page_table,
                           const int* seq_lens, const std::uint32_t* mask, void* out) {
  GqaParams p{};
  const long long D = s.head_dim, H = s.num_q_heads;
  p.batch = batch;
  p.q_len = s.q_len;
  p.num_q_heads = s.num_q_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.page_size = s.page_size;
  p.max_pages = h.pages.max_pages;
  p.num_pages = h.pages.num_pages;
  p.beam_width = 1;
  p.q_dtype = static_cast<int>(cfg.q_dtype);
  p.kv_dtype = static_cast<int>(cfg.kv_dtype);
  p.out_dtype = static_cast<int>(cfg.out_dtype);
  p.q = q;
  p.q_stride_batch = s.q_len * H * D;
  p.q_stride_token = H * D;
  p.q_stride_head = D;
  // cache_stride is [page, dim1, dim2, d] in the layout's order; name the slot and head strides.
  const bool nhd = cfg.layout == KvLayout::kNHD;
  p.k_cache = h.k.get();
  p.v_cache = h.v.get();
  p.k_stride_page = p.v_stride_page = h.cache_stride[0];
  p.k_stride_slot = p.v_stride_slot = nhd ? h.cache_stride[1] : h.cache_stride[2];
  p.k_stride_head = p.v_stride_head = nhd ? h.cache_stride[2] : h.cache_stride[1];
  p.page_table = page_table;
  p.page_table_stride = h.pages.max_pages;
  p.seq_lens = seq_lens;
  p.out = out;
  p.out_stride_batch = s.q_len * H * D;
  p.out_stride_token = H * D;
  p.out_stride_head = D;
  p.tree_mask = mask;
  const int words = (s.q_len + 31) / 32;
  p.mask_stride_batch = static_cast<long long>(s.q_len) * words;
  p.mask_stride_token = words;
  p.sinks = s.sinks ? h.sinks.data() : nullptr;
  p.k_scale = p.v_scale = kv_scale;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  p.out_scale = 1.f;
  p.window = s.window;
  p.num_splits = 1;
  return p;
}

// Runs the CPU reference on the requests `picked` and compares with their rows of `out`.
ErrorStats check_against_reference(const GqaShape& s, const GqaConfig& cfg, const HostCase& h,
                                   float kv_scale, const std::vector<int>& picked) {
  const std::size_t row = static_cast<std::size_t>(s.q_len) * s.num_q_heads * s.head_dim;
  const int words = (s.q_len + 31) / 32;
  const int n = static_cast<int>(picked.size());
  std::vector<std::uint16_t> q(n * row), ref(n * row);
  std::vector<int> table(static_cast<std::size_t>(n) * h.pages.max_pages), lens(n);
  std::vector<std::uint32_t> mask(h.mask.empty() ? 0 : static_cast<std::size_t>(n) * s.q_len * words);
  const auto* q_all = reinterpret_cast<const std::uint16_t*>(h.q.get());
  for (int i = 0; i < n; ++i) {
    const int b = picked[i];
    std::copy_n(q_all + b * row, row, q.begin() + i * row);
    std::copy_n(h.pages.ids.begin() + static_cast<std::size_t>(b) * h.pages.max_pages,
                h.pages.max_pages, table.begin() + static_cast<std::size_t>(i) * h.pages.max_pages);
    lens[i] = h.lengths[b];
    if (!mask.empty()) {
      const std::size_t m = static_cast<std::size_t>(s.q_len) * words;
      std::copy_n(h.mask.begin() + b * m, m, mask.begin() + i * m);
    }
  }
  const GqaParams p = reference_params(s, cfg, h, kv_scale, n, q.data(), table.data(),
                                       lens.data(), mask.empty() ? nullptr : mask.data(),
                                       ref.data());
  deca::cpu::gqa_decode(p);
  ErrorAccumulator acc;
  const auto* out = reinterpret_cast<const std::uint16_t*>(h.out.get());
  for (int i = 0; i < n; ++i) acc.add(out + picked[i] * row, ref.data() + i * row, cfg.out_dtype, row);
  return acc.finish();
}

}  // namespace

GqaConfig gqa_config(const GqaShape& s, KvLayout layout, Device device) {
  GqaConfig c;
  c.num_q_heads = s.num_q_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.page_size = s.page_size;
  c.layout = layout;
  c.q_dtype = DType::kBF16;
  c.kv_dtype = s.kv_dtype;
  c.out_dtype = DType::kBF16;
  c.max_batch = s.batch;
  c.max_q_len = s.q_len;
  c.max_seq_len = s.seq_len;
  c.tree_mask = s.tree_mask;
  c.sinks = s.sinks;
  c.window = s.window;
  c.device = device;
  return c;
}

CaseResult run_gqa_case(const BenchCase& bc, const RunOptions& opt) {
  const GqaShape& s = bc.gqa;
  Rng rng(opt.seed ^ std::hash<std::string>{}(bc.name));
  const Device device = opt.cuda ? Device::cuda(opt.device) : Device::cpu();
  GqaConfig cfg = gqa_config(s, opt.layout, device);
  cfg.checked = opt.checked;  // explicit: the bench measures what its row says, not DECA_CHECKED
  cfg.skip_softmax_factor = opt.skip_softmax;
  const GqaPlan plan = plan_gqa_decode(cfg);

  // Host data: every case gets fresh random values and a freshly shuffled page pool.
  HostCase h;
  h.lengths = request_lengths(s);
  const int max_pages = (s.seq_len + s.page_size - 1) / s.page_size;
  h.pages = make_page_table(h.lengths, s.page_size, max_pages, rng);
  const std::int64_t P = s.page_size, Hk = s.num_kv_heads, D = s.head_dim;
  const std::int64_t pages = h.pages.num_pages;
  const std::int64_t nhd_shape[4] = {pages, P, Hk, D}, hnd_shape[4] = {pages, Hk, P, D};
  std::copy_n(opt.layout == KvLayout::kNHD ? nhd_shape : hnd_shape, 4, h.cache_shape);
  h.cache_stride[3] = 1;
  for (int i = 2; i >= 0; --i) h.cache_stride[i] = h.cache_stride[i + 1] * h.cache_shape[i + 1];
  h.cache_elems = static_cast<std::size_t>(pages * P * Hk * D);
  const std::size_t kv_elt = dtype_size(s.kv_dtype);
  h.k = alloc_bytes(h.cache_elems * kv_elt);
  h.v = alloc_bytes(h.cache_elems * kv_elt);
  fill_random(h.k.get(), s.kv_dtype, h.cache_elems, rng.next());
  fill_random(h.v.get(), s.kv_dtype, h.cache_elems, rng.next());
  h.q_elems = static_cast<std::size_t>(s.batch) * s.q_len * s.num_q_heads * D;
  h.q = alloc_bytes(h.q_elems * 2);
  h.out = alloc_bytes(h.q_elems * 2);
  fill_random(h.q.get(), DType::kBF16, h.q_elems, rng.next());
  std::memset(h.out.get(), 0xFF, h.q_elems * 2);  // NaN: a row the op never writes fails --check
  if (s.sinks) {
    h.sinks.resize(s.num_q_heads);
    fill_random(h.sinks.data(), DType::kFP32, h.sinks.size(), rng.next(), 2.f);
  }
  if (s.tree_mask) h.mask = random_tree_masks(s.batch, s.q_len, rng);
  if (opt.peaked) make_peaked(s, opt.layout, h.lengths, h.pages, h.cache_stride, h.q.get(), h.k.get(), rng);
  const float kv_scale = random_kv_scale(s.kv_dtype);

  // Views on the backend's memory (host buffers, or device copies of them).
  CaseMemory mem(opt.cuda);
  const int words = (s.q_len + 31) / 32;
  GqaDecodeArgs args;
  args.q = make_tensor(mem.place(h.q.get(), h.q_elems * 2), DType::kBF16,
                       {s.batch, s.q_len, s.num_q_heads, D}, device);
  args.k_cache = make_tensor(mem.place(h.k.get(), h.cache_elems * kv_elt), s.kv_dtype, 4,
                             h.cache_shape, h.cache_stride, device);
  args.v_cache = make_tensor(mem.place(h.v.get(), h.cache_elems * kv_elt), s.kv_dtype, 4,
                             h.cache_shape, h.cache_stride, device);
  args.page_table = make_tensor(mem.place(h.pages.ids.data(), h.pages.ids.size() * 4),
                                DType::kINT32, {s.batch, max_pages}, device);
  args.seq_lens = make_tensor(mem.place(h.lengths.data(), h.lengths.size() * 4), DType::kINT32,
                              {s.batch}, device);
  void* out_ptr = mem.place(h.out.get(), h.q_elems * 2);
  args.out = make_tensor(out_ptr, DType::kBF16, {s.batch, s.q_len, s.num_q_heads, D}, device);
  if (s.sinks)
    args.sinks = make_tensor(mem.place(h.sinks.data(), h.sinks.size() * 4), DType::kFP32,
                             {s.num_q_heads}, device);
  if (s.tree_mask)
    args.tree_mask = make_tensor(mem.place(h.mask.data(), h.mask.size() * 4), DType::kUINT32,
                                 {s.batch, s.q_len, words}, device);
  args.k_scale = args.v_scale = kv_scale;
  args.softmax_scale = 1.f / std::sqrt(static_cast<float>(s.head_dim));
  if (void* ws = mem.workspace(plan.workspace_bytes)) {
    args.workspace = ws;
    args.workspace_bytes = plan.workspace_bytes;
  }

  CaseResult r;
  r.name = bc.name;
  r.backend = opt.cuda ? "cuda" : "cpu";
  r.kv_dtype = dtype_name(s.kv_dtype);
  r.num_splits = plan.num_splits;
  r.kernel_name = plan.kernel_name;
  double mean_len = 0;
  for (int len : h.lengths) mean_len += len;
  mean_len /= s.batch;
  r.shape = {{"family", "gqa"},
             {"num_q_heads", s.num_q_heads},
             {"num_kv_heads", s.num_kv_heads},
             {"head_dim", s.head_dim},
             {"page_size", s.page_size},
             {"layout", opt.layout == KvLayout::kNHD ? "NHD" : "HND"},
             {"batch", s.batch},
             {"q_len", s.q_len},
             {"seq_len", s.seq_len},
             {"mean_seq_len", mean_len},
             {"ragged", !s.lengths.empty()},
             {"tree_mask", s.tree_mask},
             {"window", s.window},
             {"sinks", s.sinks},
             {"q_dtype", "bf16"},
             {"out_dtype", "bf16"},
             {"checked", opt.checked}};

  // Bytes and FLOPs of what the op must do: K and V of the visible keys once each.
  const double token_kv_bytes = 2.0 * Hk * D * kv_elt;
  for (int b = 0; b < s.batch; ++b) {
    const int len = h.lengths[b];
    const int lo = s.window > 0 ? std::max(0, len - s.q_len - s.window + 1) : 0;
    r.kv_bytes += (len - lo) * token_kv_bytes;
    for (int i = 0; i < s.q_len; ++i) {
      const std::uint32_t* mask_row =
          h.mask.empty() ? nullptr : h.mask.data() + (static_cast<std::size_t>(b) * s.q_len + i) * words;
      r.flops += 4.0 * s.num_q_heads * D * visible_keys(s, len, i, mask_row);
    }
  }
  r.total_bytes = r.kv_bytes + 2.0 * h.q_elems * 2;

  time_and_check(
      opt, s.batch, out_ptr, h.out.get(), h.q_elems * 2,
      [&](void* stream) {
        GqaDecodeArgs a = args;
        a.stream = stream;
        gqa_decode(plan, a);
      },
      [&](const std::vector<int>& picked) {
        return check_against_reference(s, cfg, h, kv_scale, picked);
      },
      r);
  // Checked runs over valid data must leave no record: a false positive fails the case.
  check_gqa_run(plan, args.workspace, nullptr);
  // Before the other extras: out still holds the timed runs' output, which the stamp build must
  // reproduce bit for bit, and the cache is as they read it (--fused appends to it).
  if (opt.stamps && opt.cuda) r.stamps = measure_stamps(plan, args, h.q_elems * 2, opt);
  if (opt.skip_softmax > 0.f) {
    r.skip = {{"dist", opt.peaked ? "peaked" : "uniform"}};
    measure_skip(opt, plan, args, h.q_elems * 2, static_cast<int>(kv_elt), r);
  }
  if (opt.layers > 0 && opt.cuda) r.layers = time_layers(plan, args, h.cache_elems * kv_elt, opt);
  if (opt.fused) r.fused = time_fused_step(plan, args, opt, mem, rng.next());
  if (opt.host_calls > 0) {
    GqaDecodeArgs a = args;
    if (!opt.cuda) {
      // The CPU backend computes inside the call: a batch of 0 requests over the same tensors
      // times what a call costs besides the attention itself (every argument check, dispatch).
      for (TensorView* t : {&a.q, &a.page_table, &a.seq_lens, &a.out, &a.tree_mask}) {
        if (t->defined()) t->shape[0] = 0;
      }
      r.host_note = "CPU: validation + dispatch of a 0-request call (no attention computed)";
    } else {
      r.host_note = "CUDA: validation + kernel lookup + launch, no synchronisation";
    }
    r.host_us = host_cost_us(opt, opt.host_calls, [&](void* stream) {
      a.stream = stream;
      gqa_decode(plan, a);
    });
    // deca's own part, timed directly: the same call up to (not including) the driver call.
    r.host_deca_us = host_cost_us(opt, opt.host_calls, [&](void* stream) {
      a.stream = stream;
      api::gqa_decode_without_launch(plan, a);
    });
    if (opt.cuda) {
      r.host_launch_floor_us = host_cost_us(
          opt, opt.host_calls, empty_kernel_launcher(opt.device, sizeof(GqaParams)));
      r.host_floor_plain_us = host_cost_us(
          opt, opt.host_calls, empty_kernel_launcher(opt.device, sizeof(GqaParams), false));
      r.host_floor_small_us =
          host_cost_us(opt, opt.host_calls, empty_kernel_launcher(opt.device, 8));
    }
  }
  return r;
}

}  // namespace deca::bench
