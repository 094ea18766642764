// Per-tensor FP8/INT8 quantisers, the MLA 656-byte token packer and the MLA dense e4m3 cache
// quantiser (deca/quant.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensor.hpp"
#include "common/test_seed.hpp"
#include "deca/error.hpp"
#include "deca/quant.hpp"

namespace deca::test {
namespace {

// Expects fn to throw a deca::Error whose message contains every piece.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<const char*> pieces) {
  try {
    fn();
    ADD_FAILURE() << "no deca::Error thrown";
  } catch (const Error& e) {
    for (const char* p : pieces) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, float sigma, std::mt19937_64& rng) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<float> n(0.f, sigma);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
  return t;
}

float max_abs(const HostTensor& t) {
  float m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.get(i)));
  return m;
}

TEST(Quant, ChooseScale) {
  HostTensor t(DType::kFP32, {2, 3});
  EXPECT_EQ(choose_fp8_scale(t.view()), 1.f);  // all zeros
  EXPECT_EQ(choose_int8_scale(t.view()), 1.f);
  t.set(4, -3.5f);
  t.set(1, 2.f);
  EXPECT_FLOAT_EQ(choose_fp8_scale(t.view()), 3.5f / 448.f);
  EXPECT_FLOAT_EQ(choose_int8_scale(t.view()), 3.5f / 127.f);
}

TEST(Quant, Fp8RoundTripErrorBound) {
  DECA_SEED_TRACE();
  auto rng = make_rng(21);
  for (DType src_dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    HostTensor x = random_tensor(src_dtype, {64, 96}, 2.f, rng);
    HostTensor q(DType::kFP8E4M3, {64, 96});
    const float scale = choose_fp8_scale(x.view());
    quantize_fp8(x.view(), q.view(), scale);
    bool hit_max = false;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.get(i), r = q.get(i) * scale;
      // Half a unit in the last place: 2^-4 relative for normals, half the subnormal step
      // (2^-10 in units of scale) below.
      EXPECT_LE(std::fabs(v - r), std::fabs(v) * 0x1p-4f + scale * 0x1p-10f * 1.0001f) << i;
      hit_max |= std::fabs(q.get(i)) == 448.f;
    }
    EXPECT_TRUE(hit_max);  // max |x| maps onto the top of the range
  }
}

TEST(Quant, Int8RoundTripErrorBoundAndClamp) {
  DECA_SEED_TRACE();
  auto rng = make_rng(22);
  HostTensor x = random_tensor(DType::kBF16, {50, 64}, 1.f, rng);
  HostTensor q(DType::kINT8, {50, 64});
  const float scale = choose_int8_scale(x.view());
  quantize_int8(x.view(), q.view(), scale);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_LE(std::fabs(x.get(i) - q.get(i) * scale), scale * 0.5f * 1.0001f) << i;
  }
  // A scale too small: values beyond 127 * scale clamp to +-127, never -128.
  quantize_int8(x.view(), q.view(), scale / 4);
  int clamped = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_GE(q.get(i), -127.f);
    EXPECT_LE(q.get(i), 127.f);
    if (std::fabs(x.get(i)) / (scale / 4) >= 127.5f) {
      EXPECT_EQ(q.get(i), x.get(i) > 0 ? 127.f : -127.f);
      ++clamped;
    }
  }
  EXPECT_GT(clamped, 0);
  // Round to nearest (ties to even), by hand.
  HostTensor h(DType::kFP32, {5}), hq(DType::kINT8, {5});
  const float vals[5] = {0.5f, 1.5f, -2.5f, 2.4f, -2.6f};
  for (int i = 0; i < 5; ++i) h.set(i, vals[i]);
  quantize_int8(h.view(), hq.view(), 1.f);
  const float want[5] = {0.f, 2.f, -2.f, 2.f, -3.f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(hq.get(i), want[i]) << i;
}

TEST(Quant, StridedViews) {
  DECA_SEED_TRACE();
  auto rng = make_rng(23);
  HostTensor x = random_tensor(DType::kFP32, {6, 10}, 1.f, rng);
  HostTensor q(DType::kFP8E4M3, {10, 6});
  // src transposed [10, 6] view of the [6, 10] buffer; dst contiguous [10, 6].
  TensorView src = make_tensor(x.raw(), DType::kFP32, {10, 6}, {1, 10});
  quantize_fp8(src, q.view(), 0.01f);
  for (int r = 0; r < 10; ++r)
    for (int c = 0; c < 6; ++c)
      EXPECT_EQ(q.data<std::uint8_t>()[r * 6 + c], float_to_fp8e4m3(x.get(c * 10 + r) / 0.01f));
}

TEST(Quant, ArgumentErrorsNameTheArgumentAndWriteNothing) {
  HostTensor x(DType::kFP32, {4, 8}), q8(DType::kINT8, {4, 8}), f8(DType::kFP8E4M3, {4, 8});
  HostTensor small(DType::kFP8E4M3, {4, 7});
  f8.fill_bytes(0x5A);
  q8.fill_bytes(0x5A);
  expect_error([&] { quantize_fp8(x.view(), q8.view(), 1.f); }, {"quantize_fp8", "out", "fp8_e4m3", "int8"});
  expect_error([&] { quantize_int8(x.view(), f8.view(), 1.f); }, {"quantize_int8", "out", "int8", "fp8_e4m3"});
  expect_error([&] { quantize_fp8(x.view(), small.view(), 1.f); }, {"quantize_fp8", "out", "[4, 7]"});
  expect_error([&] { quantize_fp8(x.view(), f8.view(), 0.f); }, {"quantize_fp8", "scale"});
  expect_error([&] { quantize_int8(x.view(), q8.view(), NAN); }, {"quantize_int8", "scale"});
  expect_error([&] { quantize_fp8(q8.view(), f8.view(), 1.f); }, {"quantize_fp8", "src", "int8"});
  expect_error([&] { quantize_fp8(TensorView{}, f8.view(), 1.f); }, {"quantize_fp8", "src", "absent"});
  TensorView on_gpu = x.view();
  on_gpu.device = Device::cuda(0);
  expect_error([&] { quantize_fp8(on_gpu, f8.view(), 1.f); }, {"quantize_fp8", "src", "cpu", "cuda:0"});
  expect_error([&] { choose_fp8_scale(on_gpu); }, {"choose_fp8_scale", "src", "cuda:0"});
  x.set(3, NAN);
  expect_error([&] { choose_int8_scale(x.view()); }, {"choose_int8_scale", "src", "NaN"});
  for (std::int64_t i = 0; i < 32; ++i) {
    ASSERT_EQ(f8.data<std::uint8_t>()[i], 0x5A);
    ASSERT_EQ(q8.data<std::uint8_t>()[i], 0x5A);
  }
}

// ---------------------------------------------------------------------------------------------
// MLA 656-byte tokens.

float token_scale(const HostTensor& packed, std::int64_t token, int group) {
  float s;
  std::memcpy(&s, packed.data<std::uint8_t>() + token * 656 + 512 + 4 * group, 4);
  return s;
}

TEST(MlaPack, HandToken) {
  HostTensor x(DType::kBF16, {576}), p(DType::kUINT8, {656});
  for (int i = 0; i < 128; ++i) x.set(i, 1.f);           // group 0: all ones
  for (int i = 128; i < 256; ++i) x.set(i, i == 200 ? -448.f : 0.5f);  // group 1: max exactly 448
  // group 2 stays zero; group 3: max 449 (just past 448)
  for (int i = 384; i < 512; ++i) x.set(i, i == 400 ? 449.f : 0.f);  // bf16(449) = 448, see below
  for (int i = 512; i < 576; ++i) x.set(i, 0.25f * (i - 540));
  pack_mla_fp8(x.view(), p.view());
  // 1 / 448 < 2^-8 and 1 / 2^-9 > 448: scale 2^-8, and 1.0 / 2^-8 = 256 = e4m3 0x78.
  EXPECT_EQ(token_scale(p, 0, 0), 0x1p-8f);
  for (int i = 0; i < 128; ++i) ASSERT_EQ(p.data<std::uint8_t>()[i], 0x78) << i;
  EXPECT_EQ(token_scale(p, 0, 1), 1.f);
  EXPECT_EQ(p.data<std::uint8_t>()[200], 0xFE);  // -448
  EXPECT_EQ(p.data<std::uint8_t>()[130], 0x30);  // 0.5
  EXPECT_EQ(token_scale(p, 0, 2), 1.f);          // an all-zero group
  for (int i = 256; i < 384; ++i) ASSERT_EQ(p.data<std::uint8_t>()[i], 0) << i;
  // bf16 has 8 significant bits: 449 rounds to 448, so the scale stays 1.
  EXPECT_EQ(token_scale(p, 0, 3), 1.f);
  for (int i = 0; i < 64; ++i) {
    std::uint16_t r;
    std::memcpy(&r, p.data<std::uint8_t>() + 528 + 2 * i, 2);
    ASSERT_EQ(r, x.data<std::uint16_t>()[512 + i]) << i;  // RoPE copied bit for bit
  }
  // Past 448 by a bf16 step: scale 2.
  x.set(400, 450.f);
  pack_mla_fp8(x.view(), p.view());
  EXPECT_EQ(token_scale(p, 0, 3), 2.f);
}

TEST(MlaPack, RoundTrip) {
  DECA_SEED_TRACE();
  auto rng = make_rng(24);
  const int tokens = 3 * 5;
  HostTensor x(DType::kBF16, {3, 5, 576});
  std::normal_distribution<float> n(0.f, 1.f);
  std::uniform_int_distribution<int> mag(-20, 12);
  for (int t = 0; t < tokens; ++t) {
    for (int g = 0; g < 4; ++g) {
      const float m = (t + g) % 7 == 3 ? 0.f : std::ldexp(1.f, mag(rng));  // some zero groups
      for (int i = 0; i < 128; ++i) x.set(t * 576 + g * 128 + i, m * n(rng));
    }
    for (int i = 512; i < 576; ++i) x.set(t * 576 + i, n(rng));
  }
  HostTensor p(DType::kUINT8, {3, 5, 656}), back(DType::kFP32, {3, 5, 576}), back16(DType::kBF16, {3, 5, 576});
  pack_mla_fp8(x.view(), p.view());
  unpack_mla_fp8(p.view(), back.view());
  unpack_mla_fp8(p.view(), back16.view());
  for (int t = 0; t < tokens; ++t) {
    for (int g = 0; g < 4; ++g) {
      const float s = token_scale(p, t, g);
      float amax = 0;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x.get(t * 576 + g * 128 + i)));
      int e;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << "scale is a power of two";
      if (amax == 0) {
        EXPECT_EQ(s, 1.f);
      } else {
        EXPECT_LE(amax / s, 448.f);       // fits
        EXPECT_GT(amax / (s / 2), 448.f);  // and is the smallest such power of two
      }
      for (int i = 0; i < 128; ++i) {
        const std::int64_t k = t * 576 + g * 128 + i;
        const float v = x.get(k), r = back.get(k);
        EXPECT_LE(std::fabs(v - r), std::fabs(v) * 0x1p-4f + s * 0x1p-10f * 1.0001f) << k;
        EXPECT_EQ(back16.get(k), r) << k;  // dequantized values are bf16-exact
      }
    }
    for (int i = 512; i < 576; ++i) EXPECT_EQ(back.get(t * 576 + i), x.get(t * 576 + i));
  }
}

TEST(MlaPack, ArgumentErrors) {
  HostTensor x(DType::kBF16, {2, 576}), xf(DType::kFP32, {2, 576}), p(DType::kUINT8, {2, 656});
  HostTensor bad(DType::kUINT8, {2, 655}), three(DType::kUINT8, {3, 656});
  expect_error([&] { pack_mla_fp8(xf.view(), p.view()); }, {"pack_mla_fp8", "src", "bf16", "fp32"});
  expect_error([&] { pack_mla_fp8(x.view(), bad.view()); }, {"pack_mla_fp8", "out", "656"});
  expect_error([&] { pack_mla_fp8(x.view(), three.view()); }, {"pack_mla_fp8", "out", "[3, 656]"});
  // Never read: the stride check comes first.
  TensorView strided = make_tensor(p.raw(), DType::kUINT8, {1, 656}, {1312, 2});
  HostTensor one(DType::kFP32, {1, 576});
  expect_error([&] { unpack_mla_fp8(strided, one.view()); }, {"unpack_mla_fp8", "src", "stride 2"});
  expect_error([&] { unpack_mla_fp8(p.view(), bad.view()); }, {"unpack_mla_fp8", "out"});
}

// ---------------------------------------------------------------------------------------------
// MLA dense e4m3 cache (one power-of-two scale).

TEST(MlaE4m3, HandCache) {
  HostTensor x(DType::kBF16, {2, 576}), q(DType::kFP8E4M3, {2, 576});
  x.set(3, 1.f);
  x.set(600, -3.f);  // max |x| 3: 3 / 448 lies in (2^-8, 2^-7], so the scale is 2^-7
  const float scale = quantize_mla_fp8_e4m3(x.view(), q.view());
  EXPECT_EQ(scale, 0x1p-7f);
  EXPECT_EQ(q.data<std::uint8_t>()[3], 0x70);    // 1 / 2^-7 = 128
  EXPECT_EQ(q.data<std::uint8_t>()[600], 0xFC);  // -3 / 2^-7 = -384
  EXPECT_EQ(q.data<std::uint8_t>()[0], 0x00);
  // max |x| exactly 448 * 2^k keeps scale 2^k; one bf16 step more doubles it.
  x.set(600, -448.f);
  EXPECT_EQ(quantize_mla_fp8_e4m3(x.view(), q.view()), 1.f);
  EXPECT_EQ(q.data<std::uint8_t>()[600], 0xFE);
  x.set(600, 450.f);
  EXPECT_EQ(quantize_mla_fp8_e4m3(x.view(), q.view()), 2.f);
  // All zeros: scale 1, codes 0.
  HostTensor z(DType::kBF16, {2, 576});
  q.fill_bytes(0x55);
  EXPECT_EQ(quantize_mla_fp8_e4m3(z.view(), q.view()), 1.f);
  for (std::int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q.data<std::uint8_t>()[i], 0) << i;
}

TEST(MlaE4m3, RoundTripErrorBound) {
  DECA_SEED_TRACE();
  auto rng = make_rng(25);
  for (const float sigma : {1e-3f, 1.f, 300.f}) {
    HostTensor x = random_tensor(DType::kBF16, {4, 16, 1, 576}, sigma, rng);
    HostTensor q(DType::kFP8E4M3, {4, 16, 1, 576});
    const float s = quantize_mla_fp8_e4m3(x.view(), q.view());
    const float amax = max_abs(x);
    int e;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two";
    EXPECT_LE(amax / s, 448.f);
    EXPECT_GT(amax / (s / 2), 448.f);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const float v = x.get(i), r = q.get(i) * s;
      // Half an e4m3 step: 2^-4 relative for normals, 2^-10 * s below 2^-6 * s (subnormals).
      ASSERT_LE(std::fabs(v - r), std::fabs(v) * 0x1p-4f + s * 0x1p-10f * 1.0001f) << sigma << " " << i;
      // src / scale is exact (a power of two): the code is its e4m3 rounding.
      ASSERT_EQ(q.data<std::uint8_t>()[i], float_to_fp8e4m3(v / s)) << i;
    }
  }
}

TEST(MlaE4m3, ArgumentErrors) {
  HostTensor x(DType::kBF16, {2, 576}), xf(DType::kFP32, {2, 576}), q(DType::kFP8E4M3, {2, 576});
  HostTensor short_row(DType::kBF16, {2, 512}), u8(DType::kUINT8, {2, 576}), three(DType::kFP8E4M3, {3, 576});
  const char* fn = "quantize_mla_fp8_e4m3";
  expect_error([&] { quantize_mla_fp8_e4m3(xf.view(), q.view()); }, {fn, "src", "bf16", "fp32"});
  expect_error([&] { quantize_mla_fp8_e4m3(short_row.view(), q.view()); }, {fn, "src", "[..., 576]"});
  expect_error([&] { quantize_mla_fp8_e4m3(x.view(), u8.view()); }, {fn, "out", "fp8_e4m3", "uint8"});
  expect_error([&] { quantize_mla_fp8_e4m3(x.view(), three.view()); }, {fn, "out", "shape of src"});
  expect_error([&] { quantize_mla_fp8_e4m3(x.view(), make_tensor(x.raw(), DType::kFP8E4M3, {2, 576}, {576, 1})); },
               {fn, "out", "src"});
  q.fill_bytes(0x55);
  x.set(7, NAN);
  expect_error([&] { quantize_mla_fp8_e4m3(x.view(), q.view()); }, {fn, "src", "finite values", "NaN"});
  for (std::int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q.data<std::uint8_t>()[i], 0x55) << "written";
}

}  // namespace
}  // namespace deca::test
