#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "api/check.hpp"
#include "api/gqa_config.hpp"
#include "api/gqa_fused.hpp"
#include "api/gqa_prepare.hpp"
#include "api/paged_check.hpp"
#include "api/params_fill.hpp"
#include "cpu/reference.hpp"
#include "cuda/backend.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"

namespace deca::api {

namespace {

constexpr const char* kFn = "gqa_decode";
constexpr const char* kOnDevice = "plan.config.device";
constexpr const char* kRowWhy =
    "row starts 16-byte aligned: GPU kernels load rows as 16-byte vectors";

std::string s(std::int64_t v) { return float_string(v); }

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string entry(const char* name, std::int64_t i) { return std::string(name) + "[" + s(i) + "]"; }
std::string entry(const char* name, std::int64_t i, std::int64_t j) {
  return entry(name, i) + "[" + s(j) + "]";
}

void check_cache(const GqaConfig& c, const char* name, const TensorView& t) {
  const bool nhd = c.layout == KvLayout::kNHD;
  const char* dims = nhd ? "[num_pages, page_size, num_kv_heads, head_dim] (NHD)"
                         : "[num_pages, num_kv_heads, page_size, head_dim] (HND)";
  expect_tensor(kFn, name, t, c.device, kOnDevice, {c.kv_dtype}, "plan.config.kv_dtype", 4, dims);
  expect_dim(kFn, name, t, nhd ? 1 : 2, "page_size", c.page_size, "plan.config.page_size");
  expect_dim(kFn, name, t, nhd ? 2 : 1, "num_kv_heads", c.num_kv_heads, "plan.config.num_kv_heads");
  expect_dim(kFn, name, t, 3, "head_dim", c.head_dim, "plan.config.head_dim");
  expect_aligned(kFn, name, t, kRowAlignBytes, kRowWhy);
  // The GPU kernels keep byte strides in 32 bits (only page * page stride is 64-bit).
  if (c.device.kind == DeviceKind::kCUDA) {
    const std::int64_t esz = static_cast<std::int64_t>(dtype_size(c.kv_dtype));
    const struct {
      const char* what;
      std::int64_t elems;
    } strides[] = {{"page stride", t.stride[0]}, {"slot stride", t.stride[nhd ? 1 : 2]}};
    for (const auto& st : strides) {
      if (st.elems < 0 || st.elems * esz >= (std::int64_t{1} << 32)) {
        throw Error(std::string(kFn) + ": " + name + " " + st.what +
                    ": expected 0 <= stride * element size < 4 GiB on the GPU, got " + s(st.elems) +
                    " elements of " + s(esz) + " bytes");
      }
    }
  }
}

void check_scale(const char* name, float value, bool positive, const char* expected) {
  if (!std::isfinite(value) || value < 0.f || (positive && value == 0.f)) {
    fail(kFn, name, expected, float_string(value));
  }
}

// The bytes of the caller's workspace the kernels write (undefined on the CPU or without one).
TensorView workspace_view(const GqaPlan& plan, const GqaDecodeArgs& a) {
  TensorView ws;
  const Device& dev = plan.config.device;
  if (dev.kind == DeviceKind::kCUDA && a.workspace != nullptr && a.workspace_bytes > 0) {
    // Only the plan's bytes are written, however large a buffer the caller passed.
    const std::size_t used = std::min(a.workspace_bytes, plan.workspace_bytes);
    ws = make_tensor(a.workspace, DType::kUINT8, {static_cast<std::int64_t>(used)}, dev);
  }
  return ws;
}

void check_tensors(const GqaPlan& plan, const GqaDecodeArgs& a, bool check_workspace) {
  const GqaConfig& c = plan.config;
  const Device dev = c.device;

  expect_tensor(kFn, "q", a.q, dev, kOnDevice, {c.q_dtype}, "plan.config.q_dtype", 4,
                "[batch, q_len, num_q_heads, head_dim]");
  expect_dim_range(kFn, "q", a.q, 0, "batch", 0, c.max_batch, "plan.config.max_batch");
  if (a.q.shape[0] % c.beam_width != 0) {
    fail(kFn, "q: dim 0 (batch)", "a multiple of plan.config.beam_width (" + s(c.beam_width) + ")",
         s(a.q.shape[0]));
  }
  expect_dim_range(kFn, "q", a.q, 1, "q_len", 1, c.max_q_len, "plan.config.max_q_len");
  expect_dim(kFn, "q", a.q, 2, "num_q_heads", c.num_q_heads, "plan.config.num_q_heads");
  expect_dim(kFn, "q", a.q, 3, "head_dim", c.head_dim, "plan.config.head_dim");
  expect_aligned(kFn, "q", a.q, kRowAlignBytes, kRowWhy);
  const std::int64_t batch = a.q.shape[0];
  const std::int64_t q_len = a.q.shape[1];

  check_cache(c, "k_cache", a.k_cache);
  check_cache(c, "v_cache", a.v_cache);
  expect_dim(kFn, "v_cache", a.v_cache, 0, "num_pages", a.k_cache.shape[0], "k_cache's num_pages");

  expect_tensor(kFn, "page_table", a.page_table, dev, kOnDevice, {DType::kINT32}, "", 2,
                "[batch, max_pages]");
  expect_dim(kFn, "page_table", a.page_table, 0, "batch", batch, "q's batch");

  expect_tensor(kFn, "seq_lens", a.seq_lens, dev, kOnDevice, {DType::kINT32}, "", 1, "[batch]");
  expect_dim(kFn, "seq_lens", a.seq_lens, 0, "batch", batch, "q's batch");

  expect_tensor(kFn, "out", a.out, dev, kOnDevice, {c.out_dtype}, "plan.config.out_dtype", 4,
                "[batch, q_len, num_q_heads, head_dim]");
  expect_dim(kFn, "out", a.out, 0, "batch", batch, "q's batch");
  expect_dim(kFn, "out", a.out, 1, "q_len", q_len, "q's q_len");
  expect_dim(kFn, "out", a.out, 2, "num_q_heads", c.num_q_heads, "plan.config.num_q_heads");
  expect_dim(kFn, "out", a.out, 3, "head_dim", c.head_dim, "plan.config.head_dim");
  expect_no_overlap(kFn, "out", a.out);
  expect_aligned(kFn, "out", a.out, kRowAlignBytes, kRowWhy);

  expect_presence(kFn, "lse", a.lse, c.lse, "plan.config.lse");
  if (c.lse) {
    expect_tensor(kFn, "lse", a.lse, dev, kOnDevice, {DType::kFP32}, "", 3,
                  "[batch, q_len, num_q_heads]");
    expect_dim(kFn, "lse", a.lse, 0, "batch", batch, "q's batch");
    expect_dim(kFn, "lse", a.lse, 1, "q_len", q_len, "q's q_len");
    expect_dim(kFn, "lse", a.lse, 2, "num_q_heads", c.num_q_heads, "plan.config.num_q_heads");
    expect_no_overlap(kFn, "lse", a.lse);
  }

  expect_presence(kFn, "tree_mask", a.tree_mask, c.tree_mask, "plan.config.tree_mask");
  if (c.tree_mask) {
    expect_tensor(kFn, "tree_mask", a.tree_mask, dev, kOnDevice, {DType::kUINT32}, "", 3,
                  "[batch, q_len, ceil(q_len / 32)]");
    expect_dim(kFn, "tree_mask", a.tree_mask, 0, "batch", batch, "q's batch");
    expect_dim(kFn, "tree_mask", a.tree_mask, 1, "q_len", q_len, "q's q_len");
    expect_dim(kFn, "tree_mask", a.tree_mask, 2, "words", (q_len + 31) / 32,
               "ceil(q_len / 32): one bit per draft token");
  }

  expect_presence(kFn, "sinks", a.sinks, c.sinks, "plan.config.sinks");
  if (c.sinks) {
    expect_tensor(kFn, "sinks", a.sinks, dev, kOnDevice, {DType::kFP32}, "", 1, "[num_q_heads]");
    expect_dim(kFn, "sinks", a.sinks, 0, "num_q_heads", c.num_q_heads, "plan.config.num_q_heads");
  }

  expect_presence(kFn, "k_scales", a.k_scales, c.per_head_kv_scale,
                  "plan.config.per_head_kv_scale");
  expect_presence(kFn, "v_scales", a.v_scales, c.per_head_kv_scale,
                  "plan.config.per_head_kv_scale");
  if (c.per_head_kv_scale) {
    for (const char* name : {"k_scales", "v_scales"}) {
      const TensorView& t = name[0] == 'k' ? a.k_scales : a.v_scales;
      expect_tensor(kFn, name, t, dev, kOnDevice, {DType::kFP32}, "", 1, "[num_kv_heads]");
      expect_dim(kFn, name, t, 0, "num_kv_heads", c.num_kv_heads, "plan.config.num_kv_heads");
    }
  } else {
    if (!std::isfinite(a.k_scale)) fail(kFn, "k_scale", "a finite value", float_string(a.k_scale));
    if (!std::isfinite(a.v_scale)) fail(kFn, "v_scale", "a finite value", float_string(a.v_scale));
  }
  check_scale("softmax_scale", a.softmax_scale, false,
              "a finite value >= 0 (0 = 1 / sqrt(head_dim))");
  check_scale("out_scale", a.out_scale, true,
              "a finite value > 0 (fp8 output stores real / out_scale)");

  // The overlap rule (check.hpp): out, lse and the workspace share no byte with any input or
  // with each other. An index tensor overwritten mid-run would be dereferenced unchecked.
  const TensorView ws = workspace_view(plan, a);
  expect_disjoint(kFn, {{"out", &a.out}, {"lse", &a.lse}, {"workspace", &ws}},
                  {{"q", &a.q},
                   {"k_cache", &a.k_cache},
                   {"v_cache", &a.v_cache},
                   {"page_table", &a.page_table},
                   {"seq_lens", &a.seq_lens},
                   {"tree_mask", &a.tree_mask},
                   {"sinks", &a.sinks},
                   {"k_scales", &a.k_scales},
                   {"v_scales", &a.v_scales}});

  if (check_workspace && dev.kind == DeviceKind::kCUDA && plan.workspace_bytes > 0) {
    if (a.workspace == nullptr) {
      fail(kFn, "workspace",
           s(static_cast<std::int64_t>(plan.workspace_bytes)) + " bytes on " + to_string(dev) +
               " (plan.workspace_bytes)",
           "nullptr");
    }
    if (a.workspace_bytes < plan.workspace_bytes) {
      fail(kFn, "workspace_bytes",
           ">= " + s(static_cast<std::int64_t>(plan.workspace_bytes)) + " (plan.workspace_bytes)",
           s(static_cast<std::int64_t>(a.workspace_bytes)));
    }
    if (reinterpret_cast<std::uintptr_t>(a.workspace) % kRowAlignBytes != 0) {
      fail(kFn, "workspace", "a pointer aligned to 16 bytes",
           "an address " +
               s(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(a.workspace) %
                                           kRowAlignBytes)) +
               " bytes past a 16-byte boundary");
    }
  }
}

// Device-resident page tables and lengths are the caller's contract: reading them would cost a
// device synchronisation per call and break CUDA-graph capture. Host ones are checked here.
void check_host_data(const GqaConfig& c, const GqaDecodeArgs& a) {
  if (c.device.kind != DeviceKind::kCPU) return;
  const std::int64_t batch = a.q.shape[0];
  const std::int64_t q_len = a.q.shape[1];
  const std::int64_t num_pages = a.k_cache.shape[0];
  if (c.per_head_kv_scale) {
    expect_finite_host(kFn, "k_scales", a.k_scales);
    expect_finite_host(kFn, "v_scales", a.v_scales);
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = expect_paged_request(
        kFn, {"seq_lens", "page_table", "page", "k_cache's num_pages"}, a.seq_lens, a.page_table, b,
        q_len, c.page_size, c.max_seq_len, num_pages);
    if (len == 0) continue;
    // docs/semantics.md: bit i of row i is always set (a draft token sees itself). A mask
    // without it would leave the kernels and the reference free to disagree, so it is refused here.
    if (c.tree_mask) {
      for (std::int64_t i = 0; i < q_len; ++i) {
        const auto word = static_cast<std::uint32_t>(load_i32(a.tree_mask, b, i, i / 32));
        if (((word >> (i % 32)) & 1u) == 0) {
          fail(kFn, entry("tree_mask", b, i) + "[" + s(i / 32) + "]",
               "bit " + s(i % 32) + " set (draft token " + s(i) + " sees itself)",
               "word " + hex(word));
        }
      }
    }
  }
}

}  // namespace

void check_gqa_decode(const GqaPlan& plan, const GqaDecodeArgs& a, bool check_workspace) {
  const GqaConfig& c = plan.config;
  // A plan from plan_gqa_decode carries the config it validated; only a plan built or edited by
  // hand has its config checked again.
  if (!plan.validated || !(c == plan.validated_config)) validate_gqa_config(kFn, "plan.config", c);
  if (plan.num_splits < 1) fail(kFn, "plan.num_splits", ">= 1", s(plan.num_splits));
  check_tensors(plan, a, check_workspace);
  check_fused_args(plan, a, workspace_view(plan, a));
  check_host_data(c, a);
  check_fused_host_data(c, a);
}

GqaParams gqa_params(const GqaPlan& plan, const GqaDecodeArgs& a, void* workspace) {
  const GqaConfig& c = plan.config;
  const bool nhd = c.layout == KvLayout::kNHD;
  GqaParams p{};
  p.batch = static_cast<int>(a.q.shape[0]);
  p.q_len = static_cast<int>(a.q.shape[1]);
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.page_size = c.page_size;
  p.max_pages = static_cast<int>(a.page_table.shape[1]);
  p.num_pages = static_cast<int>(a.k_cache.shape[0]);
  p.beam_width = c.beam_width;

  p.q_dtype = static_cast<int>(c.q_dtype);
  p.kv_dtype = static_cast<int>(c.kv_dtype);
  p.out_dtype = static_cast<int>(c.out_dtype);

  fill_q(p, a.q);

  p.k_cache = a.k_cache.data;
  p.k_stride_page = a.k_cache.stride[0];
  p.k_stride_slot = a.k_cache.stride[nhd ? 1 : 2];
  p.k_stride_head = a.k_cache.stride[nhd ? 2 : 1];
  p.v_cache = a.v_cache.data;
  p.v_stride_page = a.v_cache.stride[0];
  p.v_stride_slot = a.v_cache.stride[nhd ? 1 : 2];
  p.v_stride_head = a.v_cache.stride[nhd ? 2 : 1];

  p.page_table = static_cast<const int*>(a.page_table.data);
  p.page_table_stride = a.page_table.stride[0];
  p.seq_lens = static_cast<const int*>(a.seq_lens.data);

  fill_out_lse(p, a.out, a.lse, c.lse);
  if (c.tree_mask) {
    p.tree_mask = static_cast<const unsigned*>(a.tree_mask.data);
    p.mask_stride_batch = a.tree_mask.stride[0];
    p.mask_stride_token = a.tree_mask.stride[1];
  }
  if (c.sinks) p.sinks = static_cast<const float*>(a.sinks.data);
  if (c.per_head_kv_scale) {
    p.k_scales = static_cast<const float*>(a.k_scales.data);
    p.v_scales = static_cast<const float*>(a.v_scales.data);
  }
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;

  p.softmax_scale = softmax_scale_or_default(a.softmax_scale, c.head_dim);
  p.softcap = c.softcap;
  p.out_scale = a.out_scale;
  p.window = c.window;

  p.num_splits = plan.num_splits;
  p.split_tokens = plan.split_tokens;
  // The workspace's parts (the layout is the backend's) and the promise checked mode tests a
  // length against.
  if (c.device.kind == DeviceKind::kCUDA && p.batch > 0) {
    const cuda::GqaWorkspace w = cuda::gqa_workspace(plan, workspace);
    p.ws_partial_o = w.partial_o;
    p.ws_partial_ml = w.partial_ml;
    p.ws_counters = w.counters;
    p.check = w.check;
  }
  p.max_seq_len = c.max_seq_len;
  p.skip_softmax_factor = c.skip_softmax_factor;
  fill_fused_params(p, c, a);
  return p;
}

void dispatch_gqa_decode(const GqaPlan& plan, const GqaParams& params, void* stream, bool launch) {
  if (params.batch == 0) return;  // nothing to compute; a zero-sized grid is not launchable
  if (plan.config.device.kind == DeviceKind::kCPU) {
    if (launch) params.rope_style != 0 ? cpu::gqa_decode_fused(params) : cpu::gqa_decode(params);
    return;
  }
  cuda::gqa_decode(plan, params, stream, launch);
}

void gqa_decode_without_launch(const GqaPlan& plan, const GqaDecodeArgs& args) {
  check_gqa_decode(plan, args, /*check_workspace=*/true);
  const GqaParams params = gqa_params(plan, args, args.workspace);
  dispatch_gqa_decode(plan, params, args.stream, /*launch=*/false);
}

}  // namespace deca::api

namespace deca {

void gqa_decode(const GqaPlan& plan, const GqaDecodeArgs& args) {
  api::check_gqa_decode(plan, args, /*check_workspace=*/true);
  const GqaParams params = api::gqa_params(plan, args, args.workspace);
  api::dispatch_gqa_decode(plan, params, args.stream);
}

}  // namespace deca
