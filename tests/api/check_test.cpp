// The reusable checks of src/api/check.hpp on their edge cases: what they must accept matters as
// much as what they refuse (a transposed or padded output is legitimate, a broadcast one is not).
#include "api/check.hpp"

#include <gtest/gtest.h>

#include <cstdint>

#include "deca/error.hpp"

namespace deca::api {
namespace {

alignas(64) std::uint8_t g_buffer[4096];

TensorView view(DType dtype, std::initializer_list<std::int64_t> shape,
                std::initializer_list<std::int64_t> strides, std::size_t offset = 0) {
  return make_tensor(g_buffer + offset, dtype, shape, strides);
}

TEST(CheckOverlap, AcceptsContiguousTransposedPaddedAndUnitDims) {
  EXPECT_NO_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {2, 3, 4}, {12, 4, 1})));
  EXPECT_NO_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {2, 3, 4}, {4, 8, 1})));
  EXPECT_NO_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {2, 3, 4}, {40, 10, 1})));
  EXPECT_NO_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {1, 3, 1}, {0, 1, 0})));
  EXPECT_NO_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {0, 3}, {0, 0})));
  EXPECT_NO_THROW(expect_aligned("f", "t", view(DType::kBF16, {0, 8}, {3, 1}, 2), 16, ""));
}

TEST(CheckOverlap, RefusesBroadcastAndInterleavedRows) {
  EXPECT_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {2, 4}, {0, 1})), Error);
  EXPECT_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {3, 4}, {2, 1})), Error);
  EXPECT_THROW(expect_no_overlap("f", "t", view(DType::kFP32, {2, 3, 4}, {12, 3, 1})), Error);
}

TEST(CheckAligned, IgnoresStridesOfUnitDimsAndChecksTheRest) {
  EXPECT_NO_THROW(expect_aligned("f", "t", view(DType::kBF16, {1, 4, 8}, {3, 8, 1}), 16, ""));
  EXPECT_THROW(expect_aligned("f", "t", view(DType::kBF16, {2, 4, 8}, {36, 8, 1}), 16, ""), Error);
  EXPECT_THROW(expect_aligned("f", "t", view(DType::kBF16, {4, 8}, {8, 1}, 2), 16, ""), Error);
  // The last dim's stride is 1 element by contract, whatever the element size.
  EXPECT_NO_THROW(expect_aligned("f", "t", view(DType::kFP8E4M3, {2, 16}, {16, 1}), 16, ""));
}

TEST(CheckStrides, LastDimOfSizeOneMayHaveAnyStride) {
  EXPECT_NO_THROW(expect_strides("f", "t", view(DType::kFP32, {4, 1}, {1, 7})));
  EXPECT_THROW(expect_strides("f", "t", view(DType::kFP32, {4, 2}, {2, 3})), Error);
  EXPECT_THROW(expect_strides("f", "t", view(DType::kFP32, {4, 2}, {-2, 1})), Error);
}

TEST(CheckPresent, NullDataIsAllowedOnlyWithoutElements) {
  TensorView empty = make_tensor(nullptr, DType::kFP32, {0, 4});
  EXPECT_NO_THROW(expect_present("f", "t", empty, ""));
  TensorView null = make_tensor(nullptr, DType::kFP32, {2, 4});
  EXPECT_THROW(expect_present("f", "t", null, ""), Error);
  EXPECT_THROW(expect_present("f", "t", TensorView{}, ""), Error);
}

TEST(CheckMessage, NamesFunctionArgumentExpectedAndActual) {
  try {
    expect_dim("gqa_decode", "q", view(DType::kBF16, {2, 1, 32, 128}, {4096, 4096, 128, 1}), 2,
               "num_q_heads", 64, "plan.config.num_q_heads");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "gqa_decode: q: dim 2 (num_q_heads): expected 64 (plan.config.num_q_heads), got 32");
  }
}

}  // namespace
}  // namespace deca::api
