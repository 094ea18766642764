// MLA sparse decode: the 656-byte FP8 token (V3.2) or the 584-byte MODEL1 token with its optional
// second cache, chosen by top-k indices. Validation, params, dispatch to the CPU reference or the
// CUDA backend.
#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "api/mla_checks.hpp"
#include "api/params_fill.hpp"
#include "cuda/backend.hpp"
#include "cpu/reference.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "kernels/mla/params.cuh"

namespace deca::api::mla {
namespace {

// One selection's arguments by the caller's names: the first cache's or the second's.
struct Selection {
  const char* indices;      // "indices" | "extra_indices"
  const char* length;       // "topk_length" | "extra_topk_length"
  const char* topk_field;   // "plan.config.topk" | "plan.config.extra_topk"
  const char* length_flag;  // "plan.config.topk_length" | "plan.config.extra_topk_length"
  const char* cache;        // "" | "extra_" (the pool's words in messages)
  int topk;
  int page_size;
  bool has_length;
};

void check_selection_tensors(const char* fn, const MlaConfig& c, const Selection& sel,
                             const TensorView& indices, const TensorView& length,
                             std::int64_t batch, std::int64_t q_len) {
  const std::string dims = std::string("[batch, q_len, ") + (*sel.cache ? "extra_topk]" : "topk]");
  expect_tensor(fn, sel.indices, indices, c.device, kPlanDevice, {DType::kINT32}, "", 3, dims);
  expect_dim(fn, sel.indices, indices, 0, "batch", batch, "q's batch");
  expect_dim(fn, sel.indices, indices, 1, "q_len", q_len, "q's q_len");
  expect_dim(fn, sel.indices, indices, 2, *sel.cache ? "extra_topk" : "topk", sel.topk,
             sel.topk_field);
  expect_presence(fn, sel.length, length, sel.has_length, sel.length_flag);
  if (sel.has_length) {
    expect_tensor(fn, sel.length, length, c.device, kPlanDevice, {DType::kINT32}, "", 1,
                  "[batch]");
    expect_dim(fn, sel.length, length, 0, "batch", batch, "q's batch");
  }
}

// Host data: the length within [0, topk]; the indices that count are -1 or a token id of the
// pool. Device-resident ones are the caller's contract (reading them would cost a copy and a
// sync per call, and break graph capture): the GPU kernels clamp the length to [0, topk] and
// skip ids outside the pool, where the CPU path raises.
void check_selection_data(const char* fn, const Selection& sel, const TensorView& indices,
                          const TensorView& length, std::int64_t num_blocks) {
  const std::int64_t batch = indices.shape[0];
  const std::int64_t q_len = indices.shape[1];
  const std::int64_t num_tokens = num_blocks * sel.page_size;
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t used = sel.topk;
    if (sel.has_length) {
      used = load_i32(length, b);
      if (used < 0 || used > sel.topk) {
        fail(fn, std::string(sel.length) + "[" + s(b) + "]",
             "0.." + s(sel.topk) + " (" + sel.topk_field + ")", s(used));
      }
    }
    for (std::int64_t i = 0; i < q_len; ++i) {
      for (std::int64_t k = 0; k < used; ++k) {
        const std::int64_t id = load_i32(indices, b, i, k);
        if (id != -1 && (id < 0 || id >= num_tokens)) {
          fail(fn, std::string(sel.indices) + "[" + s(b) + "][" + s(i) + "][" + s(k) + "]",
               "-1 (skip) or a token id in [0, " + s(num_tokens) + ") (" + sel.cache +
                   "num_blocks " + s(num_blocks) + " * " + sel.cache + "page_size " +
                   s(sel.page_size) + ")",
               s(id));
        }
      }
    }
  }
}

Selection first_selection(const MlaConfig& c) {
  return {"indices", "topk_length", "plan.config.topk", "plan.config.topk_length", "",
          c.topk, c.page_size, c.topk_length};
}

Selection extra_selection(const MlaConfig& c) {
  return {"extra_indices", "extra_topk_length", "plan.config.extra_topk",
          "plan.config.extra_topk_length", "extra_", c.extra_topk, c.extra_page_size,
          c.extra_topk_length};
}

void check_extra(const char* fn, const MlaConfig& c, const MlaSparseArgs& a, std::int64_t batch,
                 std::int64_t q_len) {
  const bool used = c.extra_topk > 0;
  constexpr const char* kFlag = "plan.config.extra_topk > 0";
  expect_presence(fn, "extra_kv_cache", a.extra_kv_cache, used, kFlag);
  expect_presence(fn, "extra_indices", a.extra_indices, used, kFlag);
  if (!used) {
    expect_presence(fn, "extra_topk_length", a.extra_topk_length, false,
                    "plan.config.extra_topk_length");
    return;
  }
  check_model1_cache(fn, "extra_kv_cache", a.extra_kv_cache, c.device, c.extra_page_size,
                     "plan.config.extra_page_size");
  check_selection_tensors(fn, c, extra_selection(c), a.extra_indices, a.extra_topk_length, batch,
                          q_len);
}

void fill_extra(MlaSparseParams& p, const MlaConfig& c, const MlaSparseArgs& a) {
  if (c.extra_topk <= 0) return;
  p.extra_page_size = c.extra_page_size;
  p.extra_num_blocks = static_cast<int>(a.extra_kv_cache.shape[0]);
  p.extra_topk = c.extra_topk;
  p.extra_kv = static_cast<const unsigned char*>(a.extra_kv_cache.data);
  // A one-block view's block stride is never taken; the packed page size keeps it meaningful.
  p.extra_kv_stride_block = a.extra_kv_cache.shape[0] > 1
                                ? a.extra_kv_cache.stride[0]
                                : static_cast<long long>(mla_model1_page_bytes(c.extra_page_size));
  p.extra_indices = static_cast<const int*>(a.extra_indices.data);
  p.extra_indices_stride_batch = a.extra_indices.stride[0];
  p.extra_indices_stride_token = a.extra_indices.stride[1];
  if (c.extra_topk_length) p.extra_topk_length = static_cast<const int*>(a.extra_topk_length.data);
}

}  // namespace
}  // namespace deca::api::mla

namespace deca {

void mla_decode_sparse(const MlaPlan& plan, const MlaSparseArgs& a) {
  using namespace api;
  using namespace api::mla;
  constexpr const char* fn = "mla_decode_sparse";
  const MlaConfig& c = plan.config;
  check_plan_and_common(fn, plan, true, a.q, a.out, a.lse, a.kv_cache);
  const std::int64_t batch = a.q.shape[0];
  const std::int64_t q_len = a.q.shape[1];
  check_selection_tensors(fn, c, first_selection(c), a.indices, a.topk_length, batch, q_len);
  expect_presence(fn, "attn_sink", a.attn_sink, c.attn_sink, "plan.config.attn_sink");
  if (c.attn_sink) {
    expect_tensor(fn, "attn_sink", a.attn_sink, c.device, kPlanDevice, {DType::kFP32}, "", 1,
                  "[num_heads]");
    expect_dim(fn, "attn_sink", a.attn_sink, 0, "num_heads", c.num_heads, "plan.config.num_heads");
  }
  check_extra(fn, c, a, batch, q_len);
  check_softmax_scale(fn, c, a.softmax_scale);
  expect_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                  {{"q", &a.q},
                   {"kv_cache", &a.kv_cache},
                   {"indices", &a.indices},
                   {"topk_length", &a.topk_length},
                   {"attn_sink", &a.attn_sink},
                   {"extra_kv_cache", &a.extra_kv_cache},
                   {"extra_indices", &a.extra_indices},
                   {"extra_topk_length", &a.extra_topk_length}});

  const bool on_gpu = c.device.kind == DeviceKind::kCUDA;
  if (on_gpu) check_workspace(fn, plan, a.workspace, a.workspace_bytes);
  const std::int64_t num_blocks = a.kv_cache.shape[0];
  if (!on_gpu) {
    check_selection_data(fn, first_selection(c), a.indices, a.topk_length, num_blocks);
    if (c.extra_topk > 0) {
      check_selection_data(fn, extra_selection(c), a.extra_indices, a.extra_topk_length,
                           a.extra_kv_cache.shape[0]);
    }
  }

  MlaSparseParams p{};
  p.batch = static_cast<int>(batch);
  p.q_len = static_cast<int>(q_len);
  p.num_heads = c.num_heads;
  p.page_size = c.page_size;
  p.topk = c.topk;
  p.num_blocks = static_cast<int>(num_blocks);
  fill_q(p, a.q);
  p.kv = static_cast<const unsigned char*>(a.kv_cache.data);
  p.kv_stride_block = a.kv_cache.stride[0];
  p.kv_stride_slot = a.kv_cache.stride[1];
  p.kv_format = kernel_format(c);
  if (is_model1(c) && num_blocks <= 1) {
    p.kv_stride_block = static_cast<long long>(mla_model1_page_bytes(c.page_size));
  }
  p.indices = static_cast<const int*>(a.indices.data);
  p.indices_stride_batch = a.indices.stride[0];
  p.indices_stride_token = a.indices.stride[1];
  if (c.topk_length) p.topk_length = static_cast<const int*>(a.topk_length.data);
  if (c.attn_sink) p.attn_sink = static_cast<const float*>(a.attn_sink.data);
  fill_extra(p, c, a);
  fill_out_lse(p, a.out, a.lse, c.lse);
  p.softmax_scale = softmax_scale_or_default(a.softmax_scale, dim_qk(c));
  p.lse_empty = static_cast<int>(c.lse_of_empty_row);
  if (p.batch == 0) return;
  if (on_gpu) {
    cuda::mla_sparse_decode(plan, p, a.workspace, a.stream, a.reuse_schedule);
    return;
  }
  cpu::mla_sparse_decode(p);
}

}  // namespace deca
