// The Hopper fp8 GQA kernel's shared-memory layouts (kernels/gqa/sm90/layout.cuh) on the host:
// the in-place V transpose's lane map covers every 4 x 4 byte block of a 128 x 128 tile exactly
// once and its reads and writes are free of bank conflicts, the P^T stores too, and the PV token
// order is a permutation whose quads are the tokens a thread holds for one query row; the
// rows-on-M kernel's token orders put token k at A position k and V^T position k.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "kernels/gqa/sm90/layout.cuh"

namespace deca::gqa::sm90 {
namespace {

int bank(unsigned byte_addr) { return static_cast<int>((byte_addr >> 2) & 31); }

TEST(GqaSm90Layout, SwizzleKeepsRowsAndPermutesUnits) {
  for (int row = 0; row < 128; ++row) {
    std::set<unsigned> units;
    for (int byte = 0; byte < 128; byte += 16) {
      const unsigned a = swz128(row, byte);
      EXPECT_EQ(a / 128, static_cast<unsigned>(row));
      units.insert((a % 128) / 16);
      EXPECT_EQ(swz128(row, byte + 5), a + 5);  // bytes inside a unit stay in order
    }
    EXPECT_EQ(units.size(), 8u) << row;
  }
}

TEST(GqaSm90Layout, TransposeMapCoversEveryBlockOnceWithoutBankConflicts) {
  std::set<std::pair<int, int>> seen;
  for (int w = 0; w < 4; ++w) {
    for (int i = 0; i < 8; ++i) {
      int qd[32], db[32];
      for (int l = 0; l < 32; ++l) {
        transpose_block(w, i, l, qd[l], db[l]);
        ASSERT_GE(qd[l], 0);
        ASSERT_LT(qd[l], 32);
        ASSERT_GE(db[l], 0);
        ASSERT_LT(db[l], 32);
        EXPECT_TRUE(seen.insert({qd[l], db[l]}).second) << "block (" << qd[l] << ", " << db[l] << ") twice";
      }
      // Row j of a block: token row quad_token(qd) + {0, 8, 64, 72} read at d bytes 4 db, and d row
      // 4 db + j written at token bytes 4 qd: per instruction (j) the warp's 32 lanes hit 32 banks.
      const int token_offset[4] = {0, 8, 64, 72};
      for (int j = 0; j < 4; ++j) {
        std::set<int> reads, writes;
        for (int l = 0; l < 32; ++l) {
          reads.insert(bank(swz128(quad_token(qd[l]) + token_offset[j], 4 * db[l])));
          writes.insert(bank(swz128(4 * db[l] + j, 4 * qd[l])));
        }
        EXPECT_EQ(reads.size(), 32u) << "warp " << w << " iteration " << i << " row " << j;
        EXPECT_EQ(writes.size(), 32u) << "warp " << w << " iteration " << i << " row " << j;
      }
    }
  }
  EXPECT_EQ(seen.size(), 1024u);
}

TEST(GqaSm90Layout, PvTokenOrderIsAPermutationOfTheThreadsQuads) {
  // The quads' tokens, quad_token(qd) + {0, 8, 64, 72}, are every token of the tile once, and
  // thread (w, l)'s S^T tokens (16 w + l / 4 + {0, 8} in each m64 half) are quad 8 w + l / 4,
  // whose P^T bytes 4 qd .. 4 qd + 3 it stores.
  const int offset[4] = {0, 8, 64, 72};
  std::set<int> tokens;
  for (int qd = 0; qd < 32; ++qd) {
    for (int sub = 0; sub < 4; ++sub) EXPECT_TRUE(tokens.insert(quad_token(qd) + offset[sub]).second);
  }
  EXPECT_EQ(tokens.size(), 128u);
  EXPECT_EQ(*tokens.rbegin(), 127);
  for (int w = 0; w < 4; ++w) {
    for (int l = 0; l < 32; ++l) {
      const int qd = 8 * w + (l >> 2);
      for (int h = 0; h < 2; ++h) {
        for (int e = 0; e < 2; ++e) {
          const int token = 64 * h + 16 * w + (l >> 2) + 8 * e;  // the accumulator's row
          EXPECT_EQ(token, quad_token(qd) + offset[2 * h + e]) << w << " " << l;
        }
      }
    }
  }
}

TEST(GqaSm90Layout, PStoresAreFreeOfBankConflicts) {
  // Column cc of thread (w, l): query row 8 (cc / 2) + 2 (l % 4) + cc % 2, one 32-bit store at
  // byte 4 (8 w + l / 4) of that row; every rows value up to 64 (16 columns).
  for (int cc = 0; cc < 16; ++cc) {
    for (int w = 0; w < 4; ++w) {
      std::set<int> banks;
      for (int l = 0; l < 32; ++l) {
        const int row = 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1);
        banks.insert(bank(swz128(row, 4 * (8 * w + (l >> 2)))));
      }
      EXPECT_EQ(banks.size(), 32u) << "column " << cc << " warp " << w;
    }
  }
}

// Rows on M (decode_rows.cuh): K rows and V rows are permutations of a tile's 128 tokens; the S
// element a lane holds in K row n is the token that row holds; the four elements a lane packs
// into A register j of k-step kk (16 kk + 8 (j / 2) + 2 (j % 2) + {0, 1, 4, 5}: rows l / 4 and
// + 8 alternate with j) are tokens 32 kk + 16 (j / 2) + 4 (l % 4) + 0..3, the A fragment's k
// positions of that register; and the transpose, reading byte j of block qd from V row
// quad_token(qd) + {0, 8, 64, 72}[j], finds token 4 qd + j there.
TEST(GqaSm90Layout, RowsOnMTokenOrdersMatchTheAFragment) {
  std::set<int> k_rows, v_rows;
  for (int t = 0; t < 128; ++t) {
    k_rows.insert(rows_on_m_k_row(t));
    v_rows.insert(rows_on_m_v_row(t));
    EXPECT_LT(rows_on_m_k_row(t), 128);
    EXPECT_LT(rows_on_m_v_row(t), 128);
  }
  EXPECT_EQ(k_rows.size(), 128u);
  EXPECT_EQ(v_rows.size(), 128u);
  for (int l = 0; l < 32; ++l) {
    for (int e = 0; e < 64; ++e) {
      const int column = 8 * (e >> 2) + 2 * (l & 3) + (e & 1);  // the accumulator's layout
      EXPECT_EQ(rows_on_m_k_row(rows_on_m_token(e, l)), column) << "lane " << l << " element " << e;
    }
    for (int kk = 0; kk < 4; ++kk) {
      for (int j = 0; j < 4; ++j) {
        const int e0 = 16 * kk + 8 * (j >> 1) + 2 * (j & 1);
        const int offsets[4] = {0, 1, 4, 5};
        for (int c = 0; c < 4; ++c) {
          const int e = e0 + offsets[c];
          EXPECT_EQ((e >> 1) & 1, j & 1) << "register " << j << " holds one row";
          EXPECT_EQ(rows_on_m_token(e, l), 32 * kk + 16 * (j >> 1) + 4 * (l & 3) + c)
              << "lane " << l << " step " << kk << " register " << j << " byte " << c;
        }
      }
    }
  }
  const int token_offset[4] = {0, 8, 64, 72};
  for (int qd = 0; qd < 32; ++qd) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(rows_on_m_v_row(4 * qd + j), quad_token(qd) + token_offset[j]);
  }
}

}  // namespace
}  // namespace deca::gqa::sm90
