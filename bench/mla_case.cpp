#include "mla_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "cpu/reference.hpp"
#include "data.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "gpu_timer.hpp"
#include "mla_model1_case.hpp"
#include "timing.hpp"

namespace deca::bench {
namespace {

// Stored bytes of one token per dense cache format (MlaKvFormat): 576 bf16, 576 e4m3, the
// 656-byte token.
constexpr std::size_t kTokenBytes[] = {kMlaDimQK * 2, kMlaDimQK, kMlaFp8TokenBytes};
constexpr const char* kFormatText[] = {"bf16", "fp8_e4m3 (one scale)", "fp8_e4m3 (656 B token)"};
// The dense e4m3 cache's scale: the e4m3 codes fill_random writes span [-448, 448), so real
// values in [-0.875, 0.875) (as the 656-byte tokens' 2^-9 group scales give).
constexpr float kE4m3CacheScale = 0x1p-9f;

MlaCacheFormat cache_format(int kv_format) {
  return kv_format == kMlaKvFP8E4M3 ? MlaCacheFormat::kFP8E4M3
         : kv_format == kMlaKvFP8Sparse ? MlaCacheFormat::kFP8Sparse
                                        : MlaCacheFormat::kBF16;
}

// The stored format of a shape's cache: the 656-byte token for sparse decode.
int stored_format(const MlaShape& s) { return s.sparse ? kMlaKvFP8Sparse : s.kv_format; }

DType cache_dtype(int kv_format) {
  return kv_format == kMlaKvFP8E4M3 ? DType::kFP8E4M3
         : kv_format == kMlaKvFP8Sparse ? DType::kUINT8
                                        : DType::kBF16;
}

std::int64_t cache_row(int kv_format) {
  return kv_format == kMlaKvFP8Sparse ? kMlaFp8TokenBytes : kMlaDimQK;
}

// Random 656-byte tokens: e4m3 NoPE codes (values uniform in [-448, 448)), four power-of-two
// scales (2^-9: real values in [-0.875, 0.875)), bf16 RoPE values in [-1, 1).
void fill_sparse_cache(std::uint8_t* cache, std::size_t tokens, Rng& rng) {
  fill_random(cache, DType::kFP8E4M3, tokens * kMlaFp8TokenBytes, rng.next());
  std::vector<std::uint16_t> rope(tokens * kMlaDimRope);
  fill_random(rope.data(), DType::kBF16, rope.size(), rng.next());
  const float scale = std::ldexp(1.f, -9);
  for (std::size_t t = 0; t < tokens; ++t) {
    std::uint8_t* tok = cache + t * kMlaFp8TokenBytes;
    for (int g = 0; g < 4; ++g) std::memcpy(tok + kMlaDimNope + 4 * g, &scale, 4);
    std::memcpy(tok + kMlaDimNope + 16, rope.data() + t * kMlaDimRope, kMlaDimRope * 2);
  }
}

struct HostMla {
  std::vector<int> lengths;
  PageTable blocks;
  Bytes kv, q, out;
  std::vector<float> lse;
  std::vector<std::int32_t> indices;  // sparse: [batch, q_len, topk]
  std::size_t kv_bytes = 0, q_elems = 0, out_elems = 0;
};

// Sparse: each query token selects `topk` distinct tokens of its request's context.
std::vector<std::int32_t> draw_indices(const MlaShape& s, const HostMla& h, Rng& rng,
                                       std::vector<long long>& unique_per_request) {
  std::vector<std::int32_t> idx(static_cast<std::size_t>(s.batch) * s.q_len * s.topk);
  unique_per_request.assign(s.batch, 0);
  for (int b = 0; b < s.batch; ++b) {
    const int len = h.lengths[b];
    std::vector<std::uint8_t> seen_any(len, 0);
    for (int i = 0; i < s.q_len; ++i) {
      std::vector<std::uint8_t> seen(len, 0);
      std::int32_t* row = idx.data() + (static_cast<std::size_t>(b) * s.q_len + i) * s.topk;
      const int take = std::min(s.topk, len);
      for (int k = 0; k < take;) {
        const int pos = static_cast<int>(rng.below(static_cast<std::uint32_t>(len)));
        if (seen[pos]) continue;
        seen[pos] = 1;
        if (!seen_any[pos]) ++unique_per_request[b];
        seen_any[pos] = 1;
        const int block = h.blocks.ids[static_cast<std::size_t>(b) * h.blocks.max_pages + pos / s.page_size];
        row[k++] = block * s.page_size + pos % s.page_size;
      }
      std::fill(row + take, row + s.topk, -1);
    }
  }
  return idx;
}

// Whether this build runs MLA on CUDA tensors: one tiny call per kind (sparse, or dense in a
// cache format), remembered.
std::optional<std::string> cuda_mla_rejection(bool sparse, int kv_format, int device) {
  static std::map<std::tuple<bool, int, int>, std::optional<std::string>> known;
  const auto key = std::make_tuple(sparse, kv_format, device);
  if (auto it = known.find(key); it != known.end()) return it->second;
  std::optional<std::string> why;
  try {
    const Device dev = Device::cuda(device);
    MlaConfig c;
    c.num_heads = 64;
    c.sparse = sparse;
    c.kv_format = sparse ? MlaCacheFormat::kDefault : cache_format(kv_format);
    c.max_seq_len = 64;
    c.topk = sparse ? 64 : 0;
    c.lse = false;
    c.device = dev;
    const MlaPlan plan = plan_mla_decode(c);
    const int format = sparse ? kMlaKvFP8Sparse : kv_format;
    DeviceBuffer q(64 * kMlaDimQK * 2), kv(64 * kTokenBytes[format]), table(64 * 4), lens(4),
        out(64 * kMlaDimV * 2);
    check_cuda(cudaMemset(kv.get(), 0, kv.bytes()), "cudaMemset (probe)");
    check_cuda(cudaMemset(table.get(), 0, table.bytes()), "cudaMemset (probe)");
    const int one_block = 64;
    lens.upload(&one_block, 4);
    std::optional<DeviceBuffer> ws;
    if (plan.workspace_bytes) ws.emplace(plan.workspace_bytes);
    const TensorView q_view = make_tensor(q.get(), DType::kBF16, {1, 1, 64, kMlaDimQK}, dev);
    const TensorView kv_view =
        make_tensor(kv.get(), cache_dtype(format), {1, 64, 1, cache_row(format)}, dev);
    const TensorView out_view = make_tensor(out.get(), DType::kBF16, {1, 1, 64, kMlaDimV}, dev);
    if (sparse) {
      MlaSparseArgs a;
      a.q = q_view;
      a.kv_cache = kv_view;
      a.indices = make_tensor(table.get(), DType::kINT32, {1, 1, 64}, dev);
      a.out = out_view;
      a.workspace = ws ? ws->get() : nullptr;
      a.workspace_bytes = plan.workspace_bytes;
      mla_decode_sparse(plan, a);
    } else {
      MlaDenseArgs a;
      a.q = q_view;
      a.kv_cache = kv_view;
      a.kv_scale = format == kMlaKvFP8E4M3 ? kE4m3CacheScale : 1.f;
      a.block_table = make_tensor(table.get(), DType::kINT32, {1, 1}, dev);
      a.cache_seqlens = make_tensor(lens.get(), DType::kINT32, {1}, dev);
      a.out = out_view;
      a.workspace = ws ? ws->get() : nullptr;
      a.workspace_bytes = plan.workspace_bytes;
      mla_decode_dense(plan, a);
    }
    check_cuda(cudaDeviceSynchronize(), "MLA probe");
  } catch (const Error& e) {
    why = e.what();
  }
  known[key] = why;
  return why;
}

// Runs the CPU reference on the requests `picked` and compares with their rows of h.out.
ErrorStats check_against_reference(const MlaShape& s, const HostMla& h, int max_blocks,
                                   float scale, const std::vector<int>& picked) {
  const std::int64_t Q = s.q_len, H = s.num_heads;
  const int n = static_cast<int>(picked.size());
  const std::size_t q_row = static_cast<std::size_t>(Q) * H * kMlaDimQK;
  const std::size_t o_row = static_cast<std::size_t>(Q) * H * kMlaDimV;
  std::vector<std::uint16_t> sub_q(n * q_row), ref(n * o_row);
  std::vector<int> sub_table(static_cast<std::size_t>(n) * max_blocks), sub_lens(n);
  std::vector<std::int32_t> sub_idx(s.sparse ? static_cast<std::size_t>(n) * Q * s.topk : 0);
  const auto* q_all = reinterpret_cast<const std::uint16_t*>(h.q.get());
  for (int i = 0; i < n; ++i) {
    const int b = picked[i];
    std::copy_n(q_all + b * q_row, q_row, sub_q.begin() + i * q_row);
    std::copy_n(h.blocks.ids.begin() + static_cast<std::size_t>(b) * max_blocks, max_blocks,
                sub_table.begin() + static_cast<std::size_t>(i) * max_blocks);
    sub_lens[i] = h.lengths[b];
    if (s.sparse) {
      const std::size_t m = static_cast<std::size_t>(Q) * s.topk;
      std::copy_n(h.indices.begin() + b * m, m, sub_idx.begin() + i * m);
    }
  }
  // The fields dense and sparse params share; the cache row is `row` elements of its own dtype
  // (bf16, or bytes for the 8-bit formats).
  auto fill_common = [&](auto& p, std::int64_t row) {
    p.batch = n;
    p.q_len = s.q_len;
    p.num_heads = s.num_heads;
    p.page_size = s.page_size;
    p.num_blocks = h.blocks.num_pages;
    p.q = sub_q.data();
    p.q_stride_batch = static_cast<long long>(q_row);
    p.q_stride_token = H * kMlaDimQK;
    p.q_stride_head = kMlaDimQK;
    p.kv = h.kv.get();
    p.kv_stride_block = static_cast<long long>(s.page_size) * row;
    p.kv_stride_slot = row;
    p.out = ref.data();
    p.out_stride_batch = static_cast<long long>(o_row);
    p.out_stride_token = H * kMlaDimV;
    p.out_stride_head = kMlaDimV;
    p.softmax_scale = scale;
  };
  if (s.sparse) {
    MlaSparseParams p{};
    fill_common(p, kMlaFp8TokenBytes);
    p.topk = s.topk;
    p.indices = sub_idx.data();
    p.indices_stride_batch = static_cast<long long>(Q) * s.topk;
    p.indices_stride_token = s.topk;
    deca::cpu::mla_sparse_decode(p);
  } else {
    MlaDenseParams p{};
    fill_common(p, cache_row(s.kv_format));
    p.kv_format = s.kv_format;
    p.kv_scale = s.kv_format == kMlaKvFP8E4M3 ? kE4m3CacheScale : 1.f;
    p.max_blocks = max_blocks;
    p.block_table = sub_table.data();
    p.block_table_stride = max_blocks;
    p.seq_lens = sub_lens.data();
    deca::cpu::mla_dense_decode(p);
  }
  ErrorAccumulator acc;
  const auto* got = reinterpret_cast<const std::uint16_t*>(h.out.get());
  for (int i = 0; i < n; ++i) acc.add(got + picked[i] * o_row, ref.data() + i * o_row, DType::kBF16, o_row);
  return acc.finish();
}

void fill_shape_json(const MlaShape& s, CaseResult& r) {
  double mean_len = 0;
  for (int len : request_lengths(s)) mean_len += len;
  mean_len /= s.batch;
  r.shape = {{"family", s.sparse ? "mla_sparse" : "mla_dense"},
             {"num_heads", s.num_heads},
             {"head_dim_qk", kMlaDimQK},
             {"head_dim_v", kMlaDimV},
             {"page_size", s.page_size},
             {"batch", s.batch},
             {"q_len", s.q_len},
             {"seq_len", s.seq_len},
             {"mean_seq_len", mean_len},
             {"ragged", !s.lengths.empty()},
             {"topk", s.topk},
             {"kv_format", mla_cache_format_name(cache_format(stored_format(s)))},
             {"q_dtype", "bf16"},
             {"out_dtype", "bf16"}};
}

}  // namespace

MlaConfig mla_config(const MlaShape& s, Device device, bool checked) {
  MlaConfig cfg;
  cfg.num_heads = s.num_heads;
  cfg.page_size = s.page_size;
  cfg.sparse = s.sparse;
  cfg.kv_format = s.sparse ? MlaCacheFormat::kDefault : cache_format(s.kv_format);
  if (is_model1(s)) {
    cfg.kv_format = MlaCacheFormat::kModel1;
    cfg.extra_topk = s.extra_topk;
    cfg.extra_page_size = s.extra_page_size;
  }
  cfg.max_batch = s.batch;
  cfg.max_q_len = s.q_len;
  cfg.max_seq_len = s.seq_len;
  cfg.topk = s.topk;
  cfg.lse = true;
  cfg.checked = checked;  // explicit: the bench measures what its row says, not DECA_CHECKED
  cfg.device = device;
  return cfg;
}

CaseResult run_mla_case(const BenchCase& bc, const RunOptions& opt) {
  if (is_model1(bc.mla)) return run_mla_model1_case(bc, opt);
  const MlaShape& s = bc.mla;
  CaseResult r;
  r.name = bc.name;
  r.backend = opt.cuda ? "cuda" : "cpu";
  const int format = stored_format(s);
  r.kv_dtype = kFormatText[format];
  fill_shape_json(s, r);
  if (opt.cuda) {
    if (auto why = cuda_mla_rejection(s.sparse, format, opt.device)) {
      r.skipped = "no CUDA MLA kernel in this build (" + *why + ")";
      return r;
    }
  }

  Rng rng(opt.seed ^ std::hash<std::string>{}(bc.name));
  const Device device = opt.cuda ? Device::cuda(opt.device) : Device::cpu();
  const MlaConfig cfg = mla_config(s, device, opt.checked);
  const MlaPlan plan = plan_mla_decode(cfg);

  HostMla h;
  h.lengths = request_lengths(s);
  const int max_blocks = (s.seq_len + s.page_size - 1) / s.page_size;
  h.blocks = make_page_table(h.lengths, s.page_size, max_blocks, rng);
  const std::size_t tokens = static_cast<std::size_t>(h.blocks.num_pages) * s.page_size;
  h.kv_bytes = tokens * kTokenBytes[format];
  h.kv = alloc_bytes(h.kv_bytes);
  if (format == kMlaKvFP8Sparse) fill_sparse_cache(h.kv.get(), tokens, rng);
  else fill_random(h.kv.get(), cache_dtype(format), tokens * kMlaDimQK, rng.next());
  h.q_elems = static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads * kMlaDimQK;
  h.out_elems = static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads * kMlaDimV;
  h.q = alloc_bytes(h.q_elems * 2);
  h.out = alloc_bytes(h.out_elems * 2);
  fill_random(h.q.get(), DType::kBF16, h.q_elems, rng.next());
  std::memset(h.out.get(), 0xFF, h.out_elems * 2);  // NaN: a row never written fails --check
  h.lse.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads, 0.f);
  std::vector<long long> unique;
  if (s.sparse) h.indices = draw_indices(s, h, rng, unique);

  CaseMemory mem(opt.cuda);
  const std::int64_t B = s.batch, Q = s.q_len, H = s.num_heads;
  const TensorView q = make_tensor(mem.place(h.q.get(), h.q_elems * 2), DType::kBF16,
                                   {B, Q, H, kMlaDimQK}, device);
  void* out_ptr = mem.place(h.out.get(), h.out_elems * 2);
  const TensorView out = make_tensor(out_ptr, DType::kBF16, {B, Q, H, kMlaDimV}, device);
  const TensorView lse = make_tensor(mem.place(h.lse.data(), h.lse.size() * 4), DType::kFP32,
                                     {B, Q, H}, device);
  const std::int64_t pool = h.blocks.num_pages;
  const TensorView kv = make_tensor(mem.place(h.kv.get(), h.kv_bytes), cache_dtype(format),
                                    {pool, s.page_size, 1, cache_row(format)}, device);
  void* ws = mem.workspace(plan.workspace_bytes);
  const float scale = 1.f / std::sqrt(static_cast<float>(kMlaDimQK));

  MlaDenseArgs dense;
  MlaSparseArgs sparse;
  if (s.sparse) {
    sparse.q = q;
    sparse.kv_cache = kv;
    sparse.indices = make_tensor(mem.place(h.indices.data(), h.indices.size() * 4), DType::kINT32,
                                 {B, Q, s.topk}, device);
    sparse.out = out;
    sparse.lse = lse;
    sparse.softmax_scale = scale;
    sparse.workspace = ws;
    sparse.workspace_bytes = plan.workspace_bytes;
  } else {
    dense.q = q;
    dense.kv_cache = kv;
    dense.kv_scale = format == kMlaKvFP8E4M3 ? kE4m3CacheScale : 1.f;
    dense.block_table = make_tensor(mem.place(h.blocks.ids.data(), h.blocks.ids.size() * 4),
                                    DType::kINT32, {B, max_blocks}, device);
    dense.cache_seqlens = make_tensor(mem.place(h.lengths.data(), h.lengths.size() * 4),
                                      DType::kINT32, {B}, device);
    dense.out = out;
    dense.lse = lse;
    dense.softmax_scale = scale;
    dense.workspace = ws;
    dense.workspace_bytes = plan.workspace_bytes;
  }

  r.num_splits = plan.num_splits;
  r.kernel_name = plan.kernel_name;
  // FLOPs: 2 * h * (576 + 512) per visible (query row, key); bytes: each visible or selected
  // token once in its stored size (docs/benchmarks.md).
  const double flops_per_key = 2.0 * H * (kMlaDimQK + kMlaDimV);
  for (int b = 0; b < s.batch; ++b) {
    const int len = h.lengths[b];
    if (s.sparse) {
      r.kv_bytes += static_cast<double>(unique[b]) * kMlaFp8TokenBytes;
      r.flops += flops_per_key * Q * std::min(s.topk, len);
    } else {
      // Causal: query token i sees len - (Q - 1 - i) keys.
      r.kv_bytes += static_cast<double>(len) * kTokenBytes[format];
      for (int i = 0; i < Q; ++i) r.flops += flops_per_key * std::max<std::int64_t>(0, len - Q + i + 1);
    }
  }
  r.total_bytes = r.kv_bytes + 2.0 * (h.q_elems + h.out_elems);

  // The first run schedules; with --mla-schedule once the later ones reuse its schedule (the
  // shape, indices and lengths never change within a case).
  bool scheduled = false;
  const bool reuse = opt.cuda && !opt.mla_schedule_every;
  if (opt.cuda && r.shape.is_object()) r.shape["schedule"] = reuse ? "once" : "every";
  time_and_check(
      opt, s.batch, out_ptr, h.out.get(), h.out_elems * 2,
      [&](void* stream) {
        if (s.sparse) {
          MlaSparseArgs a = sparse;
          a.stream = stream;
          a.reuse_schedule = reuse && scheduled;
          mla_decode_sparse(plan, a);
          scheduled = true;
        } else {
          MlaDenseArgs a = dense;
          a.stream = stream;
          a.reuse_schedule = reuse && scheduled;
          mla_decode_dense(plan, a);
          scheduled = true;
        }
      },
      [&](const std::vector<int>& picked) {
        return check_against_reference(s, h, max_blocks, scale, picked);
      },
      r);
  // Checked runs over valid data must leave no record: a false positive fails the case.
  check_mla_run(plan, ws, nullptr);
  if (r.shape.is_object()) r.shape["checked"] = opt.checked;
  return r;
}

}  // namespace deca::bench
