// The public quantisers and scalar conversions of deca/quant.hpp (host tensors only).
#include "deca/quant.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "cpu/convert.hpp"
#include "cpu/tensor_walk.hpp"
#include "deca/error.hpp"

namespace deca {

float bf16_to_float(std::uint16_t bits) { return cpu::bf16_bits_to_float(bits); }
std::uint16_t float_to_bf16(float value) { return cpu::float_to_bf16_bits(value); }
float fp16_to_float(std::uint16_t bits) { return cpu::fp16_bits_to_float(bits); }
std::uint16_t float_to_fp16(float value) { return cpu::float_to_fp16_bits(value); }
float fp8e4m3_to_float(std::uint8_t bits) { return cpu::fp8e4m3_bits_to_float(bits); }
std::uint8_t float_to_fp8e4m3(float value) { return cpu::float_to_fp8e4m3_bits(value); }

namespace {

constexpr int kMlaNope = 512;
constexpr int kMlaRope = 64;
constexpr int kMlaDim = kMlaNope + kMlaRope;  // 576
constexpr int kMlaGroup = 128;
constexpr int kMlaTokenBytes = kMlaNope + 4 * 4 + kMlaRope * 2;  // 656

[[noreturn]] void fail(const char* fn, const char* arg, const std::string& what) {
  throw Error(std::string(fn) + ": " + arg + ": " + what);
}

void check_host(const char* fn, const char* arg, const TensorView& t) {
  if (!t.defined() || t.data == nullptr) fail(fn, arg, "expected a tensor, got absent or null");
  if (t.device.kind != DeviceKind::kCPU) {
    fail(fn, arg, "expected a cpu tensor, got " + t.describe());
  }
}

void check_float_src(const char* fn, const TensorView& src) {
  check_host(fn, "src", src);
  if (src.dtype != DType::kBF16 && src.dtype != DType::kFP16 && src.dtype != DType::kFP32) {
    fail(fn, "src", std::string("expected dtype bf16|fp16|fp32, got ") + dtype_name(src.dtype));
  }
}

void check_same_shape(const char* fn, const TensorView& src, const TensorView& dst) {
  bool same = src.rank == dst.rank;
  for (int i = 0; same && i < src.rank; ++i) same = src.shape[i] == dst.shape[i];
  if (!same) {
    fail(fn, "dst", "expected the shape of src (" + src.describe() + "), got " + dst.describe());
  }
}

void check_scale(const char* fn, float scale) {
  if (!(std::isfinite(scale) && scale > 0.f)) {
    fail(fn, "scale", "expected a finite value > 0, got " + std::to_string(scale));
  }
}

float load_float(const void* base, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::kBF16: return cpu::bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kFP16: return cpu::fp16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    default: return static_cast<const float*>(base)[offset];
  }
}

float max_abs(const char* fn, const TensorView& src) {
  float m = 0.f;
  bool finite = true;
  cpu::for_each_offset(src, [&](std::int64_t o) {
    const float a = std::fabs(load_float(src.data, src.dtype, o));
    if (!std::isfinite(a)) finite = false;
    if (a > m) m = a;
  });
  if (!finite) fail(fn, "src", "expected finite values, got a NaN or infinity");
  return m;
}

// The view of all but the last dimension: one element per token.
TensorView leading(const TensorView& t) {
  TensorView lead = t;
  lead.rank = t.rank - 1;
  return lead;
}

void check_token_tensor(const char* fn, const char* arg, const TensorView& t, int last) {
  if (t.rank < 1 || t.shape[t.rank - 1] != last) {
    fail(fn, arg, "expected shape [..., " + std::to_string(last) + "], got " + t.describe());
  }
}

void check_same_leading(const char* fn, const TensorView& src, const TensorView& dst) {
  bool same = src.rank == dst.rank;
  for (int i = 0; same && i + 1 < src.rank; ++i) same = src.shape[i] == dst.shape[i];
  if (!same) {
    fail(fn, "dst", "expected the leading dimensions of src (" + src.describe() + "), got " +
                        dst.describe());
  }
}

// Smallest power of two s with amax / s <= 448 (exact: no log rounding decides the result).
float mla_group_scale(float amax) {
  if (amax == 0.f) return 1.f;
  int e = static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / cpu::kFp8E4M3Max)));
  while (std::ldexp(static_cast<double>(cpu::kFp8E4M3Max), e - 1) >= amax) --e;
  while (std::ldexp(static_cast<double>(cpu::kFp8E4M3Max), e) < amax) ++e;
  return std::ldexp(1.f, e);
}

}  // namespace

float choose_fp8_scale(const TensorView& src) {
  check_float_src("choose_fp8_scale", src);
  const float m = max_abs("choose_fp8_scale", src);
  return m == 0.f ? 1.f : m / cpu::kFp8E4M3Max;
}

float choose_int8_scale(const TensorView& src) {
  check_float_src("choose_int8_scale", src);
  const float m = max_abs("choose_int8_scale", src);
  return m == 0.f ? 1.f : m / cpu::kInt8Max;
}

void quantize_fp8(const TensorView& src, const TensorView& dst, float scale) {
  const char* fn = "quantize_fp8";
  check_float_src(fn, src);
  check_host(fn, "dst", dst);
  if (dst.dtype != DType::kFP8E4M3) {
    fail(fn, "dst", std::string("expected dtype fp8_e4m3, got ") + dtype_name(dst.dtype));
  }
  check_same_shape(fn, src, dst);
  check_scale(fn, scale);
  auto* out = static_cast<std::uint8_t*>(dst.data);
  cpu::for_each_offset_pair(src, dst, [&](std::int64_t os, std::int64_t od) {
    out[od] = cpu::float_to_fp8e4m3_bits(load_float(src.data, src.dtype, os) / scale);
  });
}

void quantize_int8(const TensorView& src, const TensorView& dst, float scale) {
  const char* fn = "quantize_int8";
  check_float_src(fn, src);
  check_host(fn, "dst", dst);
  if (dst.dtype != DType::kINT8) {
    fail(fn, "dst", std::string("expected dtype int8, got ") + dtype_name(dst.dtype));
  }
  check_same_shape(fn, src, dst);
  check_scale(fn, scale);
  auto* out = static_cast<std::int8_t*>(dst.data);
  cpu::for_each_offset_pair(src, dst, [&](std::int64_t os, std::int64_t od) {
    const float x = load_float(src.data, src.dtype, os) / scale;
    // NaN has no int8 code; it is stored as 0 rather than left undefined.
    const float r = std::isnan(x) ? 0.f : std::nearbyint(x);
    out[od] = static_cast<std::int8_t>(std::fmax(-cpu::kInt8Max, std::fmin(cpu::kInt8Max, r)));
  });
}

void pack_mla_fp8(const TensorView& src, const TensorView& dst) {
  const char* fn = "pack_mla_fp8";
  check_host(fn, "src", src);
  if (src.dtype != DType::kBF16) {
    fail(fn, "src", std::string("expected dtype bf16, got ") + dtype_name(src.dtype));
  }
  check_token_tensor(fn, "src", src, kMlaDim);
  check_host(fn, "dst", dst);
  if (dst.dtype != DType::kUINT8) {
    fail(fn, "dst", std::string("expected dtype uint8, got ") + dtype_name(dst.dtype));
  }
  check_token_tensor(fn, "dst", dst, kMlaTokenBytes);
  if (dst.stride[dst.rank - 1] != 1) {
    fail(fn, "dst", "expected a contiguous last dimension (stride 1), got stride " +
                        std::to_string(dst.stride[dst.rank - 1]));
  }
  check_same_leading(fn, src, dst);
  // Check every value before writing anything.
  max_abs(fn, src);

  const auto* in = static_cast<const std::uint16_t*>(src.data);
  auto* out = static_cast<std::uint8_t*>(dst.data);
  const std::int64_t sd = src.stride[src.rank - 1];
  cpu::for_each_offset_pair(leading(src), leading(dst), [&](std::int64_t os, std::int64_t od) {
    const std::uint16_t* x = in + os;
    std::uint8_t* token = out + od;
    for (int g = 0; g < kMlaNope / kMlaGroup; ++g) {
      float amax = 0.f;
      for (int i = g * kMlaGroup; i < (g + 1) * kMlaGroup; ++i) {
        amax = std::fmax(amax, std::fabs(cpu::bf16_bits_to_float(x[i * sd])));
      }
      const float scale = mla_group_scale(amax);
      for (int i = g * kMlaGroup; i < (g + 1) * kMlaGroup; ++i) {
        token[i] = cpu::float_to_fp8e4m3_bits(cpu::bf16_bits_to_float(x[i * sd]) / scale);
      }
      std::memcpy(token + kMlaNope + 4 * g, &scale, 4);
    }
    for (int i = 0; i < kMlaRope; ++i) {
      const std::uint16_t r = x[(kMlaNope + i) * sd];
      std::memcpy(token + kMlaNope + 16 + 2 * i, &r, 2);
    }
  });
}

void unpack_mla_fp8(const TensorView& src, const TensorView& dst) {
  const char* fn = "unpack_mla_fp8";
  check_host(fn, "src", src);
  if (src.dtype != DType::kUINT8) {
    fail(fn, "src", std::string("expected dtype uint8, got ") + dtype_name(src.dtype));
  }
  check_token_tensor(fn, "src", src, kMlaTokenBytes);
  if (src.stride[src.rank - 1] != 1) {
    fail(fn, "src", "expected a contiguous last dimension (stride 1), got stride " +
                        std::to_string(src.stride[src.rank - 1]));
  }
  check_host(fn, "dst", dst);
  if (dst.dtype != DType::kFP32 && dst.dtype != DType::kBF16) {
    fail(fn, "dst", std::string("expected dtype fp32|bf16, got ") + dtype_name(dst.dtype));
  }
  check_token_tensor(fn, "dst", dst, kMlaDim);
  check_same_leading(fn, src, dst);

  const auto* in = static_cast<const std::uint8_t*>(src.data);
  const std::int64_t dd = dst.stride[dst.rank - 1];
  const bool to_bf16 = dst.dtype == DType::kBF16;
  const float* fp8 = cpu::fp8e4m3_table();
  cpu::for_each_offset_pair(leading(src), leading(dst), [&](std::int64_t os, std::int64_t od) {
    const std::uint8_t* token = in + os;
    auto store = [&](int i, float v) {
      if (to_bf16) {
        static_cast<std::uint16_t*>(dst.data)[od + i * dd] = cpu::float_to_bf16_bits(v);
      } else {
        static_cast<float*>(dst.data)[od + i * dd] = v;
      }
    };
    for (int i = 0; i < kMlaNope; ++i) {
      float scale;
      std::memcpy(&scale, token + kMlaNope + 4 * (i / kMlaGroup), 4);
      store(i, fp8[token[i]] * scale);
    }
    for (int i = 0; i < kMlaRope; ++i) {
      std::uint16_t r;
      std::memcpy(&r, token + kMlaNope + 16 + 2 * i, 2);
      store(kMlaNope + i, cpu::bf16_bits_to_float(r));
    }
  });
}

}  // namespace deca
