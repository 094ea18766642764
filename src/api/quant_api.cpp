// The public quantisers of deca/quant.hpp: argument checks, then the element loops of
// src/cpu/quant.cpp. Every check runs before anything is written; `out` may share no byte with
// `src` (a quantiser writing into its own input would read values it has already replaced).
#include <cmath>
#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "cpu/quant.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "deca/quant.hpp"

namespace deca {

namespace {

constexpr int kMlaDim = 576;          // 512 NoPE + 64 RoPE
constexpr int kMlaTokenBytes = 656;   // 512 e4m3 + 4 fp32 scales + 64 bf16
constexpr const char* kHostWhy = "the quantisers run on the host";
constexpr const char* kAnyDims = "[...]";

// Any rank and any non-negative strides: the quantisers walk views element by element.
void check_host_tensor(const char* fn, const char* arg, const TensorView& t,
                       std::initializer_list<DType> dtypes) {
  using namespace api;
  expect_present(fn, arg, t, kAnyDims);
  expect_device(fn, arg, t, Device::cpu(), kHostWhy);
  expect_dtype_in(fn, arg, t, dtypes, "");
  expect_sizes(fn, arg, t);
  expect_non_negative_strides(fn, arg, t);
  expect_byte_span(fn, arg, t);
  expect_aligned(fn, arg, t, dtype_size(t.dtype), "the element size");
}

void check_float_src(const char* fn, const TensorView& src) {
  check_host_tensor(fn, "src", src, {DType::kBF16, DType::kFP16, DType::kFP32});
}

// out: written once per element, and disjoint from src.
void check_out(const char* fn, const TensorView& src, const TensorView& out,
               std::initializer_list<DType> dtypes) {
  check_host_tensor(fn, "out", out, dtypes);
  api::expect_no_overlap(fn, "out", out);
  api::expect_disjoint(fn, {{"out", &out}}, {{"src", &src}});
}

void check_same_shape(const char* fn, const TensorView& src, const TensorView& out) {
  bool same = src.rank == out.rank;
  for (int i = 0; same && i < src.rank; ++i) same = src.shape[i] == out.shape[i];
  if (!same) api::fail(fn, "out", "the shape of src (" + src.describe() + ")", out.describe());
}

void check_scale(const char* fn, float scale) {
  if (!(std::isfinite(scale) && scale > 0.f)) {
    api::fail(fn, "scale", "a finite value > 0", api::float_string(scale));
  }
}

float finite_max_abs(const char* fn, const TensorView& src) {
  const float m = cpu::max_abs(src);
  if (!std::isfinite(m)) api::fail(fn, "src", "finite values", "a NaN or infinity");
  return m;
}

void check_token_tensor(const char* fn, const char* arg, const TensorView& t, int last) {
  if (t.rank < 1 || t.shape[t.rank - 1] != last) {
    api::fail(fn, arg, "shape [..., " + std::to_string(last) + "]", t.describe());
  }
  // numpy 2 gives empty arrays zero strides: a view without tokens has no layout to check.
  bool has_tokens = true;
  for (int i = 0; i < t.rank; ++i) has_tokens = has_tokens && t.shape[i] > 0;
  if (has_tokens && t.stride[t.rank - 1] != 1 && last == kMlaTokenBytes) {
    api::fail(fn, arg, "a contiguous last dimension (stride 1)",
              "stride " + std::to_string(t.stride[t.rank - 1]));
  }
}

void check_same_leading(const char* fn, const TensorView& src, const TensorView& out) {
  bool same = src.rank == out.rank;
  for (int i = 0; same && i + 1 < src.rank; ++i) same = src.shape[i] == out.shape[i];
  if (!same) {
    api::fail(fn, "out", "the leading dimensions of src (" + src.describe() + ")",
              out.describe());
  }
}

// The token formats the packers write: the 656-byte one (kFP8Sparse, kDefault) or MODEL1's.
MlaCacheFormat packer_format(const char* fn, MlaCacheFormat f) {
  if (f == MlaCacheFormat::kDefault || f == MlaCacheFormat::kFP8Sparse ||
      f == MlaCacheFormat::kModel1) {
    return f;
  }
  const char* name = mla_cache_format_name(f);
  api::fail(fn, "format",
            "kFP8Sparse (fp8_sparse), kDefault (the same) or kModel1 (model1): the sparse "
            "caches' token formats",
            std::string(name) == "?" ? std::to_string(static_cast<int>(f)) : std::string(name));
}

// MODEL1 values: [num_blocks, page_size, 1, 512].
void check_model1_values(const char* fn, const char* arg, const TensorView& t) {
  if (t.rank != 4 || t.shape[2] != 1 || t.shape[3] != kMlaModel1DimQK) {
    api::fail(fn, arg, "shape [num_blocks, page_size, 1, 512] (format kModel1)", t.describe());
  }
}

// MODEL1 pages: the [num_blocks, page_size, 1, 584] byte view of deca/mla.hpp (kModel1).
void check_model1_pages(const char* fn, const char* arg, const TensorView& t) {
  if (t.rank != 4 || t.shape[2] != 1 || t.shape[3] != kMlaModel1TokenBytes) {
    api::fail(fn, arg, "shape [num_blocks, page_size, 1, 584] (format kModel1)", t.describe());
  }
  if (t.shape[0] == 0 || t.shape[1] == 0) return;
  if (t.stride[3] != 1) {
    api::fail(fn, arg, "a contiguous last dimension (stride 1)",
              "stride " + std::to_string(t.stride[3]));
  }
  if (t.shape[1] > 1 && t.stride[1] != kMlaModel1TokenBytes) {
    api::fail(fn, arg, "the stride of dim 1 (page_size) 584 bytes (the MODEL1 page view)",
              std::to_string(t.stride[1]) + " bytes");
  }
  const auto page = static_cast<std::int64_t>(mla_model1_page_bytes(static_cast<int>(t.shape[1])));
  if (t.shape[0] > 1 && t.stride[0] < page) {
    api::fail(fn, arg,
              "the stride of dim 0 (num_blocks) >= " + std::to_string(page) +
                  " bytes (mla_model1_page_bytes(" + std::to_string(t.shape[1]) + "))",
              std::to_string(t.stride[0]) + " bytes");
  }
}

}  // namespace

float choose_fp8_scale(const TensorView& src) {
  check_float_src("choose_fp8_scale", src);
  const float m = finite_max_abs("choose_fp8_scale", src);
  return m == 0.f ? 1.f : m / 448.f;
}

float choose_int8_scale(const TensorView& src) {
  check_float_src("choose_int8_scale", src);
  const float m = finite_max_abs("choose_int8_scale", src);
  return m == 0.f ? 1.f : m / 127.f;
}

void quantize_fp8(const TensorView& src, const TensorView& out, float scale) {
  const char* fn = "quantize_fp8";
  check_float_src(fn, src);
  check_out(fn, src, out, {DType::kFP8E4M3});
  check_same_shape(fn, src, out);
  check_scale(fn, scale);
  cpu::quantize_fp8(src, out, scale);
}

void quantize_int8(const TensorView& src, const TensorView& out, float scale) {
  const char* fn = "quantize_int8";
  check_float_src(fn, src);
  check_out(fn, src, out, {DType::kINT8});
  check_same_shape(fn, src, out);
  check_scale(fn, scale);
  cpu::quantize_int8(src, out, scale);
}

void pack_mla_fp8(const TensorView& src, const TensorView& out, MlaCacheFormat format) {
  const char* fn = "pack_mla_fp8";
  if (packer_format(fn, format) == MlaCacheFormat::kModel1) {
    check_host_tensor(fn, "src", src, {DType::kBF16});
    check_model1_values(fn, "src", src);
    check_out(fn, src, out, {DType::kUINT8});
    check_model1_pages(fn, "out", out);
    check_same_leading(fn, src, out);
    finite_max_abs(fn, src);
    cpu::pack_mla_model1(src, out);
    return;
  }
  check_host_tensor(fn, "src", src, {DType::kBF16});
  check_token_tensor(fn, "src", src, kMlaDim);
  check_out(fn, src, out, {DType::kUINT8});
  check_token_tensor(fn, "out", out, kMlaTokenBytes);
  check_same_leading(fn, src, out);
  finite_max_abs(fn, src);  // every value checked before anything is written
  cpu::pack_mla_fp8(src, out);
}

float quantize_mla_fp8_e4m3(const TensorView& src, const TensorView& out) {
  const char* fn = "quantize_mla_fp8_e4m3";
  check_host_tensor(fn, "src", src, {DType::kBF16});
  check_token_tensor(fn, "src", src, kMlaDim);
  check_out(fn, src, out, {DType::kFP8E4M3});
  check_same_shape(fn, src, out);
  const float scale = cpu::fp8_pow2_scale(finite_max_abs(fn, src));
  cpu::quantize_fp8(src, out, scale);
  return scale;
}

void unpack_mla_fp8(const TensorView& src, const TensorView& out, MlaCacheFormat format) {
  const char* fn = "unpack_mla_fp8";
  if (packer_format(fn, format) == MlaCacheFormat::kModel1) {
    check_host_tensor(fn, "src", src, {DType::kUINT8});
    check_model1_pages(fn, "src", src);
    check_out(fn, src, out, {DType::kFP32, DType::kBF16});
    check_model1_values(fn, "out", out);
    check_same_leading(fn, src, out);
    cpu::unpack_mla_model1(src, out);
    return;
  }
  check_host_tensor(fn, "src", src, {DType::kUINT8});
  check_token_tensor(fn, "src", src, kMlaTokenBytes);
  check_out(fn, src, out, {DType::kFP32, DType::kBF16});
  check_token_tensor(fn, "out", out, kMlaDim);
  check_same_leading(fn, src, out);
  cpu::unpack_mla_fp8(src, out);
}

}  // namespace deca
