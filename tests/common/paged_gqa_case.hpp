// Building a random paged GQA decode case in host buffers, with GqaParams filled to point at
// them. The cache is written from "logical" per-request K/V arrays that the case keeps, so a
// test can compute the expected result from dense data without ever reading the pages.
//
// What a case exercises by default: pages of the pool handed out in shuffled order, spare pool
// pages and every unused slot poisoned (NaN codes; 127 for int8), unused page-table columns
// set to a huge page id, outputs poisoned before the run.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/contiguous_params.hpp"
#include "common/host_tensor.hpp"
#include "deca/gqa.hpp"
#include "kernels/gqa/params.cuh"

namespace deca::test {

struct GqaCaseSpec {
  int batch = 1;
  int q_len = 1;
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int page_size = 16;
  std::vector<int> seq_lens;  // one per request; empty: every request gets max_len
  int max_len = 40;
  KvLayout layout = KvLayout::kNHD;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;

  bool shuffle_pages = true;
  int spare_pages = 3;       // pool pages no request uses (poisoned)
  int spare_columns = 1;     // page-table columns past the last needed one (huge ids)
  bool kv_one_allocation = false;  // K and V interleaved per page in one buffer
  // > 0: requests draw their pages at random (with repeats) from a pool of this many pages;
  // keeps huge cases (timing tests) small in memory. The logical arrays are then not kept.
  int shared_pool_pages = 0;

  bool per_head_scales = false;
  bool lse = true;
  bool sinks = false;
  bool tree_mask = false;
  int window = 0;
  float softcap = 0.f;
  float softmax_scale = 0.f;  // 0: 1 / sqrt(head_dim)
  float out_scale = 1.f;
  float value_range = 1.f;    // K/V/q real values ~ N(0, value_range)
};

struct GqaCase {
  GqaCaseSpec spec;
  std::vector<int> lens;
  HostTensor q, k_pool, v_pool, page_table, seq_lens, out, lse, tree_mask, sinks, k_scales,
      v_scales;
  float k_scale = 1.f, v_scale = 1.f;
  // Per request b: stored values (decoded to float) as [len][num_kv_heads][head_dim].
  std::vector<std::vector<float>> k_logical, v_logical;
  // Per request b, draft i: the parent draft in the speculation tree (-1: the last accepted
  // token), when spec.tree_mask.
  std::vector<std::vector<int>> tree_parent;
  GqaParams params{};

  GqaCase() = default;
  GqaCase(const GqaCase&) = delete;  // params points into the buffers
  GqaCase& operator=(const GqaCase&) = delete;
  GqaCase(GqaCase&&) = default;
  GqaCase& operator=(GqaCase&&) = default;

  float k_scale_of(int kvh) const { return spec.per_head_scales ? k_scales.data<float>()[kvh] : k_scale; }
  float v_scale_of(int kvh) const { return spec.per_head_scales ? v_scales.data<float>()[kvh] : v_scale; }
  float q_at(int b, int i, int h, int d) const {
    const auto& s = spec;
    return q.get(((static_cast<std::int64_t>(b) * s.q_len + i) * s.num_q_heads + h) * s.head_dim + d);
  }
  // Re-points params at the buffers (after a move, or after a test swapped a buffer).
  void bind();
};

inline std::uint8_t poison_byte(DType dtype) {
  // 0xFF is NaN in bf16, fp16 and e4m3 (and -1 in int8, so int8 uses 0x7F = 127 instead).
  return dtype == DType::kINT8 ? 0x7F : 0xFF;
}

// Stored code for a real value x of a quantized or float dtype, with the given scale.
inline float stored_value(DType dtype, float x, float scale) {
  if (dtype == DType::kINT8) {
    float r = std::nearbyint(x / scale);
    return std::max(-127.f, std::min(127.f, r));
  }
  if (dtype == DType::kFP8E4M3) return round_to(dtype, x / scale);
  return round_to(dtype, x);
}

inline std::int64_t gqa_page_elems(const GqaCaseSpec& s) {
  return static_cast<std::int64_t>(s.page_size) * s.num_kv_heads * s.head_dim;
}

inline void GqaCase::bind() {
  const auto& s = spec;
  GqaParams& p = params;
  p = GqaParams{};
  p.batch = s.batch;
  p.q_len = s.q_len;
  p.num_q_heads = s.num_q_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.page_size = s.page_size;
  p.max_pages = static_cast<int>(page_table.shape()[1]);
  p.num_pages = static_cast<int>(k_pool.shape()[0]);
  p.beam_width = 1;
  p.q_dtype = static_cast<int>(s.q_dtype);
  p.kv_dtype = static_cast<int>(s.kv_dtype);
  p.out_dtype = static_cast<int>(s.out_dtype);

  bind_contiguous_q_out_lse(p, s.num_q_heads, s.q_len, q, s.head_dim, out, s.head_dim, lse,
                            s.lse);

  const std::int64_t page = gqa_page_elems(s);
  const bool nhd = s.layout == KvLayout::kNHD;
  const std::int64_t slot_stride = nhd ? static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim : s.head_dim;
  const std::int64_t head_stride = nhd ? s.head_dim : static_cast<std::int64_t>(s.page_size) * s.head_dim;
  const std::int64_t page_stride = s.kv_one_allocation ? 2 * page : page;
  const std::size_t elem = dtype_size(s.kv_dtype);
  p.k_cache = k_pool.raw();
  p.v_cache = s.kv_one_allocation ? static_cast<const char*>(k_pool.raw()) + page * elem : v_pool.raw();
  p.k_stride_page = p.v_stride_page = page_stride;
  p.k_stride_slot = p.v_stride_slot = slot_stride;
  p.k_stride_head = p.v_stride_head = head_stride;

  p.page_table = page_table.data<int>();
  p.page_table_stride = page_table.shape()[1];
  p.seq_lens = seq_lens.data<int>();

  const int words = (s.q_len + 31) / 32;
  p.tree_mask = s.tree_mask ? tree_mask.data<unsigned>() : nullptr;
  p.mask_stride_token = words;
  p.mask_stride_batch = static_cast<std::int64_t>(words) * s.q_len;

  p.sinks = s.sinks ? sinks.data<float>() : nullptr;
  p.k_scales = s.per_head_scales ? k_scales.data<float>() : nullptr;
  p.v_scales = s.per_head_scales ? v_scales.data<float>() : nullptr;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.softmax_scale = s.softmax_scale != 0.f ? s.softmax_scale
                                           : 1.f / std::sqrt(static_cast<float>(s.head_dim));
  p.softcap = s.softcap;
  p.out_scale = s.out_scale;
  p.window = s.window;
  p.num_splits = 1;
}

// Element offset of (page, slot, kv head, d) in the K pool (the V pool: same, or + one page
// when K and V share one allocation).
inline std::int64_t gqa_cache_offset(const GqaCase& c, std::int64_t page, int slot, int kvh, int d) {
  const GqaParams& p = c.params;
  return page * p.k_stride_page + slot * p.k_stride_slot + kvh * p.k_stride_head + d;
}

// Fills out and lse with NaN so that a run that skips an element is caught.
inline void poison_outputs(GqaCase& c) {
  c.out.fill_bytes(0xFF);
  if (c.spec.lse) c.lse.fill_bytes(0xFF);
}

inline GqaCase build_gqa_case(const GqaCaseSpec& spec, std::mt19937_64& rng) {
  GqaCase c;
  c.spec = spec;
  const auto& s = c.spec;
  std::normal_distribution<float> normal(0.f, s.value_range);
  c.lens = s.seq_lens.empty() ? std::vector<int>(s.batch, s.max_len) : s.seq_lens;

  // Scales: quantized caches map ~4 standard deviations onto the format's range.
  const bool quant = s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kINT8;
  const float qmax = s.kv_dtype == DType::kINT8 ? 127.f : 448.f;
  c.k_scale = quant ? 4.f * s.value_range / qmax : 1.f;
  c.v_scale = quant ? 3.f * s.value_range / qmax : 1.f;
  if (s.per_head_scales) {
    c.k_scales = HostTensor(DType::kFP32, {s.num_kv_heads});
    c.v_scales = HostTensor(DType::kFP32, {s.num_kv_heads});
    for (int h = 0; h < s.num_kv_heads; ++h) {
      c.k_scales.data<float>()[h] = c.k_scale * (1.f + 0.5f * h);
      c.v_scales.data<float>()[h] = c.v_scale * (1.f + 0.25f * h);
    }
  }

  c.q = HostTensor(s.q_dtype, {s.batch, s.q_len, s.num_q_heads, s.head_dim});
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, normal(rng));

  // Pages: each request needs ceil(len / page_size); the pool has spare ones besides.
  int max_needed = 0, total_needed = 0;
  for (int len : c.lens) {
    const int n = (len + s.page_size - 1) / s.page_size;
    max_needed = std::max(max_needed, n);
    total_needed += n;
  }
  const bool shared = s.shared_pool_pages > 0;
  const int pool = shared ? s.shared_pool_pages : total_needed + s.spare_pages;
  const int columns = max_needed + s.spare_columns;
  c.page_table = HostTensor(DType::kINT32, {s.batch, std::max(columns, 1)});
  std::fill_n(c.page_table.data<int>(), c.page_table.numel(), 0x3FFFFFFF);
  std::vector<int> order(pool);
  std::iota(order.begin(), order.end(), 0);
  if (s.shuffle_pages) std::shuffle(order.begin(), order.end(), rng);
  std::uniform_int_distribution<int> any_page(0, std::max(pool - 1, 0));
  int next = 0;
  for (int b = 0; b < s.batch; ++b) {
    const int n = (c.lens[b] + s.page_size - 1) / s.page_size;
    for (int j = 0; j < n; ++j) {
      c.page_table.data<int>()[b * c.page_table.shape()[1] + j] = shared ? any_page(rng) : order[next++];
    }
  }

  const std::int64_t page = gqa_page_elems(s);
  if (s.kv_one_allocation) {
    c.k_pool = HostTensor(s.kv_dtype, {pool, 2, page});
  } else {
    c.k_pool = HostTensor(s.kv_dtype, {pool, page});
    c.v_pool = HostTensor(s.kv_dtype, {pool, page});
  }
  c.seq_lens = HostTensor(DType::kINT32, {s.batch});
  std::copy(c.lens.begin(), c.lens.end(), c.seq_lens.data<int>());
  c.out = HostTensor(s.out_dtype, {s.batch, s.q_len, s.num_q_heads, s.head_dim});
  c.lse = HostTensor(DType::kFP32, {s.batch, s.q_len, s.num_q_heads});

  if (s.tree_mask) {
    const int words = (s.q_len + 31) / 32;
    c.tree_mask = HostTensor(DType::kUINT32, {s.batch, s.q_len, words});
    c.tree_parent.assign(s.batch, std::vector<int>(s.q_len, -1));
    auto* m = c.tree_mask.data<unsigned>();
    for (int b = 0; b < s.batch; ++b) {
      for (int i = 0; i < s.q_len; ++i) {
        const int parent = std::uniform_int_distribution<int>(-1, i - 1)(rng);
        c.tree_parent[b][i] = parent;
        unsigned* row = m + (static_cast<std::int64_t>(b) * s.q_len + i) * words;
        if (parent >= 0) std::copy_n(m + (static_cast<std::int64_t>(b) * s.q_len + parent) * words, words, row);
        row[i / 32] |= 1u << (i % 32);
      }
    }
  }
  if (s.sinks) {
    c.sinks = HostTensor(DType::kFP32, {s.num_q_heads});
    for (int h = 0; h < s.num_q_heads; ++h) c.sinks.data<float>()[h] = 2.f * normal(rng);
  }
  c.bind();

  // Poison everything, then write the used slots from the logical arrays.
  c.k_pool.fill_bytes(poison_byte(s.kv_dtype));
  if (!s.kv_one_allocation) c.v_pool.fill_bytes(poison_byte(s.kv_dtype));
  poison_outputs(c);
  const std::int64_t v_shift = s.kv_one_allocation ? page : 0;
  HostTensor& v_store = s.kv_one_allocation ? c.k_pool : c.v_pool;
  auto write = [&](std::int64_t pg, int slot, int kvh, int d, float k, float v) {
    const std::int64_t o = gqa_cache_offset(c, pg, slot, kvh, d);
    c.k_pool.set(o, k);
    v_store.set(o + v_shift, v);
  };
  if (shared) {
    // Every slot of the shared pool holds finite data: requests may read any of them.
    for (int pg = 0; pg < pool; ++pg)
      for (int slot = 0; slot < s.page_size; ++slot)
        for (int kvh = 0; kvh < s.num_kv_heads; ++kvh)
          for (int d = 0; d < s.head_dim; ++d)
            write(pg, slot, kvh, d, stored_value(s.kv_dtype, normal(rng), c.k_scale_of(kvh)),
                  stored_value(s.kv_dtype, normal(rng), c.v_scale_of(kvh)));
    return c;
  }
  c.k_logical.resize(s.batch);
  c.v_logical.resize(s.batch);
  const std::int64_t row = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  for (int b = 0; b < s.batch; ++b) {
    c.k_logical[b].resize(c.lens[b] * row);
    c.v_logical[b].resize(c.lens[b] * row);
    for (int t = 0; t < c.lens[b]; ++t) {
      const std::int64_t pg = c.page_table.data<int>()[b * c.page_table.shape()[1] + t / s.page_size];
      for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
        for (int d = 0; d < s.head_dim; ++d) {
          const float k = stored_value(s.kv_dtype, normal(rng), c.k_scale_of(kvh));
          const float v = stored_value(s.kv_dtype, normal(rng), c.v_scale_of(kvh));
          write(pg, t % s.page_size, kvh, d, k, v);
          c.k_logical[b][t * row + kvh * s.head_dim + d] = k;
          c.v_logical[b][t * row + kvh * s.head_dim + d] = v;
        }
      }
    }
  }
  return c;
}

// Beam search: the beams of a request (adjacent batch entries, `beams` of them) share their
// first pages, beam 0's, and own their last `own_pages`. A page is shared only where beam 0 wrote
// every slot the beam reads in it (a longer beam keeps its own copy of beam 0's last, partial
// page). Pages a beam gave up stay in the pool with their data; the reference reads through the
// page table, as the kernels do.
// `own_tail` > 0: no page that holds one of the last own_tail tokens of either beam is shared
// (the fused step appends there: each request's new tokens must go to pages of its own).
inline void share_prefix_pages(GqaCase& c, int beams, int own_pages, int own_tail = 0) {
  const auto& s = c.spec;
  const std::int64_t cols = c.page_table.shape()[1];
  int* table = c.page_table.data<int>();
  for (int r = 0; r < s.batch / beams; ++r) {
    const int len0 = c.lens[r * beams];
    const int pages0 = (len0 + s.page_size - 1) / s.page_size;
    for (int j = 1; j < beams; ++j) {
      const int b = r * beams + j;
      const int pages = (c.lens[b] + s.page_size - 1) / s.page_size;
      for (int pg = 0; pg < std::min(pages - own_pages, pages0); ++pg) {
        if (std::min(c.lens[b], (pg + 1) * s.page_size) > len0) break;
        if (own_tail > 0 && (pg + 1) * s.page_size > std::min(len0, c.lens[b]) - own_tail) break;
        table[b * cols + pg] = table[r * beams * cols + pg];
      }
    }
  }
}

}  // namespace deca::test
