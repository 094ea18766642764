// GQA decode reference (docs/semantics.md). Work item = (request, KV head): its keys and
// values are gathered from the pages once, then every query token and every q head of the group
// attends to them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/attention_core.hpp"
#include "cpu/element_io.hpp"
#include "cpu/parallel.hpp"
#include "cpu/reference.hpp"
#include "cpu/skip_softmax.hpp"

namespace deca::cpu {

namespace {

// Decodes one stored element to float (exact).
template <DType kDtype>
float decode(const void* base, std::int64_t offset) {
  return load_element(base, static_cast<int>(kDtype), offset);
}

// K is written transposed; going token by token would touch head_dim cache lines per token,
// so tokens are staged in tiles of 16 (one 64-byte line per dim of the transposed buffer).
template <DType kDtype>
void gather_typed(const GqaParams& p, int b, int kvh, int len, GatheredKV& kv) {
  constexpr int kTile = 16;
  std::vector<float> tile(static_cast<std::size_t>(kTile) * p.head_dim);
  const int* pages = p.page_table + static_cast<std::int64_t>(b) * p.page_table_stride;
  for (int t0 = 0; t0 < len; t0 += kTile) {
    const int n = std::min(kTile, len - t0);
    for (int j = 0; j < n; ++j) {
      const int t = t0 + j;
      const std::int64_t page = pages[t / p.page_size];
      const std::int64_t slot = t % p.page_size;
      const std::int64_t ko = page * p.k_stride_page + slot * p.k_stride_slot + kvh * p.k_stride_head;
      const std::int64_t vo = page * p.v_stride_page + slot * p.v_stride_slot + kvh * p.v_stride_head;
      float* v = kv.v.data() + static_cast<std::size_t>(t) * p.head_dim;
      for (int d = 0; d < p.head_dim; ++d) {
        tile[static_cast<std::size_t>(d) * kTile + j] = decode<kDtype>(p.k_cache, ko + d);
        v[d] = decode<kDtype>(p.v_cache, vo + d);
      }
    }
    for (int d = 0; d < p.head_dim; ++d) {
      std::copy_n(tile.data() + static_cast<std::size_t>(d) * kTile, n,
                  kv.kt.data() + static_cast<std::size_t>(d) * len + t0);
    }
  }
}

void gather_request_head(const GqaParams& p, int b, int kvh, int len, GatheredKV& kv) {
  kv.resize(len, p.head_dim, p.head_dim);
  switch (static_cast<DType>(p.kv_dtype)) {
    case DType::kBF16: return gather_typed<DType::kBF16>(p, b, kvh, len, kv);
    case DType::kFP16: return gather_typed<DType::kFP16>(p, b, kvh, len, kv);
    case DType::kFP8E4M3: return gather_typed<DType::kFP8E4M3>(p, b, kvh, len, kv);
    default: return gather_typed<DType::kINT8>(p, b, kvh, len, kv);
  }
}

// Marks the keys query token i sees and returns the visible range [lo, hi).
void visible_keys(const GqaParams& p, int b, int i, int len, std::vector<unsigned char>& visible,
                  int& lo, int& hi) {
  const int pos = len - p.q_len + i;
  const int draft_start = len - p.q_len;
  const unsigned* mask =
      p.tree_mask ? p.tree_mask + b * p.mask_stride_batch + i * p.mask_stride_token : nullptr;
  visible.assign(static_cast<std::size_t>(len), 0);
  lo = len;
  hi = 0;
  for (int t = 0; t < len; ++t) {
    bool see;
    if (mask && t >= draft_start) {
      const int j = t - draft_start;
      see = (mask[j / 32] >> (j % 32)) & 1u;
    } else {
      see = t <= pos;
    }
    if (p.window > 0 && t <= pos - p.window) see = false;
    if (see) {
      visible[t] = 1;
      if (t < lo) lo = t;
      hi = t + 1;
    }
  }
}

}  // namespace

void gqa_decode(const GqaParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const double softmax_scale =
      p.softmax_scale != 0.f ? p.softmax_scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));

  // Gather buffers are reused per thread: allocating (and zeroing) them per item costs more
  // than the gather itself at 4k tokens.
  const std::int64_t items = static_cast<std::int64_t>(p.batch) * p.num_kv_heads;
  std::vector<GatheredKV> buffers(worker_count(items));
  parallel_for(items, [&](std::int64_t item, int worker) {
    const int b = static_cast<int>(item / p.num_kv_heads);
    const int kvh = static_cast<int>(item % p.num_kv_heads);
    const int len = p.seq_lens[b];

    GatheredKV& kv = buffers[worker];
    gather_request_head(p, b, kvh, len, kv);

    RowMath math;
    const double k_scale = p.k_scales ? p.k_scales[kvh] : p.k_scale;
    math.logit_scale = softmax_scale * k_scale;
    math.softcap = p.softcap;
    math.value_scale = p.v_scales ? p.v_scales[kvh] : p.v_scale;

    std::vector<unsigned char> visible, kept;  // kept: skip-softmax's copy, per q head
    std::vector<double> q(p.head_dim), out(p.head_dim), scratch;
    const bool fp8_out = p.out_dtype == static_cast<int>(DType::kFP8E4M3);
    for (int i = 0; i < p.q_len; ++i) {
      int lo, hi;
      visible_keys(p, b, i, len, visible, lo, hi);
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const std::int64_t qo = b * p.q_stride_batch + i * p.q_stride_token + h * p.q_stride_head;
        for (int d = 0; d < p.head_dim; ++d) q[d] = load_element(p.q, p.q_dtype, qo + d);
        math.has_sink = p.sinks != nullptr;
        math.sink = p.sinks ? p.sinks[h] : 0.0;
        double lse;
        if (p.skip_softmax_factor > 0.f) {
          kept = visible;
          const int span = skip_span(len - p.q_len + i, p.window, p.tree_mask ? p.q_len - 1 - i : 0);
          attend_row_skip(q.data(), kv, lo, hi, kept.data(), math, p.skip_softmax_factor, span, out.data(),
                          &lse, scratch);
        } else {
          attend_row(q.data(), kv, lo, hi, visible.data(), math, out.data(), &lse, scratch);
        }

        const std::int64_t oo =
            b * p.out_stride_batch + i * p.out_stride_token + h * p.out_stride_head;
        const double out_div = fp8_out ? static_cast<double>(p.out_scale) : 1.0;
        for (int d = 0; d < p.head_dim; ++d) {
          store_element(p.out, p.out_dtype, oo + d, out[d] / out_div);
        }
        if (p.lse) {
          p.lse[b * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] =
              static_cast<float>(lse);
        }
      }
    }
  });
}

}  // namespace deca::cpu
