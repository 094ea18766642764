// The element loops of the quantisers and the public scalar conversions of deca/quant.hpp.
#include "cpu/quant.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/convert.hpp"
#include "cpu/model1_layout.hpp"
#include "cpu/tensor_walk.hpp"
#include "deca/quant.hpp"

namespace deca {

float bf16_to_float(std::uint16_t bits) { return cpu::bf16_bits_to_float(bits); }
std::uint16_t float_to_bf16(float value) { return cpu::float_to_bf16_bits(value); }
float fp16_to_float(std::uint16_t bits) { return cpu::fp16_bits_to_float(bits); }
std::uint16_t float_to_fp16(float value) { return cpu::float_to_fp16_bits(value); }
float fp8e4m3_to_float(std::uint8_t bits) { return cpu::fp8e4m3_bits_to_float(bits); }
std::uint8_t float_to_fp8e4m3(float value) { return cpu::float_to_fp8e4m3_bits(value); }

}  // namespace deca

namespace deca::cpu {

namespace {

constexpr int kMlaNope = 512;
constexpr int kMlaRope = 64;
constexpr int kMlaGroup = 128;
// FlashMLA's packer floors the tile scale at 2^ceil(log2(1e-4)) = 2^-13; so does deca's, so
// that both write the same bytes.
constexpr int kM1MinScaleExp = -13;

float load_float(const void* base, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::kBF16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kFP16: return fp16_bits_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    default: return static_cast<const float*>(base)[offset];
  }
}

// The view of all but the last dimension: one element per token.
TensorView leading(const TensorView& t) {
  TensorView lead = t;
  lead.rank = t.rank - 1;
  return lead;
}

}  // namespace

// Exact: the log only guesses the exponent, the comparisons decide it.
float fp8_pow2_scale(float amax) {
  if (amax == 0.f) return 1.f;
  int e = static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / kFp8E4M3Max)));
  while (std::ldexp(static_cast<double>(kFp8E4M3Max), e - 1) >= amax) --e;
  while (std::ldexp(static_cast<double>(kFp8E4M3Max), e) < amax) ++e;
  return std::ldexp(1.f, e);
}

float max_abs(const TensorView& src) {
  float m = 0.f;
  bool finite = true;
  for_each_offset(src, [&](std::int64_t o) {
    const float a = std::fabs(load_float(src.data, src.dtype, o));
    if (!std::isfinite(a)) finite = false;
    if (a > m) m = a;
  });
  return finite ? m : NAN;
}

void quantize_fp8(const TensorView& src, const TensorView& out, float scale) {
  auto* dst = static_cast<std::uint8_t*>(out.data);
  for_each_offset_pair(src, out, [&](std::int64_t os, std::int64_t od) {
    dst[od] = float_to_fp8e4m3_bits(load_float(src.data, src.dtype, os) / scale);
  });
}

void quantize_int8(const TensorView& src, const TensorView& out, float scale) {
  auto* dst = static_cast<std::int8_t*>(out.data);
  for_each_offset_pair(src, out, [&](std::int64_t os, std::int64_t od) {
    const float x = load_float(src.data, src.dtype, os) / scale;
    // NaN has no int8 code; it is stored as 0 rather than left undefined.
    const float r = std::isnan(x) ? 0.f : std::nearbyint(x);
    dst[od] = static_cast<std::int8_t>(std::fmax(-kInt8Max, std::fmin(kInt8Max, r)));
  });
}

void pack_mla_fp8(const TensorView& src, const TensorView& out) {
  const auto* in = static_cast<const std::uint16_t*>(src.data);
  auto* dst = static_cast<std::uint8_t*>(out.data);
  const std::int64_t sd = src.stride[src.rank - 1];
  for_each_offset_pair(leading(src), leading(out), [&](std::int64_t os, std::int64_t od) {
    const std::uint16_t* x = in + os;
    std::uint8_t* token = dst + od;
    for (int g = 0; g < kMlaNope / kMlaGroup; ++g) {
      float amax = 0.f;
      for (int i = g * kMlaGroup; i < (g + 1) * kMlaGroup; ++i) {
        amax = std::fmax(amax, std::fabs(bf16_bits_to_float(x[i * sd])));
      }
      const float scale = fp8_pow2_scale(amax);
      for (int i = g * kMlaGroup; i < (g + 1) * kMlaGroup; ++i) {
        token[i] = float_to_fp8e4m3_bits(bf16_bits_to_float(x[i * sd]) / scale);
      }
      std::memcpy(token + kMlaNope + 4 * g, &scale, 4);
    }
    for (int i = 0; i < kMlaRope; ++i) {
      const std::uint16_t r = x[(kMlaNope + i) * sd];
      std::memcpy(token + kMlaNope + 16 + 2 * i, &r, 2);
    }
  });
}

void pack_mla_model1(const TensorView& src, const TensorView& out) {
  const auto* in = static_cast<const std::uint16_t*>(src.data);
  auto* dst = static_cast<std::uint8_t*>(out.data);
  const std::int64_t sd = src.stride[3];
  const int page_size = static_cast<int>(src.shape[1]);
  for (std::int64_t blk = 0; blk < src.shape[0]; ++blk) {
    std::uint8_t* page = dst + blk * out.stride[0];
    for (int slot = 0; slot < page_size; ++slot) {
      const std::uint16_t* x = in + blk * src.stride[0] + slot * src.stride[1];
      std::uint8_t* row = page + model1_row_offset(slot);
      std::uint8_t* scales = page + model1_scale_offset(page_size, slot);
      for (int t = 0; t < kModel1Tiles; ++t) {
        float amax = 0.f;
        for (int i = t * kModel1Tile; i < (t + 1) * kModel1Tile; ++i) {
          amax = std::fmax(amax, std::fabs(bf16_bits_to_float(x[i * sd])));
        }
        const float floor = std::ldexp(1.f, kM1MinScaleExp);
        const float scale = amax == 0.f ? floor : std::fmax(fp8_pow2_scale(amax), floor);
        for (int i = t * kModel1Tile; i < (t + 1) * kModel1Tile; ++i) {
          row[i] = float_to_fp8e4m3_bits(bf16_bits_to_float(x[i * sd]) / scale);
        }
        scales[t] = static_cast<std::uint8_t>(std::ilogb(scale) + 127);
      }
      scales[kModel1Tiles] = 0;  // the pad byte: no reader looks at it; written for determinism
      for (int i = 0; i < kMlaRope; ++i) {
        const std::uint16_t r = x[(kModel1Nope + i) * sd];
        std::memcpy(row + kModel1Nope + 2 * i, &r, 2);
      }
    }
  }
}

void unpack_mla_model1(const TensorView& src, const TensorView& out) {
  const auto* in = static_cast<const std::uint8_t*>(src.data);
  const std::int64_t dd = out.stride[3];
  const bool to_bf16 = out.dtype == DType::kBF16;
  const float* fp8 = fp8e4m3_table();
  const int page_size = static_cast<int>(src.shape[1]);
  for (std::int64_t blk = 0; blk < src.shape[0]; ++blk) {
    const std::uint8_t* page = in + blk * src.stride[0];
    for (int slot = 0; slot < page_size; ++slot) {
      const std::int64_t od = blk * out.stride[0] + slot * out.stride[1];
      auto store = [&](int i, float v) {
        if (to_bf16) {
          static_cast<std::uint16_t*>(out.data)[od + i * dd] = float_to_bf16_bits(v);
        } else {
          static_cast<float*>(out.data)[od + i * dd] = v;
        }
      };
      const std::uint8_t* row = page + model1_row_offset(slot);
      const std::uint8_t* scales = page + model1_scale_offset(page_size, slot);
      for (int i = 0; i < kModel1Nope; ++i) {
        store(i, fp8[row[i]] * ue8m0_to_float(scales[i / kModel1Tile]));
      }
      for (int i = 0; i < kMlaRope; ++i) {
        std::uint16_t r;
        std::memcpy(&r, row + kModel1Nope + 2 * i, 2);
        store(kModel1Nope + i, bf16_bits_to_float(r));
      }
    }
  }
}

void unpack_mla_fp8(const TensorView& src, const TensorView& out) {
  const auto* in = static_cast<const std::uint8_t*>(src.data);
  const std::int64_t dd = out.stride[out.rank - 1];
  const bool to_bf16 = out.dtype == DType::kBF16;
  const float* fp8 = fp8e4m3_table();
  for_each_offset_pair(leading(src), leading(out), [&](std::int64_t os, std::int64_t od) {
    const std::uint8_t* token = in + os;
    auto store = [&](int i, float v) {
      if (to_bf16) {
        static_cast<std::uint16_t*>(out.data)[od + i * dd] = float_to_bf16_bits(v);
      } else {
        static_cast<float*>(out.data)[od + i * dd] = v;
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
      store(kMlaNope + i, bf16_bits_to_float(r));
    }
  });
}

}  // namespace deca::cpu
