// Random MODEL1 sparse decode cases (DeepSeek V4: 512-dim rows, 584-byte tokens laid out per
// page, an optional second cache) as public-API calls on host memory: the plan config, the
// MlaSparseArgs, and what a brute force needs (the logical indices and lengths). Caches are
// packed by deca::pack_mla_fp8(kModel1) into pages whose padding, pad bytes and never-selected
// tokens are poisoned with 0xFF (NaN in e4m3, a NaN scale in ue8m0), so a reader that touches
// them produces NaN. Entries past a row's length hold ids outside the pool or of such poisoned
// tokens. Outputs start as kModel1Poison bytes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "common/host_tensor.hpp"
#include "common/mla_brute.hpp"
#include "deca/mla.hpp"
#include "deca/quant.hpp"

namespace deca::test {

inline constexpr std::uint8_t kModel1Poison = 0xA5;

struct Model1Spec {
  int batch = 2;
  int q_len = 1;
  int num_heads = 16;
  int page_size = 64;
  int blocks = 3;
  int topk = 32;
  int extra_page_size = 2;
  int extra_blocks = 40;
  int extra_topk = 16;  // 0: no second cache
  bool topk_length = false;
  bool extra_topk_length = false;
  bool attn_sink = false;
  bool lse = true;
  float softmax_scale = 0.f;
  int block_pad = 0;       // bytes (a multiple of 16) past the packed page in each block's stride
  bool strided = false;    // q, out, lse and both index tensors as views with padded strides
  float skip = 0.15f;      // share of -1 entries
  int duplicates = 2;      // per row, entries repeating an earlier id
  bool all_invalid_row = false;  // request 0's first query: only -1 in both caches
};

// One MODEL1 cache: blocks of `stride` bytes, the [blocks, page, 1, 584] view over them.
struct Model1Pool {
  int page_size = 0;
  int blocks = 0;
  std::int64_t stride = 0;
  std::vector<std::uint64_t> storage;
  TensorView view;

  std::uint8_t* base() { return reinterpret_cast<std::uint8_t*>(storage.data()); }
  const std::uint8_t* base() const { return reinterpret_cast<const std::uint8_t*>(storage.data()); }
  const std::uint8_t* row(int id) const {
    return base() + (id / page_size) * stride + static_cast<std::int64_t>(id % page_size) * 576;
  }
  const std::uint8_t* scales(int id) const {
    return base() + (id / page_size) * stride + static_cast<std::int64_t>(page_size) * 576 +
           static_cast<std::int64_t>(id % page_size) * 8;
  }
  int tokens() const { return blocks * page_size; }
};

// The 512 real values of token `id`, decoded from its bytes by the format's definition: e4m3
// times 2^(scale byte - 127) for the 448 NoPE values (one scale per 64), the bf16 RoPE values.
inline std::vector<long double> model1_token(const Model1Pool& pool, int id) {
  std::vector<long double> k(512);
  const std::uint8_t* r = pool.row(id);
  const std::uint8_t* sc = pool.scales(id);
  for (int d = 0; d < 448; ++d) {
    k[d] = std::ldexp(static_cast<long double>(fp8e4m3_to_float(r[d])), sc[d / 64] - 127);
  }
  for (int d = 0; d < 64; ++d) {
    std::uint16_t bits;
    std::memcpy(&bits, r + 448 + 2 * d, 2);
    k[448 + d] = bf16_to_float(bits);
  }
  return k;
}

// A strided (or contiguous) view over a HostTensor's storage.
inline TensorView model1_view(const HostTensor& t, std::vector<std::int64_t> shape,
                              std::vector<std::int64_t> strides) {
  return make_tensor(const_cast<void*>(t.raw()), t.dtype(), static_cast<int>(shape.size()),
                     shape.data(), strides.data());
}

struct Model1Case {
  Model1Spec spec;
  MlaConfig config;
  Model1Pool kv, extra;
  HostTensor q, out, lse, indices, extra_indices, topk_length, extra_topk_length, attn_sink;
  std::vector<int> lens, extra_lens;  // per request: the entries that count
  MlaSparseArgs args;

  int q_dim() const { return spec.strided ? 640 : 512; }      // elements between heads
  int out_dim() const { return spec.strided ? 520 : 512; }
  int lse_row() const { return spec.num_heads + (spec.strided ? 2 : 0); }  // per query token
  int idx_row(int topk) const { return spec.strided ? topk + 3 : topk; }

  int id_at(bool second, int b, int i, int k) const {
    const HostTensor& t = second ? extra_indices : indices;
    const int row = idx_row(second ? spec.extra_topk : spec.topk);
    return t.data<std::int32_t>()[(static_cast<std::int64_t>(b) * spec.q_len + i) * row + k];
  }
  float q_at(int b, int i, int h, int d) const {
    return q.get(((static_cast<std::int64_t>(b) * spec.q_len + i) * spec.num_heads + h) * q_dim() + d);
  }

  // out and lse through their (possibly strided) views, as contiguous [rows][512] and [rows].
  HostTensor out_rows() const {
    HostTensor r(DType::kBF16, {spec.batch, spec.q_len, spec.num_heads, 512});
    for (std::int64_t row = 0; row < r.numel() / 512; ++row) {
      for (int d = 0; d < 512; ++d) r.set(row * 512 + d, out.get(row * out_dim() + d));
    }
    return r;
  }
  HostTensor lse_rows() const {
    HostTensor r(DType::kFP32, {spec.batch, spec.q_len, spec.num_heads});
    const int h = spec.num_heads;
    for (std::int64_t row = 0; row < r.numel(); ++row) {
      r.data<float>()[row] = lse.data<float>()[(row / h) * lse_row() + row % h];
    }
    return r;
  }

  // The float64 semantics: one softmax per (request, query, head) over the counted, non -1
  // entries of both caches (duplicates count each time).
  MlaExpected brute_force() const {
    const Model1Spec& s = spec;
    const long double scale = s.softmax_scale != 0.f ? s.softmax_scale : 1.0L / std::sqrt(512.0L);
    MlaExpected e;
    const std::int64_t rows = static_cast<std::int64_t>(s.batch) * s.q_len * s.num_heads;
    e.out.assign(static_cast<std::size_t>(rows) * 512, 0.0L);
    e.lse.assign(static_cast<std::size_t>(rows), -kInf);
    for (int b = 0; b < s.batch; ++b) {
      for (int i = 0; i < s.q_len; ++i) {
        std::vector<std::vector<long double>> keys;
        for (int k = 0; k < lens[b]; ++k) {
          if (id_at(false, b, i, k) != -1) keys.push_back(model1_token(kv, id_at(false, b, i, k)));
        }
        for (int k = 0; s.extra_topk > 0 && k < extra_lens[b]; ++k) {
          if (id_at(true, b, i, k) != -1) keys.push_back(model1_token(extra, id_at(true, b, i, k)));
        }
        for (int h = 0; h < s.num_heads; ++h) {
          const std::int64_t row = (static_cast<std::int64_t>(b) * s.q_len + i) * s.num_heads + h;
          std::vector<float> qv(512);
          for (int d = 0; d < 512; ++d) qv[d] = q_at(b, i, h, d);
          mla_softmax_row(qv, keys, scale, s.attn_sink ? attn_sink.data<float>() + h : nullptr,
                          &e.out[row * 512], &e.lse[row]);
        }
      }
    }
    return e;
  }
};

// bf16 values whose tiles differ in magnitude (so the 7 scales differ), packed into a pool of
// `stride`-byte blocks first filled with 0xFF; the pad bytes are poisoned again after packing.
inline Model1Pool make_model1_pool(int page_size, int blocks, int block_pad, std::mt19937_64& rng) {
  Model1Pool p;
  p.page_size = page_size;
  p.blocks = blocks;
  p.stride = static_cast<std::int64_t>(mla_model1_page_bytes(page_size)) + block_pad;
  p.storage.assign(static_cast<std::size_t>((p.stride * blocks + 7) / 8 + 2), ~std::uint64_t{0});
  p.view = make_tensor(p.base(), DType::kUINT8, {blocks, page_size, 1, 584},
                       {p.stride, 584, 584, 1});
  HostTensor plain(DType::kBF16, {blocks, page_size, 1, 512});
  std::normal_distribution<float> n(0.f, 1.f);
  for (std::int64_t t = 0; t < plain.numel() / 512; ++t) {
    for (int d = 0; d < 512; ++d) {
      const float mag = d < 448 ? std::ldexp(1.f, (d / 64) - 3) : 0.5f;
      plain.set(t * 512 + d, n(rng) * mag);
    }
  }
  pack_mla_fp8(plain.view(), p.view, MlaCacheFormat::kModel1);
  for (int id = 0; id < p.tokens(); ++id) const_cast<std::uint8_t*>(p.scales(id))[7] = 0xFF;
  return p;
}

// Tokens no counted entry selects: row and scales set to 0xFF.
inline void poison_unselected(Model1Pool& pool, const std::set<int>& used) {
  for (int id = 0; id < pool.tokens(); ++id) {
    if (used.count(id)) continue;
    std::memset(const_cast<std::uint8_t*>(pool.row(id)), 0xFF, 576);
    std::memset(const_cast<std::uint8_t*>(pool.scales(id)), 0xFF, 8);
  }
}

// Indices of one cache: `topk` entries per (request, query) in rows of `row` int32, the first
// lens[b] counted (ids of the pool, -1 holes, duplicates), the rest ids far outside the pool or
// of unselected tokens.
inline std::set<int> fill_model1_indices(HostTensor& t, const Model1Spec& s, int topk, int row,
                                         int tokens, const std::vector<int>& lens,
                                         std::mt19937_64& rng) {
  std::set<int> used;
  std::uniform_int_distribution<int> pick(0, tokens - 1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  auto* d = t.data<std::int32_t>();
  for (std::int64_t n = 0; n < t.numel(); ++n) d[n] = 1 << 30;
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      std::int32_t* r = d + (static_cast<std::int64_t>(b) * s.q_len + i) * row;
      for (int k = 0; k < topk; ++k) {
        if (k >= lens[b]) { r[k] = (k % 2) ? 1 << 30 : -7; continue; }
        r[k] = u(rng) < s.skip ? -1 : pick(rng);
      }
      for (int j = 0; j < s.duplicates && lens[b] > 1; ++j) {
        const int k = 1 + static_cast<int>(rng() % static_cast<unsigned>(lens[b] - 1));
        r[k] = r[rng() % static_cast<unsigned>(k)];
      }
      if (s.all_invalid_row && b == 0 && i == 0) std::fill(r, r + lens[b], -1);
      for (int k = 0; k < lens[b]; ++k) if (r[k] >= 0) used.insert(r[k]);
    }
  }
  // Every other entry past a length names a token no counted entry selects (poisoned by the
  // caller), where the pool has one: read by mistake it shows as NaN, where an id outside the
  // pool would be skipped by the GPU kernels as well. Chosen without drawing from rng.
  std::vector<int> unused;
  for (int id = 0; id < tokens; ++id) if (!used.count(id)) unused.push_back(id);
  if (unused.empty()) return used;
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      std::int32_t* r = d + (static_cast<std::int64_t>(b) * s.q_len + i) * row;
      for (int k = lens[b]; k < topk; k += 2) r[k] = unused[static_cast<std::size_t>(b + 3 * i + k) % unused.size()];
    }
  }
  return used;
}

inline std::vector<int> model1_lengths(const Model1Spec& s, int topk, bool ragged,
                                       std::mt19937_64& rng) {
  std::vector<int> lens(static_cast<std::size_t>(s.batch), topk);
  if (!ragged) return lens;
  for (int b = 0; b < s.batch; ++b) lens[b] = static_cast<int>(rng() % static_cast<unsigned>(topk + 1));
  lens[0] = 0;  // an empty selection in this cache
  if (s.batch > 1) lens[s.batch - 1] = topk;
  return lens;
}

// The plan config of a spec's case (the smallest maxima its call needs).
inline MlaConfig model1_config(const Model1Spec& s) {
  MlaConfig cfg;
  cfg.num_heads = s.num_heads;
  cfg.page_size = s.page_size;
  cfg.sparse = true;
  cfg.kv_format = MlaCacheFormat::kModel1;
  cfg.max_batch = std::max(s.batch, 1);
  cfg.max_q_len = s.q_len;
  cfg.topk = s.topk;
  cfg.lse = s.lse;
  cfg.attn_sink = s.attn_sink;
  cfg.topk_length = s.topk_length;
  cfg.extra_topk = s.extra_topk;
  cfg.extra_page_size = s.extra_page_size;
  cfg.extra_topk_length = s.extra_topk_length;
  return cfg;
}

inline Model1Case build_model1_case(const Model1Spec& s, std::mt19937_64& rng) {
  Model1Case c;
  c.spec = s;
  c.config = model1_config(s);

  c.kv = make_model1_pool(s.page_size, s.blocks, s.block_pad, rng);
  c.lens = model1_lengths(s, s.topk, s.topk_length, rng);
  const int row = c.idx_row(s.topk);
  c.indices = HostTensor(DType::kINT32, {s.batch, s.q_len, row});
  poison_unselected(c.kv, fill_model1_indices(c.indices, s, s.topk, row, c.kv.tokens(), c.lens, rng));
  MlaSparseArgs& a = c.args;
  a.kv_cache = c.kv.view;
  a.indices = model1_view(c.indices, {s.batch, s.q_len, s.topk}, {s.q_len * row, row, 1});
  if (s.topk_length) {
    c.topk_length = HostTensor(DType::kINT32, {s.batch});
    for (int b = 0; b < s.batch; ++b) c.topk_length.data<std::int32_t>()[b] = c.lens[b];
    a.topk_length = c.topk_length.view();
  }
  if (s.extra_topk > 0) {
    c.extra = make_model1_pool(s.extra_page_size, s.extra_blocks, s.block_pad, rng);
    c.extra_lens = model1_lengths(s, s.extra_topk, s.extra_topk_length, rng);
    if (s.extra_topk_length && s.batch > 1 && s.topk_length) std::swap(c.extra_lens[0], c.extra_lens[1]);
    const int erow = c.idx_row(s.extra_topk);
    c.extra_indices = HostTensor(DType::kINT32, {s.batch, s.q_len, erow});
    poison_unselected(c.extra, fill_model1_indices(c.extra_indices, s, s.extra_topk, erow,
                                                   c.extra.tokens(), c.extra_lens, rng));
    a.extra_kv_cache = c.extra.view;
    a.extra_indices =
        model1_view(c.extra_indices, {s.batch, s.q_len, s.extra_topk}, {s.q_len * erow, erow, 1});
    if (s.extra_topk_length) {
      c.extra_topk_length = HostTensor(DType::kINT32, {s.batch});
      for (int b = 0; b < s.batch; ++b) c.extra_topk_length.data<std::int32_t>()[b] = c.extra_lens[b];
      a.extra_topk_length = c.extra_topk_length.view();
    }
  }

  const std::int64_t hq = c.q_dim(), ho = c.out_dim(), hl = c.lse_row(), h = s.num_heads;
  c.q = HostTensor(DType::kBF16, {s.batch, s.q_len, h, hq});
  std::normal_distribution<float> n(0.f, 1.f);
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, n(rng));
  a.q = model1_view(c.q, {s.batch, s.q_len, h, 512}, {s.q_len * h * hq, h * hq, hq, 1});
  c.out = HostTensor(DType::kBF16, {s.batch, s.q_len, h, ho});
  c.out.fill_bytes(kModel1Poison);
  a.out = model1_view(c.out, {s.batch, s.q_len, h, 512}, {s.q_len * h * ho, h * ho, ho, 1});
  c.lse = HostTensor(DType::kFP32, {s.batch, s.q_len, hl});
  c.lse.fill_bytes(kModel1Poison);
  if (s.lse) a.lse = model1_view(c.lse, {s.batch, s.q_len, h}, {s.q_len * hl, hl, 1});
  if (s.attn_sink) {
    c.attn_sink = HostTensor(DType::kFP32, {s.num_heads});
    std::normal_distribution<float> sink(0.f, 2.f);
    for (int i = 0; i < s.num_heads; ++i) {
      // Some heads at +-inf: +inf zeroes the row, -inf leaves it as without a sink.
      const float v = sink(rng);
      c.attn_sink.data<float>()[i] = i % 7 == 3 ? INFINITY : i % 7 == 5 ? -INFINITY : v;
    }
    a.attn_sink = c.attn_sink.view();
  }
  a.softmax_scale = s.softmax_scale;
  return c;
}

}  // namespace deca::test
