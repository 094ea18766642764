// MLA MODEL1 sparse decode cases for the GPU tests (DeepSeek V4's 584-byte token, two caches),
// built byte by byte from the format (kernels/mla/params.cuh, kMlaKvModel1), with a float64
// reference written from the semantics alone: K = the 448 e4m3 values times 2^(scale byte - 127)
// per tile of 64 (the product rounded to bf16), then the 64 bf16 RoPE values; V = the same 512
// values; logits = softmax_scale * q . K; the selected tokens of both caches (the first
// topk_length / extra_topk_length entries, -1 and ids outside a pool skipped, duplicates counted
// each time) join one softmax; the sink adds exp(sink) to the denominator only; a row without
// keys is zeros with LSE -inf. Every byte no counted entry's token owns (unused slots, the
// scales' pad byte, the page's padding) is 0xFF: NaN in e4m3, bf16 and e8m0. Each cache's last
// block is such poison only: entries past a request's length name its tokens (in the pool, so a
// kernel that read past the length would meet NaN rather than skip an id outside the pool). In
// its own namespace: the API and CPU tests have MODEL1 case builders of their own, and a test
// binary may link both.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/host_tensor.hpp"
#include "deca/quant.hpp"
#include "kernels/mla/params.cuh"

namespace deca::test::model1_gpu {

inline constexpr int kM1Dim = 512;
inline constexpr int kM1Nope = 448;
inline constexpr int kM1RowBytes = 576;

struct Model1Spec {
  int batch = 3;
  int q_len = 1;
  int num_heads = 8;
  int topk = 128;
  int page_size = 64;
  int pool_blocks = 8;  // blocks counted entries pick from (the cache has one more: poison)
  int extra_topk = 256;  // 0: no extra cache
  int extra_page_size = 64;
  int extra_pool_blocks = 8;
  bool topk_length = false;
  bool extra_topk_length = false;
  bool attn_sink = false;
  bool lse = true;
  long long stride_pad = 0;  // bytes past roundup(page * 584, 576) per block (a strided view)
  float softmax_scale = 0.f;  // 0: 1 / sqrt(512)
  float scale() const { return softmax_scale != 0.f ? softmax_scale : 1.f / std::sqrt(512.f); }
};

// One cache: [blocks][stride bytes]; rows at slot * 576, scales at page * 576 + slot * 8.
struct Model1Cache {
  int page_size = 0;
  int blocks = 0;
  long long stride = 0;
  std::vector<std::uint8_t> bytes;

  Model1Cache(int page, int num_blocks, long long pad) : page_size(page), blocks(num_blocks) {
    stride = (static_cast<long long>(page) * 584 + kM1RowBytes - 1) / kM1RowBytes * kM1RowBytes + pad;
    bytes.assign(static_cast<std::size_t>(stride * num_blocks), 0xFF);
  }
  Model1Cache() = default;
  long long pool() const { return static_cast<long long>(blocks) * page_size; }
  // The tokens counted entries pick from: all but the last block (never written).
  long long selectable() const { return pool() - page_size; }
  std::uint8_t* row(int id) { return bytes.data() + (id / page_size) * stride + (id % page_size) * kM1RowBytes; }
  std::uint8_t* scales(int id) {
    return bytes.data() + (id / page_size) * stride + static_cast<long long>(page_size) * kM1RowBytes +
           (id % page_size) * 8;
  }
  // Token id's 512 values as the semantics define them.
  void decode(int id, double* k) {
    const std::uint8_t* r = row(id);
    const std::uint8_t* s = scales(id);
    for (int d = 0; d < kM1Nope; ++d) {
      const float scale = std::ldexp(1.f, static_cast<int>(s[d / 64]) - 127);
      k[d] = bf16_to_float(float_to_bf16(fp8e4m3_to_float(r[d]) * scale));
    }
    for (int d = 0; d < 64; ++d) {
      std::uint16_t bits;
      std::memcpy(&bits, r + kM1Nope + 2 * d, 2);
      k[kM1Nope + d] = bf16_to_float(bits);
    }
  }
  // A random token at id: e4m3 codes of exponent 1..9 (|x| in [2^-6, 7.5]), tile scales 2^-3..2^1,
  // RoPE in [-2, 2]; the pad byte stays 0xFF.
  void write(int id, std::mt19937_64& rng) {
    std::uint8_t* r = row(id);
    for (int d = 0; d < kM1Nope; ++d) {
      const unsigned sign = rng() & 1u, e = 1 + rng() % 9, m = rng() % 8;
      r[d] = static_cast<std::uint8_t>(sign << 7 | e << 3 | m);
    }
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (int d = 0; d < 64; ++d) {
      const std::uint16_t bits = float_to_bf16(u(rng));
      std::memcpy(r + kM1Nope + 2 * d, &bits, 2);
    }
    std::uint8_t* s = scales(id);
    for (int t = 0; t < 7; ++t) s[t] = static_cast<std::uint8_t>(124 + rng() % 5);
  }
};

struct Model1Case {
  Model1Spec spec;
  HostTensor q;  // [batch, q_len, heads, 512] bf16
  Model1Cache kv, extra;
  std::vector<int> indices, extra_indices;  // [batch, q_len, topk] / [.., extra_topk]
  std::vector<int> topk_length, extra_topk_length, written;  // written: ids of kv with a token
  std::vector<int> extra_written;
  std::vector<float> attn_sink;
  HostTensor out, lse;  // the reference's

  int& index(int b, int i, int k) { return indices[(static_cast<std::size_t>(b) * spec.q_len + i) * spec.topk + k]; }
  int& extra_index(int b, int i, int k) {
    return extra_indices[(static_cast<std::size_t>(b) * spec.q_len + i) * spec.extra_topk + k];
  }
  int len(int b) const { return clamp_len(spec.topk_length ? topk_length[b] : spec.topk, spec.topk); }
  int extra_len(int b) const {
    return clamp_len(spec.extra_topk_length ? extra_topk_length[b] : spec.extra_topk, spec.extra_topk);
  }
  static int clamp_len(int v, int cap) { return v < 0 ? 0 : (v > cap ? cap : v); }
  // The entries that count in each [batch x q_len] row of one cache's indices, at the lengths now.
  std::vector<int> row_lens(bool second) const {
    std::vector<int> lens;
    for (int b = 0; b < spec.batch; ++b) {
      for (int i = 0; i < spec.q_len; ++i) lens.push_back(second ? extra_len(b) : len(b));
    }
    return lens;
  }
};

// Index lists for one cache: ids of its selectable tokens, ~6% -1, ~6% duplicates of an earlier
// entry of the row, ~3% outside the pool (just past its end, where the other cache's pool may
// still reach, or negative other than -1: the kernels skip both); entries past a row's length
// name tokens of the poison block.
inline void model1_fill_indices(std::vector<int>& ids, int topk, const Model1Cache& c,
                                const std::vector<int>& lens_per_row, std::mt19937_64& rng) {
  const int rows = static_cast<int>(lens_per_row.size());
  ids.assign(static_cast<std::size_t>(rows) * topk, 0);
  for (int row = 0; row < rows; ++row) {
    int* r = ids.data() + static_cast<std::size_t>(row) * topk;
    for (int k = 0; k < topk; ++k) {
      const unsigned roll = rng() % 100;
      if (k >= lens_per_row[row]) {
        r[k] = static_cast<int>(c.selectable() + static_cast<long long>(rng() % c.page_size));
      } else if (roll < 6) {
        r[k] = -1;
      } else if (roll < 9) {
        r[k] = roll == 6 ? -2 - static_cast<int>(rng() % 5)
                         : static_cast<int>(c.pool() + static_cast<long long>(rng() % (4 * c.page_size)));
      } else if (roll < 15 && k > 0) {
        const int earlier = r[rng() % k];
        r[k] = earlier >= 0 ? earlier : 0;
      } else {
        r[k] = static_cast<int>(rng() % c.selectable());
      }
    }
  }
}

// Writes a token at every id a row's counted entries select (the rest stays 0xFF).
inline void model1_write_selected(Model1Cache& c, const std::vector<int>& ids, int topk,
                                  const std::vector<int>& lens_per_row, std::vector<int>& written,
                                  std::mt19937_64& rng) {
  std::vector<char> done(static_cast<std::size_t>(c.pool()), 0);
  for (std::size_t row = 0; row < lens_per_row.size(); ++row) {
    for (int k = 0; k < lens_per_row[row]; ++k) {
      const int id = ids[row * topk + k];
      if (id < 0 || id >= c.pool() || done[id]) continue;
      done[id] = 1;
      c.write(id, rng);
      written.push_back(id);
    }
  }
}

// Counted entries outside their pool become -1, which the reference reads alike (the checked
// kernel reports the former).
inline void model1_outside_to_skip(Model1Case& c) {
  const auto fix = [](std::vector<int>& ids, int topk, long long pool, const std::vector<int>& lens) {
    for (std::size_t row = 0; row < lens.size(); ++row) {
      for (int k = 0; k < lens[row]; ++k) {
        int& id = ids[row * topk + k];
        if (id < -1 || id >= pool) id = -1;
      }
    }
  };
  fix(c.indices, c.spec.topk, c.kv.pool(), c.row_lens(false));
  if (c.spec.extra_topk > 0) fix(c.extra_indices, c.spec.extra_topk, c.extra.pool(), c.row_lens(true));
}

// Tokens for the counted entries of both caches at the case's lengths now.
inline void model1_write_counted(Model1Case& c, std::mt19937_64& rng) {
  model1_write_selected(c.kv, c.indices, c.spec.topk, c.row_lens(false), c.written, rng);
  if (c.spec.extra_topk > 0) {
    model1_write_selected(c.extra, c.extra_indices, c.spec.extra_topk, c.row_lens(true), c.extra_written, rng);
  }
}

inline Model1Case build_model1_case(const Model1Spec& s, std::mt19937_64& rng) {
  Model1Case c;
  c.spec = s;
  c.q = HostTensor(DType::kBF16, {s.batch, s.q_len, s.num_heads, kM1Dim});
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (std::int64_t e = 0; e < c.q.numel(); ++e) c.q.set(e, u(rng));
  c.kv = Model1Cache(s.page_size, s.pool_blocks + 1, s.stride_pad);
  c.extra = Model1Cache(s.extra_page_size, s.extra_pool_blocks + 1, s.stride_pad);
  // Ragged lengths: request 0 has none in the first cache, request 1 none in the extra one.
  c.topk_length.assign(s.batch, s.topk);
  c.extra_topk_length.assign(s.batch, s.extra_topk);
  for (int b = 0; b < s.batch; ++b) {
    if (s.topk_length) c.topk_length[b] = b == 0 ? 0 : static_cast<int>(rng() % (s.topk + 1));
    if (s.extra_topk_length) c.extra_topk_length[b] = b == 1 ? 0 : static_cast<int>(rng() % (s.extra_topk + 1));
  }
  model1_fill_indices(c.indices, s.topk, c.kv, c.row_lens(false), rng);
  if (s.extra_topk > 0) model1_fill_indices(c.extra_indices, s.extra_topk, c.extra, c.row_lens(true), rng);
  model1_write_counted(c, rng);
  c.attn_sink.resize(s.num_heads);
  for (float& v : c.attn_sink) v = 2.f * u(rng);
  c.out = HostTensor(DType::kBF16, {s.batch, s.q_len, s.num_heads, kM1Dim});
  c.lse = HostTensor(DType::kFP32, {s.batch, s.q_len, s.num_heads});
  return c;
}

// Where a case's tensors lie (on the GPU, or the host's own copies).
struct Model1Buffers {
  const void* q;
  const void* kv;
  const void* extra;
  const int* indices;
  const int* extra_indices;
  const int* topk_length;
  const int* extra_topk_length;
  const float* sink;
  void* out;
  float* lse;
};

// The case's call as MlaSparseParams over `b` (contiguous tensors; what the spec leaves out null).
inline MlaSparseParams model1_params(const Model1Case& c, const Model1Buffers& b) {
  const Model1Spec& s = c.spec;
  MlaSparseParams p{};
  p.batch = s.batch;
  p.q_len = s.q_len;
  p.num_heads = s.num_heads;
  p.page_size = s.page_size;
  p.topk = s.topk;
  p.num_blocks = c.kv.blocks;
  p.q = b.q;
  p.q_stride_head = kM1Dim;
  p.q_stride_token = p.q_stride_head * s.num_heads;
  p.q_stride_batch = p.q_stride_token * s.q_len;
  p.kv = static_cast<const unsigned char*>(b.kv);
  p.kv_stride_block = c.kv.stride;
  p.kv_stride_slot = 584;
  p.indices = b.indices;
  p.indices_stride_token = s.topk;
  p.indices_stride_batch = static_cast<long long>(s.topk) * s.q_len;
  p.topk_length = s.topk_length ? b.topk_length : nullptr;
  p.attn_sink = s.attn_sink ? b.sink : nullptr;
  p.out = b.out;
  p.out_stride_head = kM1Dim;
  p.out_stride_token = p.out_stride_head * s.num_heads;
  p.out_stride_batch = p.out_stride_token * s.q_len;
  p.lse = s.lse ? b.lse : nullptr;
  p.lse_stride_head = 1;
  p.lse_stride_token = s.num_heads;
  p.lse_stride_batch = static_cast<long long>(s.num_heads) * s.q_len;
  p.softmax_scale = s.scale();
  p.kv_format = kMlaKvModel1;
  p.extra_topk = s.extra_topk;
  if (s.extra_topk > 0) {
    p.extra_page_size = s.extra_page_size;
    p.extra_num_blocks = c.extra.blocks;
    p.extra_kv = static_cast<const unsigned char*>(b.extra);
    p.extra_kv_stride_block = c.extra.stride;
    p.extra_indices = b.extra_indices;
    p.extra_indices_stride_token = s.extra_topk;
    p.extra_indices_stride_batch = static_cast<long long>(s.extra_topk) * s.q_len;
    p.extra_topk_length = s.extra_topk_length ? b.extra_topk_length : nullptr;
  }
  return p;
}

// The float64 reference into c.out / c.lse (module comment).
inline void model1_reference(Model1Case& c) {
  const Model1Spec& s = c.spec;
  std::vector<double> keys;
  std::vector<double> k(kM1Dim);
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      keys.clear();
      auto take = [&](Model1Cache& cache, const int* row, int len) {
        for (int j = 0; j < len; ++j) {
          if (row[j] < 0 || row[j] >= cache.pool()) continue;
          cache.decode(row[j], k.data());
          keys.insert(keys.end(), k.begin(), k.end());
        }
      };
      take(c.kv, &c.index(b, i, 0), c.len(b));
      if (s.extra_topk > 0) take(c.extra, &c.extra_index(b, i, 0), c.extra_len(b));
      const std::size_t n = keys.size() / kM1Dim;
      for (int h = 0; h < s.num_heads; ++h) {
        const std::int64_t qrow = ((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_heads + h) * kM1Dim;
        std::vector<double> logit(n);
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < kM1Dim; ++d) dot += static_cast<double>(c.q.get(qrow + d)) * keys[j * kM1Dim + d];
          logit[j] = s.scale() * dot;
          m = std::max(m, logit[j]);
        }
        double l = 0;
        std::vector<double> o(kM1Dim, 0.0);
        for (std::size_t j = 0; j < n; ++j) {
          const double p = std::exp(logit[j] - m);
          l += p;
          for (int d = 0; d < kM1Dim; ++d) o[d] += p * keys[j * kM1Dim + d];
        }
        const double denom = n == 0 ? 1.0 : l + (s.attn_sink ? std::exp(c.attn_sink[h] - m) : 0.0);
        for (int d = 0; d < kM1Dim; ++d) c.out.set(qrow + d, n == 0 ? 0.f : static_cast<float>(o[d] / denom));
        c.lse.data<float>()[qrow / kM1Dim] =
            n == 0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(m + std::log(l));
      }
    }
  }
}

}  // namespace deca::test::model1_gpu
