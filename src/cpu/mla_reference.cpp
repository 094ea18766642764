// MLA decode references (docs/semantics.md, "MLA decode"): dense over a paged latent cache
// (bf16, e4m3 with one scale, or the 656-byte FP8 token), and sparse over the 656-byte FP8 token
// format with top-k indices. One latent KV head: K is the whole 576-dim row, V its first 512
// dims. Sparse MODEL1: 512-dim rows in the 584-byte page layout, K = V = the row, and the second
// cache's selected tokens in the same softmax.
//
// Every format is read as bf16 values (the precision the kernels compute in): a key row is
// 576 values exactly representable in bf16, then the arithmetic of attention_core (products
// exact in double, double sums, output rounded once to bf16).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/attention_core.hpp"
#include "cpu/element_io.hpp"
#include "cpu/model1_layout.hpp"
#include "cpu/parallel.hpp"
#include "cpu/reference.hpp"

namespace deca::cpu {

namespace {

constexpr int kDimQK = 576;
constexpr int kDimV = 512;
constexpr int kRope = 64;
constexpr int kGroup = 128;
constexpr int kBf16 = static_cast<int>(DType::kBF16);

double default_scale(float softmax_scale, int dim_qk = kDimQK) {
  return softmax_scale != 0.f ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(dim_qk));
}

void load_q(const void* q, std::int64_t offset, double* dst, int dim_qk = kDimQK) {
  for (int d = 0; d < dim_qk; ++d) dst[d] = load_element(q, kBf16, offset + d);
}

// A gathered key row also provides V: its first 512 dims (all of a MODEL1 row).
void set_key(GatheredKV& kv, int key, const float* row) {
  for (int d = 0; d < kv.dk; ++d) kv.k_at(key, d) = row[d];
  for (int d = 0; d < kDimV; ++d) kv.v_at(key, d) = row[d];
}

// Dequantizes one 656-byte token: e4m3 * its group's scale, rounded to bf16 (the precision the
// kernels compute in; exact for power-of-two scales), and the bf16 RoPE part.
void dequant_token(const unsigned char* token, float* row) {
  const float* fp8 = fp8e4m3_table();
  for (int d = 0; d < kDimV; ++d) {
    float scale;
    std::memcpy(&scale, token + kDimV + 4 * (d / kGroup), 4);
    row[d] = bf16_bits_to_float(float_to_bf16_bits(fp8[token[d]] * scale));
  }
  for (int r = 0; r < kRope; ++r) {
    std::uint16_t bits;
    std::memcpy(&bits, token + kDimV + 16 + 2 * r, 2);
    row[kDimV + r] = bf16_bits_to_float(bits);
  }
}

// Dequantizes token `slot` of a MODEL1 page starting at `page`: e4m3 * its tile's scale, rounded
// to bf16 as dequant_token does, then the bf16 RoPE part. Reads the row's 576 bytes and the 7
// scale bytes, never the pad byte or the page's padding.
void dequant_model1(const unsigned char* page, int page_size, int slot, float* row) {
  const float* fp8 = fp8e4m3_table();
  const unsigned char* r = page + model1_row_offset(slot);
  const unsigned char* sc = page + model1_scale_offset(page_size, slot);
  for (int d = 0; d < kModel1Nope; ++d) {
    const float real = fp8[r[d]] * ue8m0_to_float(sc[d / kModel1Tile]);
    row[d] = bf16_bits_to_float(float_to_bf16_bits(real));
  }
  for (int k = 0; k < kRope; ++k) {
    std::uint16_t bits;
    std::memcpy(&bits, r + kModel1Nope + 2 * k, 2);
    row[kModel1Nope + k] = bf16_bits_to_float(bits);
  }
}

// One dense token at `off` (elements of the stored dtype: bf16 elements, or bytes for the 8-bit
// formats) as the bf16 values the reference computes on:
// - kMlaKvBF16: the stored values.
// - kMlaKvFP8E4M3: e4m3 value * kv_scale, the product rounded to fp32 (nearest even), then to
//   bf16 (nearest even), the sparse token's convention. With a power-of-two kv_scale (what
//   quantize_mla_fp8_e4m3 chooses) both roundings are exact: the value is e4m3 * kv_scale, and a
//   kernel that scales the logits and the output instead of each element gets the same result.
// - kMlaKvFP8Sparse: the 656-byte token, decoded as sparse decode decodes it.
void load_dense_token(const MlaDenseParams& p, std::int64_t off, float* row) {
  if (p.kv_format == kMlaKvFP8Sparse) {
    dequant_token(static_cast<const unsigned char*>(p.kv) + off, row);
  } else if (p.kv_format == kMlaKvFP8E4M3) {
    const float* fp8 = fp8e4m3_table();
    const auto* bytes = static_cast<const unsigned char*>(p.kv) + off;
    for (int d = 0; d < kDimQK; ++d) {
      const float real = fp8[bytes[d]] * p.kv_scale;  // one fp32 rounding
      row[d] = bf16_bits_to_float(float_to_bf16_bits(real));
    }
  } else {
    for (int d = 0; d < kDimQK; ++d) row[d] = load_element(p.kv, kBf16, off + d);
  }
}

// The final LSE of a row (MlaSparseParams::lse_empty): a row without a valid key has the log of
// an empty sum, -inf, which the +inf convention (FlashMLA's) replaces.
float final_lse(double lse, int lse_empty) {
  if (lse_empty == kMlaLseEmptyPosInf && lse == -std::numeric_limits<double>::infinity()) {
    return std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(lse);
}

}  // namespace

void mla_dense_decode(const MlaDenseParams& p) {
  RowMath math;
  math.logit_scale = default_scale(p.softmax_scale);
  GatheredKV kv;
  std::vector<float> row(kDimQK);
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.seq_lens[b];
    kv.resize(len, kDimQK, kDimV);
    const int* blocks = p.block_table + static_cast<std::int64_t>(b) * p.block_table_stride;
    for (int t = 0; t < len; ++t) {
      const std::int64_t off =
          blocks[t / p.page_size] * p.kv_stride_block + (t % p.page_size) * p.kv_stride_slot;
      load_dense_token(p, off, row.data());
      set_key(kv, t, row.data());
    }
    parallel_for(static_cast<std::int64_t>(p.q_len) * p.num_heads, [&](std::int64_t item, int) {
      const int i = static_cast<int>(item / p.num_heads);
      const int h = static_cast<int>(item % p.num_heads);
      // Causal: the query at pos sees keys t <= pos; none when pos < 0 (an empty request).
      const int pos = len - p.q_len + i;
      std::vector<double> q(kDimQK), out(kDimV), scratch;
      load_q(p.q, b * p.q_stride_batch + i * p.q_stride_token + h * p.q_stride_head, q.data());
      double lse;
      attend_row(q.data(), kv, 0, pos + 1, nullptr, math, out.data(), &lse, scratch);
      const std::int64_t oo = b * p.out_stride_batch + i * p.out_stride_token + h * p.out_stride_head;
      for (int d = 0; d < kDimV; ++d) store_element(p.out, kBf16, oo + d, out[d]);
      if (p.lse) {
        p.lse[b * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] =
            final_lse(lse, p.lse_empty);
      }
    });
  }
}

namespace {

// One cache's selection for a query row: its tokens and where they live.
struct Selection {
  const unsigned char* kv;
  long long stride_block;
  long long stride_slot;  // V3.2 only: MODEL1 rows are at slot * 576
  int page_size;
  const int* ids;  // this row's indices
  int count;       // entries that count (topk_length clamp applied by the caller)
};

int valid_keys(const Selection& s) {
  int keys = 0;
  for (int k = 0; k < s.count; ++k) keys += s.ids[k] >= 0;
  return keys;
}

// Every listed id is a key, duplicates included; -1 entries are skipped.
void gather(const Selection& s, bool model1, GatheredKV& kv, int& key, float* row) {
  for (int k = 0; k < s.count; ++k) {
    const int id = s.ids[k];
    if (id < 0) continue;
    const unsigned char* block =
        s.kv + static_cast<std::int64_t>(id / s.page_size) * s.stride_block;
    if (model1) {
      dequant_model1(block, s.page_size, id % s.page_size, row);
    } else {
      dequant_token(block + static_cast<std::int64_t>(id % s.page_size) * s.stride_slot, row);
    }
    set_key(kv, key++, row);
  }
}

}  // namespace

void mla_sparse_decode(const MlaSparseParams& p) {
  const bool model1 = p.kv_format == kMlaKvModel1;
  const int dim_qk = model1 ? kDimV : kDimQK;
  const double scale = default_scale(p.softmax_scale, dim_qk);
  const bool extra = model1 && p.extra_topk > 0;
  GatheredKV kv;
  std::vector<float> row(kDimQK);
  for (int b = 0; b < p.batch; ++b) {
    const int count = p.topk_length ? p.topk_length[b] : p.topk;
    int extra_count = 0;
    if (extra) extra_count = p.extra_topk_length ? p.extra_topk_length[b] : p.extra_topk;
    for (int i = 0; i < p.q_len; ++i) {
      const Selection first{p.kv, p.kv_stride_block, p.kv_stride_slot, p.page_size,
                            p.indices + b * p.indices_stride_batch + i * p.indices_stride_token,
                            count};
      Selection second{};
      if (extra) {
        second = {p.extra_kv, p.extra_kv_stride_block, 0, p.extra_page_size,
                  p.extra_indices + b * p.extra_indices_stride_batch +
                      i * p.extra_indices_stride_token,
                  extra_count};
      }
      // One softmax over the keys of both caches.
      const int keys = valid_keys(first) + valid_keys(second);
      kv.resize(keys, dim_qk, kDimV);
      int key = 0;
      gather(first, model1, kv, key, row.data());
      gather(second, model1, kv, key, row.data());
      parallel_for(p.num_heads, [&](std::int64_t item, int) {
        const int h = static_cast<int>(item);
        RowMath math;
        math.logit_scale = scale;
        math.has_sink = p.attn_sink != nullptr;
        math.sink = p.attn_sink ? p.attn_sink[h] : 0.0;
        std::vector<double> q(dim_qk), out(kDimV), scratch;
        load_q(p.q, b * p.q_stride_batch + i * p.q_stride_token + h * p.q_stride_head, q.data(),
               dim_qk);
        double lse;
        attend_row(q.data(), kv, 0, keys, nullptr, math, out.data(), &lse, scratch);
        const std::int64_t oo =
            b * p.out_stride_batch + i * p.out_stride_token + h * p.out_stride_head;
        for (int d = 0; d < kDimV; ++d) store_element(p.out, kBf16, oo + d, out[d]);
        if (p.lse) {
          p.lse[b * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] =
              final_lse(lse, p.lse_empty);
        }
      });
    }
  }
}

}  // namespace deca::cpu
