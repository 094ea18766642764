// Scalar conversions (deca/quant.hpp): exhaustive over fp8 and 16-bit codes, rounding ties,
// saturation and special values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "deca/quant.hpp"

namespace deca {
namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The e4m3fn definition written out with pow: bias 7, 3 mantissa bits, no infinity.
double fp8_by_definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8E4M3, DecodesAll256Codes) {
  for (int c = 0; c < 256; ++c) {
    const double want = fp8_by_definition(c);
    const float got = fp8e4m3_to_float(static_cast<std::uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
      EXPECT_EQ(std::signbit(got), c >= 128) << c;
    }
  }
  EXPECT_EQ(fp8e4m3_to_float(0x7E), 448.f);
  EXPECT_EQ(fp8e4m3_to_float(0x38), 1.f);
  EXPECT_EQ(fp8e4m3_to_float(0xB8), -1.f);
  EXPECT_EQ(fp8e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(fp8e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_float(0xFF)));
}

TEST(Fp8E4M3, EncodesEveryValueToItsCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_fp8e4m3(fp8e4m3_to_float(static_cast<std::uint8_t>(c))), c) << c;
  }
}

TEST(Fp8E4M3, RoundsToNearestEven) {
  // Consecutive positive codes c, c+1: the midpoint goes to the even code, anything off the
  // midpoint to the nearer one. Negative values mirror it.
  for (int c = 0; c < 0x7E; ++c) {
    const float a = fp8e4m3_to_float(static_cast<std::uint8_t>(c));
    const float b = fp8e4m3_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = (a + b) / 2;  // exact in float
    const int even = c % 2 == 0 ? c : c + 1;
    EXPECT_EQ(float_to_fp8e4m3(mid), even) << c;
    EXPECT_EQ(float_to_fp8e4m3(-mid), even | 0x80) << c;
    EXPECT_EQ(float_to_fp8e4m3(std::nextafter(mid, 0.f)), c) << c;
    EXPECT_EQ(float_to_fp8e4m3(std::nextafter(mid, 1e9f)), c + 1) << c;
  }
}

TEST(Fp8E4M3, SaturatesAndKeepsNaN) {
  for (float x : {448.f, 449.f, 463.99f, 464.f, 500.f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(float_to_fp8e4m3(x), 0x7E) << x;
    EXPECT_EQ(float_to_fp8e4m3(-x), 0xFE) << x;
  }
  EXPECT_EQ(float_to_fp8e4m3(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_fp8e4m3(0.f), 0x00);
  EXPECT_EQ(float_to_fp8e4m3(-0.f), 0x80);
  EXPECT_EQ(float_to_fp8e4m3(1e-30f), 0x00);
}

TEST(Bf16, AllCodesRoundTrip) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const float f = bf16_to_float(static_cast<std::uint16_t>(c));
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    EXPECT_EQ(bits, c << 16);  // bf16 is the top half of a float
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << c;
    } else {
      EXPECT_EQ(float_to_bf16(f), c) << c;
    }
  }
}

TEST(Bf16, EdgeValues) {
  EXPECT_EQ(float_to_bf16(1.f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(float_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(float_to_bf16(from_bits(0x3F807FFF)), 0x3F80);  // just below
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);  // largest finite bf16
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds to infinity
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000)), 0x0000);  // subnormal tie -> even (zero)
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000)), 0x0002);
  // A NaN whose payload sits only in the dropped bits must not turn into infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7F800001)))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xFF800001)))));
  EXPECT_EQ(bf16_to_float(0x7F7F), 3.3895313892515355e38f);
}

double fp16_by_definition(int code) {
  const int s = code >> 15, e = (code >> 10) & 31, m = code & 1023;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : (s ? -1 : 1) * HUGE_VAL;
  const double mag = e == 0 ? m * std::pow(2.0, -24) : (1.0 + m / 1024.0) * std::pow(2.0, e - 15);
  return s ? -mag : mag;
}

TEST(Fp16, AllCodesDecodeAndRoundTrip) {
  for (int c = 0; c < 65536; ++c) {
    const double want = fp16_by_definition(c);
    const float f = fp16_to_float(static_cast<std::uint16_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f)))) << c;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << c;
      EXPECT_EQ(float_to_fp16(f), c) << c;
    }
  }
}

TEST(Fp16, RoundingEdges) {
  EXPECT_EQ(float_to_fp16(65504.f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.f), 0x7C00);  // tie at the top goes to infinity (even)
  EXPECT_EQ(float_to_fp16(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);  // tie -> even
  EXPECT_EQ(float_to_fp16(0x1.8p-24f), 0x0002);  // 1.5 steps: tie -> even (2)
  EXPECT_EQ(float_to_fp16(1.f + 0x1p-11f), 0x3C00);  // tie -> even (down)
  EXPECT_EQ(float_to_fp16(1.f + 0x3p-11f), 0x3C02);  // tie -> even (up)
  // Midpoints between all consecutive positive finite codes go to the even one.
  for (int c = 0; c < 0x7BFF; c += 7) {
    const float a = fp16_to_float(static_cast<std::uint16_t>(c));
    const float b = fp16_to_float(static_cast<std::uint16_t>(c + 1));
    EXPECT_EQ(float_to_fp16((a + b) / 2), c % 2 == 0 ? c : c + 1) << c;
  }
}

}  // namespace
}  // namespace deca
