// The number formatting of error messages (src/api/check.cpp, TensorView::describe): exact
// strings, since it no longer goes through iostreams (issue 6) and must keep every digit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "api/check.hpp"
#include "deca/tensor.hpp"

namespace deca::api {
namespace {

TEST(FloatString, ShortestFormsAndSpecialValues) {
  EXPECT_EQ(float_string(0.5), "0.5");
  EXPECT_EQ(float_string(-0.25), "-0.25");
  EXPECT_EQ(float_string(1e30), "1e+30");
  EXPECT_EQ(float_string(1e-7), "1e-07");
  EXPECT_EQ(float_string(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(float_string(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(float_string(-std::numeric_limits<double>::infinity()), "-inf");
  // A float argument prints as the float it is, not as its double expansion.
  EXPECT_EQ(float_string(0.1f), "0.1");
  EXPECT_EQ(float_string(0.1), "0.1");
}

TEST(FloatString, WholeNumbersKeepEveryDigit) {
  // Sizes and counts pass through float_string: an ostream printed 1234567 as "1.23457e+06".
  EXPECT_EQ(float_string(0), "0");
  EXPECT_EQ(float_string(70000), "70000");
  EXPECT_EQ(float_string(1234567), "1234567");
  EXPECT_EQ(float_string(-2147483648.0), "-2147483648");
  EXPECT_EQ(float_string(static_cast<double>(std::int64_t{1} << 40)), "1099511627776");
}

TEST(ShapeString, EveryDimAndRank0) {
  const TensorView t = make_tensor(nullptr, DType::kBF16, {2, 0, 1234567, 128});
  EXPECT_EQ(shape_string(t), "[2, 0, 1234567, 128]");
  EXPECT_EQ(shape_string(make_tensor(nullptr, DType::kFP32, {})), "[]");
}

TEST(Describe, ShapeDtypeAndDevice) {
  EXPECT_EQ(make_tensor(nullptr, DType::kFP8E4M3, {3, 70000}, Device::cuda(1)).describe(),
            "[3, 70000] fp8_e4m3 on cuda:1");
  EXPECT_EQ(TensorView{}.describe(), "absent");
}

}  // namespace
}  // namespace deca::api
