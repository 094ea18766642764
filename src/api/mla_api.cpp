// MLA decode: plan, config validation, the checks dense and sparse decode share
// (api/mla_checks.hpp), and dense decode (block table over a bf16, e4m3 or 656-byte FP8 cache):
// validation, params, dispatch to the CPU reference or the CUDA backend. Sparse decode:
// mla_sparse_api.cpp.
#include <cmath>
#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "api/mla_checks.hpp"
#include "api/paged_check.hpp"
#include "api/params_fill.hpp"
#include "cuda/backend.hpp"
#include "cpu/reference.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "kernels/mla/params.cuh"

namespace deca::api::mla {

std::string s(std::int64_t v) { return float_string(v); }

namespace {

void expect_field(const char* fn, std::string_view prefix, const char* name, int value, bool ok,
                  std::string_view expected) {
  if (!ok) fail(fn, std::string(prefix) + "." + name, expected, s(value));
}

const char* enum_name(MlaCacheFormat f) {
  switch (f) {
    case MlaCacheFormat::kDefault: return "kDefault";
    case MlaCacheFormat::kBF16: return "kBF16";
    case MlaCacheFormat::kFP8E4M3: return "kFP8E4M3";
    case MlaCacheFormat::kFP8Sparse: return "kFP8Sparse";
    case MlaCacheFormat::kModel1: return "kModel1";
  }
  return "?";
}

// "kFP8E4M3 (fp8_e4m3)": the enumerator a C++ caller wrote and the name Python takes; the number
// for a value outside the enum.
std::string format_text(MlaCacheFormat f) {
  if (std::string_view(enum_name(f)) == "?") return s(static_cast<int>(f));
  return std::string(enum_name(f)) + " (" + mla_cache_format_name(f) + ")";
}

bool format_in_enum(MlaCacheFormat f) {
  const int v = static_cast<int>(f);
  return v >= static_cast<int>(MlaCacheFormat::kDefault) &&
         v <= static_cast<int>(MlaCacheFormat::kModel1);
}

void validate_kv_format(const char* fn, std::string_view prefix, const MlaConfig& c) {
  const std::string arg = std::string(prefix) + ".kv_format";
  if (!format_in_enum(c.kv_format)) {
    fail(fn, arg, "an MlaCacheFormat: kDefault, kBF16, kFP8E4M3, kFP8Sparse or kModel1",
         format_text(c.kv_format));
  }
  const MlaCacheFormat f = stored_format(c);
  if (c.sparse && f != MlaCacheFormat::kFP8Sparse && f != MlaCacheFormat::kModel1) {
    fail(fn, arg,
         "kDefault, kFP8Sparse or kModel1 for sparse decode (sparse decode reads the 656-byte "
         "or the 584-byte FP8 token)",
         format_text(c.kv_format));
  }
  if (!c.sparse && f == MlaCacheFormat::kModel1) {
    fail(fn, arg,
         "kDefault, kBF16, kFP8E4M3 or kFP8Sparse for dense decode (kModel1 is read by sparse "
         "decode only)",
         format_text(c.kv_format));
  }
}

// The second cache: kModel1 sparse decode only; its page size matters only when it is used.
void validate_extra(const char* fn, std::string_view prefix, const MlaConfig& c) {
  const std::string p(prefix);
  expect_field(fn, prefix, "extra_topk", c.extra_topk, c.extra_topk >= 0,
               ">= 0 (indices per query token into the second cache; 0 = none)");
  if (c.extra_topk > 0 && !(c.sparse && is_model1(c))) {
    const std::string why =
        c.sparse ? "kv_format is " + format_text(c.kv_format) : std::string("sparse is false");
    fail(fn, p + ".extra_topk",
         "0 (a second cache is read by kModel1 sparse decode only; " + why + ")",
         s(c.extra_topk));
  }
  if (c.extra_topk > 0) {
    expect_field(fn, prefix, "extra_page_size", c.extra_page_size, c.extra_page_size >= 1,
                 ">= 1");
  }
  if (c.extra_topk_length && c.extra_topk <= 0) {
    fail(fn, p + ".extra_topk_length", "false without a second cache (extra_topk is 0)", "true");
  }
}

void validate_mla_config(const char* fn, std::string_view prefix, const MlaConfig& c) {
  expect_field(fn, prefix, "num_heads", c.num_heads, c.num_heads > 0, "> 0");
  // Any page size the cache has (FlashMLA's tests use 2, 61, 69 and 576): the CPU reference and
  // the portable kernel read it at run time, the sm90 kernel is compiled per page size, and
  // every token offset is computed in 64 bits.
  expect_field(fn, prefix, "page_size", c.page_size, c.page_size >= 1, ">= 1");
  expect_field(fn, prefix, "max_batch", c.max_batch, c.max_batch > 0, "> 0");
  expect_field(fn, prefix, "max_q_len", c.max_q_len, c.max_q_len > 0, "> 0");
  if (c.sparse) {
    expect_field(fn, prefix, "topk", c.topk, c.topk > 0, "> 0 (indices per query token)");
    expect_field(fn, prefix, "max_seq_len", c.max_seq_len, c.max_seq_len >= 0,
                 ">= 0 (unused by sparse decode)");
  } else {
    expect_field(fn, prefix, "max_seq_len", c.max_seq_len, c.max_seq_len > 0,
                 "> 0 (the longest cache any later run may have)");
    expect_field(fn, prefix, "topk", c.topk, c.topk == 0, "0 for dense decode (sparse is false)");
    if (c.attn_sink) {
      fail(fn, std::string(prefix) + ".attn_sink", "false for dense decode (sparse is false)",
           "true");
    }
    if (c.topk_length) {
      fail(fn, std::string(prefix) + ".topk_length", "false for dense decode (sparse is false)",
           "true");
    }
  }
  if (c.lse_of_empty_row != MlaLseOfEmptyRow::kNegInf && c.lse_of_empty_row != MlaLseOfEmptyRow::kPosInf) {
    fail(fn, std::string(prefix) + ".lse_of_empty_row", "kNegInf or kPosInf",
         std::to_string(static_cast<int>(c.lse_of_empty_row)));
  }
  validate_kv_format(fn, prefix, c);
  validate_extra(fn, prefix, c);
  if (c.device.kind == DeviceKind::kCUDA) {
    const int count = cuda::device_count();
    if (c.device.index < 0 || c.device.index >= count) {
      fail(fn, std::string(prefix) + ".device",
           count > 0 ? "cpu or cuda:0..cuda:" + std::to_string(count - 1)
                     : std::string("cpu (no CUDA device is present)"),
           to_string(c.device));
    }
  } else if (c.device != Device::cpu()) {
    fail(fn, std::string(prefix) + ".device", "cpu or cuda:N", to_string(c.device));
  }
}

// q, out and lse are shaped alike for dense and sparse decode; returns nothing, checks all three.
void check_q_out_lse(const char* fn, const MlaConfig& c, const TensorView& q, const TensorView& out,
                     const TensorView& lse) {
  const Device dev = c.device;
  const bool m1 = is_model1(c);
  expect_tensor(fn, "q", q, dev, kPlanDevice, {DType::kBF16}, "", 4,
                m1 ? "[batch, q_len, num_heads, 512]" : "[batch, q_len, num_heads, 576]");
  expect_dim_range(fn, "q", q, 0, "batch", 0, c.max_batch, "plan.config.max_batch");
  expect_dim_range(fn, "q", q, 1, "q_len", 1, c.max_q_len, "plan.config.max_q_len");
  expect_dim(fn, "q", q, 2, "num_heads", c.num_heads, "plan.config.num_heads");
  expect_dim(fn, "q", q, 3, "head_dim", dim_qk(c),
             m1 ? "448 NoPE + 64 RoPE: plan.config.kv_format kModel1" : "512 NoPE + 64 RoPE");
  expect_aligned(fn, "q", q, kRowAlignBytes, kRowWhy);

  expect_tensor(fn, "out", out, dev, kPlanDevice, {DType::kBF16}, "", 4,
                "[batch, q_len, num_heads, 512]");
  expect_dim(fn, "out", out, 0, "batch", q.shape[0], "q's batch");
  expect_dim(fn, "out", out, 1, "q_len", q.shape[1], "q's q_len");
  expect_dim(fn, "out", out, 2, "num_heads", c.num_heads, "plan.config.num_heads");
  expect_dim(fn, "out", out, 3, "dim_v", kMlaDimV,
             m1 ? "V is the whole 512-dim row" : "V is the first 512 dims of the latent");
  expect_no_overlap(fn, "out", out);
  expect_aligned(fn, "out", out, kRowAlignBytes, kRowWhy);

  expect_presence(fn, "lse", lse, c.lse, "plan.config.lse");
  if (c.lse) {
    expect_tensor(fn, "lse", lse, dev, kPlanDevice, {DType::kFP32}, "", 3,
                  "[batch, q_len, num_heads]");
    expect_dim(fn, "lse", lse, 0, "batch", q.shape[0], "q's batch");
    expect_dim(fn, "lse", lse, 1, "q_len", q.shape[1], "q's q_len");
    expect_dim(fn, "lse", lse, 2, "num_heads", c.num_heads, "plan.config.num_heads");
    expect_no_overlap(fn, "lse", lse);
  }
}

// The cache a plan's kv_format asks for: dtype, row length, and the words the messages use.
struct CacheSpec {
  DType dtype;
  int row;
  const char* dims;
  const char* why;
};

CacheSpec cache_spec(const MlaConfig& c) {
  constexpr const char* k576 = "[num_blocks, page_size, 1, 576]";
  constexpr const char* k656 = "[num_blocks, page_size, 1, 656]";
  switch (c.kv_format) {
    case MlaCacheFormat::kBF16:
      return {DType::kBF16, kMlaDimQK, k576, "plan.config.kv_format kBF16"};
    case MlaCacheFormat::kFP8E4M3:
      return {DType::kFP8E4M3, kMlaDimQK, k576, "plan.config.kv_format kFP8E4M3"};
    case MlaCacheFormat::kFP8Sparse:
      return {DType::kUINT8, kMlaFp8TokenBytes, k656, "plan.config.kv_format kFP8Sparse"};
    default:
      if (c.sparse) {
        return {DType::kUINT8, kMlaFp8TokenBytes, k656,
                "plan.config.kv_format kDefault: the 656-byte token for sparse decode"};
      }
      return {DType::kBF16, kMlaDimQK, k576, "plan.config.kv_format kDefault: bf16 for dense decode"};
  }
}

void check_cache(const char* fn, const MlaConfig& c, const TensorView& kv) {
  if (is_model1(c)) {
    check_model1_cache(fn, "kv_cache", kv, c.device, c.page_size, "plan.config.page_size");
    return;
  }
  const CacheSpec spec = cache_spec(c);
  expect_tensor(fn, "kv_cache", kv, c.device, kPlanDevice, {spec.dtype}, spec.why, 4, spec.dims);
  expect_dim(fn, "kv_cache", kv, 1, "page_size", c.page_size, "plan.config.page_size");
  expect_dim(fn, "kv_cache", kv, 2, "kv_heads", 1, "one shared latent head");
  if (spec.dtype == DType::kUINT8) {
    expect_dim(fn, "kv_cache", kv, 3, "token_bytes", spec.row,
               "512 e4m3 + 4 fp32 scales + 64 bf16");
  } else {
    expect_dim(fn, "kv_cache", kv, 3, "head_dim", spec.row, "512 NoPE + 64 RoPE");
  }
  expect_aligned(fn, "kv_cache", kv, kRowAlignBytes, kRowWhy);
}

// kv_scale scales a kFP8E4M3 cache; the other formats take none (1), so that a scale meant for
// another cache is not silently dropped.
void check_kv_scale(const char* fn, const MlaConfig& c, float v) {
  if (stored_format(c) == MlaCacheFormat::kFP8E4M3) {
    if (!(std::isfinite(v) && v > 0.f)) {
      fail(fn, "kv_scale", "a finite value > 0 (real = stored e4m3 * kv_scale)", float_string(v));
    }
  } else if (v != 1.f) {
    fail(fn, "kv_scale",
         std::string("1 (only a kFP8E4M3 cache has a per-cache scale; plan.config.kv_format is ") +
             enum_name(c.kv_format) + ")",
         float_string(v));
  }
}

}  // namespace

MlaCacheFormat stored_format(const MlaConfig& c) {
  if (c.kv_format != MlaCacheFormat::kDefault) return c.kv_format;
  return c.sparse ? MlaCacheFormat::kFP8Sparse : MlaCacheFormat::kBF16;
}

int kernel_format(const MlaConfig& c) {
  switch (stored_format(c)) {
    case MlaCacheFormat::kFP8E4M3: return kMlaKvFP8E4M3;
    case MlaCacheFormat::kFP8Sparse: return kMlaKvFP8Sparse;
    case MlaCacheFormat::kModel1: return kMlaKvModel1;
    default: return kMlaKvBF16;
  }
}

void check_model1_cache(const char* fn, std::string_view arg, const TensorView& kv, Device device,
                        int page_size, std::string_view why) {
  expect_tensor(fn, arg, kv, device, kPlanDevice, {DType::kUINT8}, "the 584-byte MODEL1 token", 4,
                "[num_blocks, page_size, 1, 584]");
  expect_dim(fn, arg, kv, 1, "page_size", page_size, why);
  expect_dim(fn, arg, kv, 2, "kv_heads", 1, "one shared latent head");
  expect_dim(fn, arg, kv, 3, "token_bytes", kMlaModel1TokenBytes,
             "448 e4m3 + 64 bf16 + 7 ue8m0 scales + 1 pad");
  if (kv.shape[0] == 0) return;
  // The view's shape, not its addresses: rows sit at slot * 576 and scales after the rows, so
  // only a view with FlashMLA's slot stride describes the page.
  if (kv.shape[1] > 1 && kv.stride[1] != kMlaModel1TokenBytes) {
    fail(fn, arg,
         "the stride of dim 1 (page_size) 584 bytes: the [num_blocks, page_size, 1, 584] view "
         "of MODEL1 pages",
         s(kv.stride[1]) + " bytes");
  }
  const auto page_bytes = static_cast<std::int64_t>(mla_model1_page_bytes(page_size));
  if (kv.shape[0] > 1 && kv.stride[0] < page_bytes) {
    fail(fn, arg,
         "the stride of dim 0 (num_blocks) >= " + s(page_bytes) +
             " bytes (mla_model1_page_bytes(" + s(page_size) +
             "): the page's rows and scales, padded to a multiple of 576)",
         s(kv.stride[0]) + " bytes");
  }
  // Rows are loaded as 16-byte vectors: the data and the block stride keep them aligned (the
  // slot stride, 584, is not an address step).
  TensorView blocks = kv;
  blocks.shape[1] = 1;
  expect_aligned(fn, arg, blocks, kRowAlignBytes, kRowWhy);
}

void check_softmax_scale(const char* fn, const MlaConfig& c, float v) {
  if (!std::isfinite(v) || v < 0.f) {
    fail(fn, "softmax_scale",
         is_model1(c) ? "a finite value >= 0 (0 = 1 / sqrt(512))"
                      : "a finite value >= 0 (0 = 1 / sqrt(576))",
         float_string(v));
  }
}

// The partials are loaded as 16-byte vectors; the backend keeps its sub-buffers 256 bytes apart
// from there.
void check_workspace(const char* fn, const MlaPlan& plan, const void* ws, std::size_t bytes) {
  if (plan.workspace_bytes == 0) return;
  if (ws == nullptr) {
    fail(fn, "workspace",
         s(static_cast<std::int64_t>(plan.workspace_bytes)) + " bytes on " +
             to_string(plan.config.device) + " (plan.workspace_bytes)",
         "nullptr");
  }
  if (bytes < plan.workspace_bytes) {
    fail(fn, "workspace_bytes",
         ">= " + s(static_cast<std::int64_t>(plan.workspace_bytes)) + " (plan.workspace_bytes)",
         s(static_cast<std::int64_t>(bytes)));
  }
  const auto misalign = reinterpret_cast<std::uintptr_t>(ws) % kRowAlignBytes;
  if (misalign != 0) {
    fail(fn, "workspace", "a pointer aligned to 16 bytes",
         "an address " + s(static_cast<std::int64_t>(misalign)) + " bytes past a 16-byte boundary");
  }
}

namespace {

void expect_plan_mode(const char* fn, const MlaPlan& plan, bool sparse) {
  if (plan.config.sparse != sparse) {
    fail(fn, "plan.config.sparse",
         sparse ? "true (a plan made for sparse decode)" : "false (a plan made for dense decode)",
         plan.config.sparse ? "true" : "false");
  }
}

}  // namespace

void check_plan_and_common(const char* fn, const MlaPlan& plan, bool sparse, const TensorView& q,
                           const TensorView& out, const TensorView& lse, const TensorView& kv) {
  const MlaConfig& c = plan.config;
  validate_mla_config(fn, "plan.config", c);
  expect_plan_mode(fn, plan, sparse);
  check_q_out_lse(fn, c, q, out, lse);
  check_cache(fn, c, kv);
}

}  // namespace deca::api::mla

namespace deca {

const char* mla_cache_format_name(MlaCacheFormat format) {
  switch (format) {
    case MlaCacheFormat::kDefault: return "default";
    case MlaCacheFormat::kBF16: return "bf16";
    case MlaCacheFormat::kFP8E4M3: return "fp8_e4m3";
    case MlaCacheFormat::kFP8Sparse: return "fp8_sparse";
    case MlaCacheFormat::kModel1: return "model1";
  }
  return "?";
}

MlaPlan plan_mla_decode(const MlaConfig& config) {
  api::mla::validate_mla_config("plan_mla_decode", "config", config);
  MlaPlan plan;
  plan.config = config;
  if (config.device.kind == DeviceKind::kCUDA) {
    if (config.sparse) {
      cuda::plan_mla_sparse(plan);
    } else {
      cuda::plan_mla_dense(plan);
    }
    return plan;
  }
  plan.num_splits = 1;
  plan.workspace_bytes = 0;
  plan.sm_count = 0;
  return plan;
}

std::string precompile_mla_decode(const MlaConfig& config, int compute_capability) {
  constexpr const char* fn = "precompile_mla_decode";
  MlaConfig c = config;
  // With a capability the device plays no part: validate everything else as a plan would.
  if (compute_capability != 0) c.device = Device::cpu();
  api::mla::validate_mla_config(fn, "config", c);
  if (compute_capability != 0) {
    api::expect_compile_capability(fn, compute_capability);
    return cuda::precompile_mla(config, compute_capability);
  }
  if (config.device.kind != DeviceKind::kCUDA) {
    api::fail(fn, "config.device", "a CUDA device (or a compute_capability to compile for without one)",
              to_string(config.device));
  }
  return cuda::precompile_mla(config, cuda::mla_arch(config, fn));
}

void mla_decode_dense(const MlaPlan& plan, const MlaDenseArgs& a) {
  using namespace api;
  using namespace api::mla;
  constexpr const char* fn = "mla_decode_dense";
  const MlaConfig& c = plan.config;
  check_plan_and_common(fn, plan, false, a.q, a.out, a.lse, a.kv_cache);
  const std::int64_t batch = a.q.shape[0];
  const std::int64_t q_len = a.q.shape[1];
  expect_tensor(fn, "block_table", a.block_table, c.device, kPlanDevice, {DType::kINT32}, "", 2,
                "[batch, max_blocks]");
  expect_dim(fn, "block_table", a.block_table, 0, "batch", batch, "q's batch");
  expect_tensor(fn, "cache_seqlens", a.cache_seqlens, c.device, kPlanDevice, {DType::kINT32}, "",
                1, "[batch]");
  expect_dim(fn, "cache_seqlens", a.cache_seqlens, 0, "batch", batch, "q's batch");
  check_softmax_scale(fn, c, a.softmax_scale);
  check_kv_scale(fn, c, a.kv_scale);
  // The overlap rule (check.hpp): a table or length overwritten mid-run would be read unchecked.
  expect_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                  {{"q", &a.q},
                   {"kv_cache", &a.kv_cache},
                   {"block_table", &a.block_table},
                   {"cache_seqlens", &a.cache_seqlens}});

  const bool on_gpu = c.device.kind == DeviceKind::kCUDA;
  if (on_gpu) check_workspace(fn, plan, a.workspace, a.workspace_bytes);

  // Host data: lengths, and the blocks they use. Device-resident ones are the caller's contract
  // (reading them would cost a copy and a sync per call, and break graph capture): a checked
  // plan's kernels test them instead.
  const std::int64_t max_blocks = a.block_table.shape[1];
  const std::int64_t num_blocks = a.kv_cache.shape[0];
  for (std::int64_t b = 0; !on_gpu && b < batch; ++b) {
    expect_paged_request(fn, {"cache_seqlens", "block_table", "block", "kv_cache's num_blocks"},
                         a.cache_seqlens, a.block_table, b, q_len, c.page_size, c.max_seq_len,
                         num_blocks);
  }

  MlaDenseParams p{};
  p.batch = static_cast<int>(batch);
  p.q_len = static_cast<int>(q_len);
  p.num_heads = c.num_heads;
  p.page_size = c.page_size;
  p.max_blocks = static_cast<int>(max_blocks);
  p.num_blocks = static_cast<int>(num_blocks);
  fill_q(p, a.q);
  p.kv = a.kv_cache.data;
  // Strides in elements of the stored dtype: bf16 elements, or bytes for the 8-bit formats.
  p.kv_stride_block = a.kv_cache.stride[0];
  p.kv_stride_slot = a.kv_cache.stride[1];
  p.kv_format = kernel_format(c);
  p.kv_scale = p.kv_format == kMlaKvFP8E4M3 ? a.kv_scale : 1.f;
  p.block_table = static_cast<const int*>(a.block_table.data);
  p.block_table_stride = a.block_table.stride[0];
  p.seq_lens = static_cast<const int*>(a.cache_seqlens.data);
  fill_out_lse(p, a.out, a.lse, c.lse);
  p.softmax_scale = softmax_scale_or_default(a.softmax_scale, kMlaDimQK);
  p.lse_empty = static_cast<int>(c.lse_of_empty_row);
  if (p.batch == 0) return;
  if (on_gpu) {
    cuda::mla_dense_decode(plan, p, a.workspace, a.stream, a.reuse_schedule);
    return;
  }
  cpu::mla_dense_decode(p);
}

}  // namespace deca
