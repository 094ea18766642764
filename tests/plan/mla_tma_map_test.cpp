// The dense bf16 rows' tensor map on the host (src/cuda/mla_tma.hpp; the kernel side is
// kernels/mla/sm90/rows.cuh): the cuTensorMapEncodeTiled arguments for a cache's address, strides
// and page size, when the run falls back to the register producers, and that the copy unit's
// 128-byte swizzle lays a box out exactly as the K tile's swz() (kernels/mla/sm90/layout.cuh)
// which the consumers' wgmma descriptors read.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "cuda/mla_tma.hpp"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::cuda {
namespace {

const void* at(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(MlaTmaMap, ArgumentsOfAContiguousCache) {
  for (int page : {64, 128, 256, 576}) {
    const long long row = 576 * 2;
    const DenseRowsMap m = dense_rows_map(at(0x7f0000000000), page * row, row, page, 1000);
    ASSERT_TRUE(m.ok) << page;
    EXPECT_EQ(m.dims[0], 576u);
    EXPECT_EQ(m.dims[1], static_cast<std::uint64_t>(page));
    EXPECT_EQ(m.dims[2], 1000u);
    EXPECT_EQ(m.strides[0], 1152u);
    EXPECT_EQ(m.strides[1], static_cast<std::uint64_t>(page) * 1152u);
    EXPECT_EQ(m.box[0], 64u);  // 128 bytes: the 128-byte swizzle's span, one chunk's row
    EXPECT_EQ(m.box[1], 64u);  // one block of the pipeline
    EXPECT_EQ(m.box[2], 1u);
    for (std::uint32_t e : m.element_strides) EXPECT_EQ(e, 1u);
    // Each box is one chunk of the tile; the nine of a block fill it exactly.
    EXPECT_EQ(m.box[0] * 2 * m.box[1], static_cast<std::uint32_t>(mla::sm90::kChunkBytes));
    EXPECT_EQ(576 / m.box[0] * mla::sm90::kChunkBytes, static_cast<unsigned>(mla::sm90::kTileBytes));
  }
}

// A layer of an interleaved allocation (block stride two pages) maps too; what the driver would
// refuse leaves the run on the register producers (ok false).
TEST(MlaTmaMap, StridedViewsAndRefusals) {
  const long long row = 1152;
  const DenseRowsMap layer = dense_rows_map(at(0x10000 + 64 * row), 2 * 64 * row, row, 64, 7);
  ASSERT_TRUE(layer.ok);
  EXPECT_EQ(layer.strides[1], static_cast<std::uint64_t>(2 * 64 * row));
  EXPECT_EQ(layer.dims[2], 7u);
  // Rows padded to 1168 bytes (a multiple of 16) map; 1160 (not) does not.
  EXPECT_TRUE(dense_rows_map(at(0x10000), 64 * 1168, 1168, 64, 3).ok);
  EXPECT_FALSE(dense_rows_map(at(0x10000), 64 * 1160, 1160, 64, 3).ok);
  EXPECT_FALSE(dense_rows_map(at(0x10008), 64 * row, row, 64, 3).ok);      // address not 16-aligned
  EXPECT_FALSE(dense_rows_map(at(0x10000), 64 * row + 8, row, 64, 3).ok);  // block stride
  EXPECT_FALSE(dense_rows_map(at(0x10000), 1ll << 40, row, 64, 3).ok);     // at the 2^40 limit
  EXPECT_TRUE(dense_rows_map(at(0x10000), (1ll << 40) - 16, row, 64, 3).ok);
  EXPECT_FALSE(dense_rows_map(at(0x10000), 64 * row, row, 64, 0).ok);      // no block
  EXPECT_FALSE(dense_rows_map(at(0x10000), 8, row, 64, 1).ok);  // one block: the API takes any stride
  EXPECT_FALSE(dense_rows_map(at(0x10000), 32 * row, row, 32, 3).ok);      // a page below 64
  EXPECT_FALSE(dense_rows_map(at(0x10000), 96 * row, row, 96, 3).ok);      // not a multiple of 64
}

// The copy unit's 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B, the destination 1024-byte
// aligned): the box is written row after row, 128 bytes a row here (64 bf16), and within each
// 1024-byte atom the 16-byte unit of byte offset o moves to unit ((o >> 4) ^ (o >> 7)) & 7, i.e.
// address bits 4..6 XOR bits 7..9. That must be swz(row, unit) for every row and unit of a chunk,
// and every chunk of every stage must start on a 1024-byte boundary of the plan (whose base the
// kernel aligns to 1024).
unsigned tma_swizzle_128b(unsigned offset) { return offset ^ (((offset >> 7) & 7u) << 4); }

TEST(MlaTmaMap, CopyUnitSwizzleIsTheTileLayout) {
  std::set<unsigned> seen;
  for (int row = 0; row < 64; ++row) {
    for (int unit = 0; unit < 8; ++unit) {
      const unsigned linear = static_cast<unsigned>(row * 128 + unit * 16);
      EXPECT_EQ(tma_swizzle_128b(linear), mla::sm90::swz(row, unit)) << row << " " << unit;
      seen.insert(tma_swizzle_128b(linear));
    }
  }
  EXPECT_EQ(seen.size(), 512u);  // a bijection onto the chunk's 8192 bytes in 16-byte units
  for (int stage = 0; stage < mla::sm90::kStages; ++stage) {
    for (int c = 0; c < 9; ++c) {
      EXPECT_EQ((mla::sm90::SmemPlan::kK + stage * mla::sm90::kTileBytes + c * mla::sm90::kChunkBytes) % 1024, 0)
          << stage << " " << c;
    }
  }
}

}  // namespace
}  // namespace deca::cuda
