// The reusable checks of src/api/check.hpp on their edge cases: what they must accept matters as
// much as what they refuse (a transposed or padded output is legitimate, a broadcast one is not).
#include "api/check.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

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

TEST(CheckStrides, EmptyViewsMayHaveZeroStrides) {
  // numpy 2 gives every empty array zero strides.
  EXPECT_NO_THROW(expect_strides("f", "t", view(DType::kFP32, {0, 4, 8}, {0, 0, 0})));
}

TEST(CheckByteSpan, CoversTheTrueExtentOfStridedViews) {
  const ByteSpan s = expect_byte_span("f", "t", view(DType::kFP32, {2, 3}, {8, 2}, 16));
  const auto base = reinterpret_cast<std::uintptr_t>(g_buffer);
  EXPECT_FALSE(s.empty);
  EXPECT_EQ(s.first, base + 16);
  EXPECT_EQ(s.last, base + 16 + (8 + 2 * 2) * 4 + 3);
  EXPECT_TRUE(expect_byte_span("f", "t", view(DType::kFP32, {0, 3}, {0, 0})).empty);
}

TEST(CheckByteSpan, RefusesExtentsAndCountsThatOverflow64Bits) {
  const std::int64_t big = std::int64_t{1} << 31;
  EXPECT_THROW(expect_byte_span("f", "t", view(DType::kFP32, {big - 1, 2}, {INT64_MAX / 4, 1})),
               Error);
  EXPECT_THROW(expect_sizes("f", "t", view(DType::kUINT8, {big - 1, big - 1, big - 1}, {0, 0, 0})),
               Error);
  EXPECT_NO_THROW(expect_sizes("f", "t", view(DType::kUINT8, {big - 1, big - 1}, {0, 0})));
}

TEST(CheckDisjoint, RefusesAnySharedByteAndAcceptsNeighbours) {
  const TensorView a = view(DType::kFP32, {4}, {1}, 0);        // bytes 0..15
  const TensorView b = view(DType::kFP32, {4}, {1}, 16);       // bytes 16..31
  const TensorView c = view(DType::kFP32, {2, 2}, {4, 1}, 12);  // bytes 12..31 (first row 12..19)
  const TensorView absent;
  EXPECT_NO_THROW(expect_disjoint("f", {{"out", &a}}, {{"in", &b}, {"none", &absent}}));
  EXPECT_THROW(expect_disjoint("f", {{"out", &a}}, {{"in", &c}}), Error);
  EXPECT_THROW(expect_disjoint("f", {{"out", &b}, {"lse", &c}}, {}), Error);
  try {
    expect_disjoint("op", {{"out", &b}}, {{"page_table", &c}});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op: out: expected memory that shares no byte with "
                                         "page_table"),
              std::string::npos)
        << e.what();
  }
}

TEST(CheckPresent, NullDataIsAllowedOnlyWithoutElements) {
  TensorView empty = make_tensor(nullptr, DType::kFP32, {0, 4});
  EXPECT_NO_THROW(expect_present("f", "t", empty, ""));
  TensorView null = make_tensor(nullptr, DType::kFP32, {2, 4});
  EXPECT_THROW(expect_present("f", "t", null, ""), Error);
  EXPECT_THROW(expect_present("f", "t", TensorView{}, ""), Error);
}

// expect_tensor's inline test must never accept what its full checks refuse (it would let a bad
// view through unchecked), and must accept the ordinary views (else every call is slow).
TEST(CheckTensorFast, AcceptsOnlyWhatTheFullChecksAccept) {
  const auto cpu = Device::cpu();
  const TensorView huge_stride = view(DType::kBF16, {2, 8}, {std::int64_t{1} << 40, 1});
  TensorView null_data = view(DType::kBF16, {2, 8}, {8, 1});
  null_data.data = nullptr;
  TensorView null_empty = view(DType::kBF16, {0, 8}, {8, 1});
  null_empty.data = nullptr;
  TensorView wraps = view(DType::kFP32, {2, 4}, {4, 1});
  wraps.data = reinterpret_cast<void*>(UINTPTR_MAX - 15);
  const struct {
    TensorView t;
    bool fast;  // what tensor_passes_fast must answer (false: the full checks decide)
  } cases[] = {
      {view(DType::kBF16, {2, 1, 4, 8}, {32, 32, 8, 1}), true},
      {view(DType::kBF16, {2, 1, 4, 8}, {64, 32, 8, 1}), true},   // padded rows
      {view(DType::kBF16, {0, 1, 4, 8}, {0, 0, 0, 0}), true},     // empty: nothing to walk
      {view(DType::kBF16, {2, 8}, {8, 2}), false},                // last dim not contiguous
      {view(DType::kBF16, {2, 8}, {-8, 1}), false},               // negative stride
      {view(DType::kBF16, {2, 8}, {8, 1}, 1), false},             // misaligned element
      {view(DType::kFP16, {2, 8}, {8, 1}), false},                // wrong dtype
      {view(DType::kBF16, {2, 8, 1}, {8, 1, 1}), false},          // wrong rank
      {huge_stride, false},                                       // exact overflow checks decide
      {null_data, false},
      {null_empty, true},
      {wraps, false},
  };
  for (const auto& c : cases) {
    const int rank = c.t.rank == 3 ? 2 : c.t.rank;  // the rank-3 case is asked for rank 2
    const bool fast = tensor_passes_fast(c.t, cpu, {DType::kBF16, DType::kFP32}, rank);
    EXPECT_EQ(fast, c.fast) << c.t.describe();
    if (fast) {
      EXPECT_NO_THROW(expect_tensor_checked("f", "t", c.t, cpu, "", {DType::kBF16, DType::kFP32},
                                            "", rank, "[dims]"))
          << c.t.describe();
    }
  }
  EXPECT_FALSE(tensor_passes_fast(view(DType::kBF16, {2, 8}, {8, 1}), Device::cuda(0),
                                  {DType::kBF16}, 2));
  // The refusals still carry the full message.
  EXPECT_THROW(expect_tensor("f", "t", view(DType::kBF16, {2, 8}, {8, 2}), cpu, "",
                             {DType::kBF16}, "", 2, "[a, b]"),
               Error);
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
