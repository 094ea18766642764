#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "api/gqa_config.hpp"
#include "api/gqa_fused.hpp"
#include "cuda/backend.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"

namespace deca::api {

namespace {

std::string field(std::string_view prefix, std::string_view name) {
  std::string s(prefix);
  s += '.';
  s += name;
  return s;
}

void expect_int(std::string_view fn, std::string_view prefix, std::string_view name, int value,
                bool ok, std::string_view expected) {
  if (!ok) fail(fn, field(prefix, name), expected, std::to_string(value));
}

}  // namespace

void validate_gqa_config(std::string_view fn, std::string_view prefix, const GqaConfig& c) {
  expect_int(fn, prefix, "num_q_heads", c.num_q_heads, c.num_q_heads > 0, "> 0");
  expect_int(fn, prefix, "num_kv_heads", c.num_kv_heads, c.num_kv_heads > 0, "> 0");
  if (c.num_q_heads % c.num_kv_heads != 0) {
    fail(fn, field(prefix, "num_q_heads"),
         "a multiple of num_kv_heads (" + std::to_string(c.num_kv_heads) +
             "): each KV head serves a whole group of query heads",
         std::to_string(c.num_q_heads));
  }
  expect_int(fn, prefix, "head_dim", c.head_dim,
             c.head_dim >= 16 && c.head_dim <= 256 && c.head_dim % 16 == 0,
             "a multiple of 16 in 16..256");
  // Up to 2^22 keys per page: a contiguous cache is one page per request (page_size = its
  // capacity, page_table[b][0] = b).
  expect_int(fn, prefix, "page_size", c.page_size, c.page_size >= 1 && c.page_size <= (1 << 22),
             "1..4194304");
  if (c.layout != KvLayout::kNHD && c.layout != KvLayout::kHND) {
    fail(fn, field(prefix, "layout"), "KvLayout::kNHD or KvLayout::kHND",
         "value " + std::to_string(static_cast<int>(c.layout)));
  }
  if (c.q_dtype != DType::kBF16 && c.q_dtype != DType::kFP16) {
    fail(fn, field(prefix, "q_dtype"), "bf16 | fp16", dtype_name(c.q_dtype));
  }
  if (c.kv_dtype != DType::kBF16 && c.kv_dtype != DType::kFP16 && c.kv_dtype != DType::kFP8E4M3 &&
      c.kv_dtype != DType::kINT8) {
    fail(fn, field(prefix, "kv_dtype"), "bf16 | fp16 | fp8_e4m3 | int8", dtype_name(c.kv_dtype));
  }
  if (c.out_dtype != DType::kBF16 && c.out_dtype != DType::kFP16 &&
      c.out_dtype != DType::kFP8E4M3) {
    fail(fn, field(prefix, "out_dtype"), "bf16 | fp16 | fp8_e4m3", dtype_name(c.out_dtype));
  }
  expect_int(fn, prefix, "max_batch", c.max_batch, c.max_batch > 0, "> 0");
  expect_int(fn, prefix, "max_q_len", c.max_q_len, c.max_q_len > 0, "> 0");
  expect_int(fn, prefix, "max_seq_len", c.max_seq_len, c.max_seq_len > 0,
             "> 0 (the longest cache any later run may have)");
  expect_int(fn, prefix, "window", c.window, c.window >= 0, ">= 0 (0 = no sliding window)");
  if (!(std::isfinite(c.softcap) && c.softcap >= 0.f)) {
    fail(fn, field(prefix, "softcap"), "a finite value >= 0 (0 = no soft-cap)",
         float_string(c.softcap));
  }
  if (!(std::isfinite(c.skip_softmax_factor) && c.skip_softmax_factor >= 0.f)) {
    fail(fn, field(prefix, "skip_softmax_factor"), "a finite value >= 0 (0 = exact attention)",
         float_string(c.skip_softmax_factor));
  }
  expect_int(fn, prefix, "beam_width", c.beam_width, c.beam_width >= 1, ">= 1");
  if (c.max_batch % c.beam_width != 0) {
    fail(fn, field(prefix, "max_batch"),
         "a multiple of beam_width (" + std::to_string(c.beam_width) +
             "): batch = requests * beam_width",
         std::to_string(c.max_batch));
  }
  validate_rope_config(fn, prefix, c);
  if (c.skip_softmax_factor > 0.f && c.rope_style != RopeStyle::kNone) {
    // The skip kernels issue V by their own loop, which has no append phase.
    fail(fn, field(prefix, "skip_softmax_factor"),
         "0 in a fused plan (rope_style set: skip-softmax and the fused step are separate kernels)",
         float_string(c.skip_softmax_factor));
  }
  switch (c.split_mode) {
    case SplitMode::kAuto:
      expect_int(fn, prefix, "split_tokens", c.split_tokens, c.split_tokens == 0,
                 "0 with split_mode kAuto (the plan chooses the splits)");
      break;
    case SplitMode::kFixed:
      expect_int(fn, prefix, "split_tokens", c.split_tokens, c.split_tokens > 0,
                 "> 0 with split_mode kFixed (keys per split)");
      break;
    default:
      fail(fn, field(prefix, "split_mode"), "SplitMode::kAuto or SplitMode::kFixed",
           "value " + std::to_string(static_cast<int>(c.split_mode)));
  }
  if (c.device.kind == DeviceKind::kCUDA) {
    const int count = cuda::device_count();
    if (c.device.index < 0 || c.device.index >= count) {
      fail(fn, field(prefix, "device"),
           count > 0 ? "cpu or cuda:0..cuda:" + std::to_string(count - 1)
                     : std::string("cpu (no CUDA device is present)"),
           to_string(c.device));
    }
  } else if (c.device.kind != DeviceKind::kCPU || c.device.index != 0) {
    fail(fn, field(prefix, "device"), "cpu (index 0) or cuda:N",
         "kind " + std::to_string(static_cast<int>(c.device.kind)) + " index " +
             std::to_string(c.device.index));
  }
}

GqaConfig oneshot_gqa_config(const GqaConfig& config, const GqaDecodeArgs& a) {
  constexpr const char* fn = "gqa_decode";
  const bool nhd = config.layout == KvLayout::kNHD;
  const char* cache_dims = nhd ? "[num_pages, page_size, num_kv_heads, head_dim] (NHD)"
                               : "[num_pages, num_kv_heads, page_size, head_dim] (HND)";
  const auto present = [&](const char* name, const TensorView& t, int rank, const char* dims) {
    expect_present(fn, name, t, dims);
    expect_rank(fn, name, t, rank, dims);
    expect_sizes(fn, name, t);
  };
  present("q", a.q, 4, "[batch, q_len, num_q_heads, head_dim]");
  expect_dtype_in(fn, "q", a.q, {DType::kBF16, DType::kFP16}, "");
  present("k_cache", a.k_cache, 4, cache_dims);
  expect_dtype_in(fn, "k_cache", a.k_cache,
                  {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kINT8}, "");
  present("page_table", a.page_table, 2, "[batch, max_pages]");
  expect_dtype(fn, "page_table", a.page_table, DType::kINT32, "");
  if (a.out.defined()) {
    expect_dtype_in(fn, "out", a.out, {DType::kBF16, DType::kFP16, DType::kFP8E4M3}, "");
  }
  const TensorView& k = a.k_cache;
  expect_dim_range(fn, "k_cache", k, nhd ? 1 : 2, "page_size", 1, 1 << 22, "");
  expect_dim_range(fn, "k_cache", k, nhd ? 2 : 1, "num_kv_heads", 1, INT32_MAX, "");
  if (k.shape[3] < 16 || k.shape[3] > 256 || k.shape[3] % 16 != 0) {
    fail(fn, "k_cache: dim 3 (head_dim)", "a multiple of 16 in 16..256",
         std::to_string(k.shape[3]));
  }
  expect_dim_range(fn, "q", a.q, 2, "num_q_heads", 1, INT32_MAX, "");
  const std::int64_t kv_heads = k.shape[nhd ? 2 : 1];
  if (a.q.shape[2] % kv_heads != 0) {
    fail(fn, "q: dim 2 (num_q_heads)",
         "a multiple of k_cache's num_kv_heads (" + std::to_string(kv_heads) +
             "): each KV head serves a whole group of query heads",
         std::to_string(a.q.shape[2]));
  }

  const auto at_least_one = [](std::int64_t v) {
    return static_cast<int>(std::clamp<std::int64_t>(v, 1, INT32_MAX));
  };
  GqaConfig c = config;
  c.num_q_heads = static_cast<int>(a.q.shape[2]);
  c.num_kv_heads = static_cast<int>(kv_heads);
  c.head_dim = static_cast<int>(k.shape[3]);
  c.page_size = static_cast<int>(k.shape[nhd ? 1 : 2]);
  c.max_q_len = at_least_one(a.q.shape[1]);
  if (c.beam_width >= 1) {
    const std::int64_t beams = c.beam_width;
    c.max_batch = at_least_one((a.q.shape[0] + beams - 1) / beams * beams);
    c.max_batch = std::max(c.max_batch, c.beam_width);
  }
  if (config.max_seq_len <= 0) {
    c.max_seq_len = at_least_one(a.page_table.shape[1] * static_cast<std::int64_t>(c.page_size));
  }
  validate_gqa_config(fn, "config", c);
  return c;
}

GqaPlan plan_validated_gqa(const GqaConfig& config) {
  GqaPlan plan;
  plan.config = config;
  if (config.device.kind == DeviceKind::kCUDA) {
    cuda::plan_gqa_decode(plan);
  } else {
    // The CPU reference walks each request's keys once: no splits, no workspace, no kernel.
    plan.num_splits = 1;
    plan.split_tokens = 0;
    plan.workspace_bytes = 0;
    plan.kernel_name.clear();
    plan.sm_count = 0;
  }
  plan.validated_config = config;
  plan.validated = true;
  return plan;
}

}  // namespace deca::api

namespace deca {

GqaPlan plan_gqa_decode(const GqaConfig& config) {
  api::validate_gqa_config("plan_gqa_decode", "config", config);
  return api::plan_validated_gqa(config);
}

}  // namespace deca
