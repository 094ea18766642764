// Random MLA decode cases in host buffers with MlaDenseParams / MlaSparseParams filled to point
// at them. Dense: a latent cache [blocks, page_size, 1, row] in one of the three formats (bf16;
// e4m3 with one scale; the 656-byte token), blocks shuffled, unused slots NaN, and per request the
// real values each token holds (decoded here from the stored bytes by the formats' definitions,
// for brute-force checks). Sparse: a pool of tokens packed by deca::pack_mla_fp8 into 656-byte
// records, top-k indices with -1 holes and duplicates, optional topk_length and attn_sink; the
// edges a test may add on top (an index in the pool's last slot, a row of -1 only, an empty
// request, never-indexed tokens poisoned) and the plan config of a sparse case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "common/contiguous_params.hpp"
#include "common/host_tensor.hpp"
#include "deca/mla.hpp"
#include "deca/quant.hpp"
#include "kernels/mla/params.cuh"

namespace deca::test {

inline constexpr int kMlaQk = 576;
inline constexpr int kMlaV = 512;
inline constexpr int kMlaTokenBytes = 656;

struct MlaCaseSpec {
  int batch = 2;
  int q_len = 1;
  int num_heads = 16;
  int page_size = 64;
  std::vector<int> seq_lens;  // dense: per request; empty: max_len each
  int max_len = 100;
  int kv_format = kMlaKvBF16;  // dense: MlaKvFormat
  float kv_scale = 0.f;        // dense kMlaKvFP8E4M3: 0 = quantize_mla_fp8_e4m3's power of two
  bool lse = true;
  float softmax_scale = 0.f;  // 0: 1 / sqrt(576)
  int spare_blocks = 2;
  // Sparse only.
  int pool_blocks = 4;        // tokens in the pool: pool_blocks * page_size
  int topk = 32;
  float skip_fraction = 0.15f;  // share of -1 indices
  int duplicates = 2;         // per (request, token) row, ids repeated from earlier entries
  bool topk_length = false;
  bool attn_sink = false;
  int lse_empty = kMlaLseEmptyNegInf;  // MlaLseEmpty: params.lse_empty, config.lse_of_empty_row
  // The GPU plan's max_batch (0: batch). A larger one leaves the schedule of a run as it is but
  // keeps the plan on the warp-per-row combine (src/plan/mla_combine.hpp).
  int max_batch = 0;
};

inline float mla_default_scale(float s) { return s != 0.f ? s : 1.f / std::sqrt(576.f); }

// The params fields dense and sparse cases share: sizes, q, out, lse, the scale, and the cache strides (rows of `row` elements of the cache's own dtype). The cache
// pointer is the caller's: its type differs.
template <class Params>
void bind_mla_common(Params& p, const MlaCaseSpec& s, HostTensor& q, const HostTensor& kv,
                     int row, HostTensor& out, HostTensor& lse) {
  p.batch = s.batch, p.q_len = s.q_len, p.num_heads = s.num_heads, p.page_size = s.page_size;
  p.num_blocks = static_cast<int>(kv.shape()[0]);
  bind_contiguous_q_out_lse(p, s.num_heads, s.q_len, q, kMlaQk, out, kMlaV, lse, s.lse);
  p.kv_stride_slot = row;
  p.kv_stride_block = static_cast<std::int64_t>(row) * s.page_size;
  p.softmax_scale = mla_default_scale(s.softmax_scale);
  p.lse_empty = s.lse_empty;
}

// The real value of an e4m3 element under one cache scale, as docs/semantics.md defines it: the product
// in fp32, rounded to bf16.
inline float mla_e4m3_real(std::uint8_t code, float scale) {
  return bf16_to_float(float_to_bf16(fp8e4m3_to_float(code) * scale));
}

// The 576 real values of a 656-byte token: e4m3 times its group's fp32 scale (one per 128), and
// the 64 bf16 RoPE values.
inline void mla_decode_token(const std::uint8_t* rec, float* row) {
  for (int d = 0; d < kMlaV; ++d) {
    float scale;
    std::memcpy(&scale, rec + kMlaV + 4 * (d / 128), 4);
    row[d] = bf16_to_float(float_to_bf16(fp8e4m3_to_float(rec[d]) * scale));
  }
  for (int r = 0; r < 64; ++r) {
    std::uint16_t bits;
    std::memcpy(&bits, rec + kMlaV + 16 + 2 * r, 2);
    row[kMlaV + r] = bf16_to_float(bits);
  }
}

inline int mla_dense_row(int kv_format) {
  return kv_format == kMlaKvFP8Sparse ? kMlaTokenBytes : kMlaQk;
}

struct MlaDenseCase {
  MlaCaseSpec spec;
  std::vector<int> lens;
  HostTensor q, kv, block_table, seq_lens, out, lse;
  float kv_scale = 1.f;                        // kMlaKvFP8E4M3: the cache's scale
  std::vector<std::vector<float>> kv_logical;  // [b][len * 576]: each token's real values
  MlaDenseParams params{};

  MlaDenseCase() = default;
  MlaDenseCase(const MlaDenseCase&) = delete;
  MlaDenseCase(MlaDenseCase&&) = default;

  void bind() {
    const auto& s = spec;
    auto& p = params;
    p = MlaDenseParams{};
    bind_mla_common(p, s, q, kv, mla_dense_row(s.kv_format), out, lse);
    p.max_blocks = static_cast<int>(block_table.shape()[1]);
    p.kv = kv.raw();
    p.kv_format = s.kv_format;
    p.kv_scale = s.kv_format == kMlaKvFP8E4M3 ? kv_scale : 1.f;
    p.block_table = block_table.data<int>();
    p.block_table_stride = block_table.shape()[1];
    p.seq_lens = seq_lens.data<int>();
  }
};

// The bf16 source values in a cache of `blocks` blocks stored as `format` (zeros where no request
// has a token, poisoned after); returns the stored cache and sets `scale` (kMlaKvFP8E4M3).
inline HostTensor mla_store_dense(const HostTensor& src, const MlaCaseSpec& s, float& scale) {
  const std::int64_t blocks = src.shape()[0];
  scale = 1.f;
  if (s.kv_format == kMlaKvFP8E4M3) {
    HostTensor kv(DType::kFP8E4M3, {blocks, s.page_size, 1, kMlaQk});
    if (s.kv_scale > 0.f) {
      scale = s.kv_scale;
      quantize_fp8(src.view(), kv.view(), scale);
    } else {
      scale = quantize_mla_fp8_e4m3(src.view(), kv.view());
    }
    return kv;
  }
  if (s.kv_format == kMlaKvFP8Sparse) {
    HostTensor kv(DType::kUINT8, {blocks, s.page_size, 1, kMlaTokenBytes});
    pack_mla_fp8(src.view(), kv.view());
    return kv;
  }
  return HostTensor(src);
}

inline MlaDenseCase build_mla_dense_case(const MlaCaseSpec& spec, std::mt19937_64& rng) {
  MlaDenseCase c;
  c.spec = spec;
  const auto& s = c.spec;
  std::normal_distribution<float> normal(0.f, 1.f);
  c.lens = s.seq_lens.empty() ? std::vector<int>(s.batch, s.max_len) : s.seq_lens;
  int max_needed = 0, total = 0;
  for (int l : c.lens) {
    const int n = (l + s.page_size - 1) / s.page_size;
    max_needed = std::max(max_needed, n);
    total += n;
  }
  const int blocks = total + s.spare_blocks;
  std::vector<int> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  c.block_table = HostTensor(DType::kINT32, {s.batch, max_needed + 1});
  std::fill_n(c.block_table.data<int>(), c.block_table.numel(), 0x3FFFFFFF);
  c.seq_lens = HostTensor(DType::kINT32, {s.batch});
  std::copy(c.lens.begin(), c.lens.end(), c.seq_lens.data<int>());
  c.q = HostTensor(DType::kBF16, {s.batch, s.q_len, s.num_heads, kMlaQk});
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, normal(rng));
  // The source values in bf16, zero where no token lives; `used` marks the slots tokens fill.
  HostTensor src(DType::kBF16, {blocks, s.page_size, 1, kMlaQk});
  std::vector<char> used(static_cast<std::size_t>(blocks) * s.page_size, 0);
  const std::int64_t cols = c.block_table.shape()[1];
  auto slot_of = [&](int b, int t) {
    return std::int64_t{c.block_table.data<int>()[b * cols + t / s.page_size]} * s.page_size +
           t % s.page_size;
  };
  int next = 0;
  for (int b = 0; b < s.batch; ++b) {
    const int n = (c.lens[b] + s.page_size - 1) / s.page_size;
    for (int j = 0; j < n; ++j) c.block_table.data<int>()[b * cols + j] = order[next++];
    for (int t = 0; t < c.lens[b]; ++t) {
      const std::int64_t slot = slot_of(b, t);
      used[slot] = 1;
      for (int d = 0; d < kMlaQk; ++d) {
        // The 656-byte token's four groups at different magnitudes, so that their scales differ.
        const bool grouped = s.kv_format == kMlaKvFP8Sparse && d < kMlaV;
        const float m = grouped ? std::ldexp(1.f, (d / 128 + t) % 4 - 1) : 1.f;
        src.set(slot * kMlaQk + d, m * normal(rng));
      }
    }
  }
  c.kv = mla_store_dense(src, s, c.kv_scale);
  // NaN in every slot no request owns (0xFF: NaN in bf16 and e4m3, and in the token's scales).
  const std::size_t row_bytes = c.kv.bytes() / used.size();
  for (std::size_t slot = 0; slot < used.size(); ++slot) {
    if (!used[slot]) {
      std::memset(static_cast<char*>(c.kv.raw()) + slot * row_bytes, 0xFF, row_bytes);
    }
  }
  // Each token's real values, decoded from the stored bytes.
  c.kv_logical.resize(s.batch);
  for (int b = 0; b < s.batch; ++b) {
    c.kv_logical[b].resize(static_cast<std::size_t>(c.lens[b]) * kMlaQk);
    for (int t = 0; t < c.lens[b]; ++t) {
      const std::int64_t slot = slot_of(b, t);
      float* row = c.kv_logical[b].data() + static_cast<std::size_t>(t) * kMlaQk;
      const auto* bytes = static_cast<const std::uint8_t*>(c.kv.raw()) + slot * row_bytes;
      if (s.kv_format == kMlaKvFP8Sparse) {
        mla_decode_token(bytes, row);
      } else {
        for (int d = 0; d < kMlaQk; ++d) {
          row[d] = s.kv_format == kMlaKvFP8E4M3 ? mla_e4m3_real(bytes[d], c.kv_scale)
                                                : c.kv.get(slot * kMlaQk + d);
        }
      }
    }
  }
  c.out = HostTensor(DType::kBF16, {s.batch, s.q_len, s.num_heads, kMlaV});
  c.lse = HostTensor(DType::kFP32, {s.batch, s.q_len, s.num_heads});
  c.out.fill_bytes(0xFF);
  c.lse.fill_bytes(0xFF);
  c.bind();
  return c;
}

struct MlaSparseCase {
  MlaCaseSpec spec;
  HostTensor q, tokens, kv, indices, topk_length, attn_sink, out, lse;  // tokens: bf16 source
  MlaSparseParams params{};

  MlaSparseCase() = default;
  MlaSparseCase(const MlaSparseCase&) = delete;
  MlaSparseCase(MlaSparseCase&&) = default;

  void bind() {
    const auto& s = spec;
    auto& p = params;
    p = MlaSparseParams{};
    bind_mla_common(p, s, q, kv, kMlaTokenBytes, out, lse);
    p.topk = s.topk;
    p.kv = kv.data<unsigned char>();
    p.indices = indices.data<int>();
    p.indices_stride_token = s.topk;
    p.indices_stride_batch = static_cast<std::int64_t>(s.topk) * s.q_len;
    p.topk_length = s.topk_length ? topk_length.data<int>() : nullptr;
    p.attn_sink = s.attn_sink ? attn_sink.data<float>() : nullptr;
  }
};

inline MlaSparseCase build_mla_sparse_case(const MlaCaseSpec& spec, std::mt19937_64& rng) {
  MlaSparseCase c;
  c.spec = spec;
  const auto& s = c.spec;
  std::normal_distribution<float> normal(0.f, 1.f);
  const int pool = s.pool_blocks * s.page_size;
  c.q = HostTensor(DType::kBF16, {s.batch, s.q_len, s.num_heads, kMlaQk});
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, normal(rng));
  // Groups of different magnitudes so that the four scales differ.
  c.tokens = HostTensor(DType::kBF16, {s.pool_blocks, s.page_size, 1, kMlaQk});
  for (int t = 0; t < pool; ++t) {
    for (int d = 0; d < kMlaQk; ++d) {
      const float m = d < kMlaV ? std::ldexp(1.f, (d / 128 + t) % 4 - 1) : 1.f;
      c.tokens.set(static_cast<std::int64_t>(t) * kMlaQk + d, m * normal(rng));
    }
  }
  c.kv = HostTensor(DType::kUINT8, {s.pool_blocks, s.page_size, 1, kMlaTokenBytes});
  pack_mla_fp8(c.tokens.view(), c.kv.view());

  c.indices = HostTensor(DType::kINT32, {s.batch, s.q_len, s.topk});
  std::uniform_int_distribution<int> any(0, pool - 1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int r = 0; r < s.batch * s.q_len; ++r) {
    int* row = c.indices.data<int>() + static_cast<std::int64_t>(r) * s.topk;
    for (int k = 0; k < s.topk; ++k) row[k] = u(rng) < s.skip_fraction ? -1 : any(rng);
    for (int n = 0; n < s.duplicates && s.topk > 1; ++n) {
      const int k = std::uniform_int_distribution<int>(1, s.topk - 1)(rng);
      row[k] = row[std::uniform_int_distribution<int>(0, k - 1)(rng)];
    }
  }
  c.topk_length = HostTensor(DType::kINT32, {s.batch});
  for (int b = 0; b < s.batch; ++b) {
    c.topk_length.data<int>()[b] = std::uniform_int_distribution<int>(0, s.topk)(rng);
  }
  c.attn_sink = HostTensor(DType::kFP32, {s.num_heads});
  for (int h = 0; h < s.num_heads; ++h) c.attn_sink.data<float>()[h] = 1.5f * normal(rng);
  c.out = HostTensor(DType::kBF16, {s.batch, s.q_len, s.num_heads, kMlaV});
  c.lse = HostTensor(DType::kFP32, {s.batch, s.q_len, s.num_heads});
  c.out.fill_bytes(0xFF);
  c.lse.fill_bytes(0xFF);
  c.bind();
  return c;
}

struct SparseEdges {
  bool rows_of_skips = true;  // request 1 (if any), token 0: every index -1
  bool empty_request = true;  // topk_length: the last request gets 0
  bool poison = true;         // never-indexed tokens and one spare block all 0xFF (NaN)
};

// Applies the edges to a built case and rebinds it; the reference then runs on exactly this data.
inline void add_sparse_edges(MlaSparseCase& c, const SparseEdges& e) {
  auto& s = c.spec;
  const int pool = s.pool_blocks * s.page_size;
  int* idx = c.indices.data<int>();
  auto row = [&](int b, int i) { return idx + (static_cast<std::int64_t>(b) * s.q_len + i) * s.topk; };
  auto len = [&](int b) { return s.topk_length ? c.topk_length.data<int>()[b] : s.topk; };
  if (s.topk_length && s.batch > 1 && e.empty_request) c.topk_length.data<int>()[s.batch - 1] = 0;
  if (s.topk_length) c.topk_length.data<int>()[0] = std::max(1, c.topk_length.data<int>()[0]);
  for (int i = 0; i < s.q_len; ++i) row(0, i)[0] = pool - 1;  // the last slot of the last page
  if (e.rows_of_skips && s.batch > 1) {
    for (int k = 0; k < s.topk; ++k) row(1, 0)[k] = -1;
  }
  if (!e.poison) {
    c.bind();
    return;
  }
  std::set<int> used;
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      for (int k = 0; k < len(b); ++k) {
        if (row(b, i)[k] >= 0) used.insert(row(b, i)[k]);
      }
    }
  }
  // A spare block in front, then the pool with every token no counted index names poisoned; the
  // ids move up by one page.
  HostTensor kv(DType::kUINT8, {s.pool_blocks + 1, s.page_size, 1, kMlaTokenBytes});
  kv.fill_bytes(0xFF);
  for (int t = 0; t < pool; ++t) {
    if (!used.count(t)) continue;
    std::memcpy(kv.data<unsigned char>() + static_cast<std::size_t>(t + s.page_size) * kMlaTokenBytes,
                c.kv.data<unsigned char>() + static_cast<std::size_t>(t) * kMlaTokenBytes,
                kMlaTokenBytes);
  }
  for (std::int64_t n = 0; n < c.indices.numel(); ++n) {
    if (idx[n] >= 0) idx[n] += s.page_size;
  }
  c.kv = std::move(kv);
  s.pool_blocks += 1;
  c.bind();
}

inline MlaConfig sparse_config(const MlaCaseSpec& s, Device device) {
  return MlaConfig{.num_heads = s.num_heads,
                   .page_size = s.page_size,
                   .sparse = true,
                   .max_batch = s.max_batch > 0 ? s.max_batch : s.batch,
                   .max_q_len = s.q_len,
                   .topk = s.topk,
                   .lse = s.lse,
                   .lse_of_empty_row = static_cast<MlaLseOfEmptyRow>(s.lse_empty),
                   .attn_sink = s.attn_sink,
                   .topk_length = s.topk_length,
                   .device = device};
}

}  // namespace deca::test
