// The Hopper fp8 GQA kernels' shared-memory layouts (kernels/gqa/sm90/layout.cuh) on the host: the
// 128-byte swizzle, and the V transpose (ldmatrix.trans + prmt + stmatrix, both kernels) writes
// V^T in the order of the rows-on-M kernel's A fragments without bank conflicts.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

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

// Rows on M (decode_rows.cuh): the V transpose simulated on the host. ldmatrix.trans, the two
// prmt and stmatrix as the PTX ISA defines them, on a swizzled V tile whose byte (token t, d) is
// a function of both; then V^T row n, A position k must hold V[rows_on_m_a_token(k)][rows_on_m_d(n)],
// every byte of V^T is written once, the four elements a lane packs into A register j of step kk
// are the tokens at that register's A positions, and the ldmatrix reads and stmatrix writes of
// each 8-row block touch 8 distinct 16-byte bank groups (no conflicts).
TEST(GqaSm90Layout, RowsOnMTransposeGivesTheAFragmentOrder) {
  auto v_byte = [](int t, int d) { return static_cast<unsigned char>((t * 131 + d * 7 + (t >> 3)) & 0xFF); };
  std::vector<unsigned char> v(128 * 128), vt(128 * 128, 0);
  std::vector<int> writes(128 * 128, 0);
  for (int t = 0; t < 128; ++t) {
    for (int d = 0; d < 128; ++d) v[swz128(t, d)] = v_byte(t, d);
  }
  auto prmt = [](unsigned a, unsigned b, unsigned sel) {
    const unsigned long long ab = a | (static_cast<unsigned long long>(b) << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((ab >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
  };
  for (int w = 0; w < 4; ++w) {
    for (int tb = 0; tb < 2; ++tb) {
      for (int db = 0; db < 4; ++db) {
        unsigned lane_addr[32], out_addr[32];
        for (int l = 0; l < 32; ++l) {
          lane_addr[l] = 4096u * w + 2048u * tb + rows_on_m_ldsm_offset(l, db);
          out_addr[l] = 4096u * db + rows_on_m_stsm_offset(l, 2 * w + tb);
        }
        for (int m = 0; m < 4; ++m) {  // conflicts: 8 rows of a block in 8 distinct 16-byte groups
          std::set<unsigned> in_groups, out_groups;
          for (int j = 0; j < 8; ++j) {
            in_groups.insert((lane_addr[8 * m + j] / 16) % 8);
            out_groups.insert((out_addr[8 * m + j] / 16) % 8);
          }
          EXPECT_EQ(in_groups.size(), 8u);
          EXPECT_EQ(out_groups.size(), 8u);
        }
        for (int T = 0; T < 32; ++T) {
          unsigned r[4], c[4];
          for (int m = 0; m < 4; ++m) {  // .trans: rows 2 (T % 4), + 1 of matrix m, b16 column T / 4
            const unsigned row0 = lane_addr[8 * m + 2 * (T & 3)] + 2 * (T >> 2);
            const unsigned row1 = lane_addr[8 * m + 2 * (T & 3) + 1] + 2 * (T >> 2);
            r[m] = v[row0] | (v[row0 + 1] << 8) | (v[row1] << 16) | (static_cast<unsigned>(v[row1 + 1]) << 24);
          }
          c[0] = prmt(r[0], r[1], 0x6420u), c[1] = prmt(r[0], r[1], 0x7531u);
          c[2] = prmt(r[2], r[3], 0x6420u), c[3] = prmt(r[2], r[3], 0x7531u);
          for (int m = 0; m < 4; ++m) {  // stmatrix: row T / 4 of matrix m, bytes 4 (T % 4) ..
            const unsigned a = out_addr[8 * m + (T >> 2)] + 4 * (T & 3);
            for (int i = 0; i < 4; ++i) {
              vt[a + i] = static_cast<unsigned char>((c[m] >> (8 * i)) & 0xFF);
              ++writes[a + i];
            }
          }
        }
      }
    }
  }
  for (int n = 0; n < 128; ++n) {
    for (int k = 0; k < 128; ++k) {
      ASSERT_EQ(writes[swz128(n, k)], 1) << "row " << n << " position " << k;
      ASSERT_EQ(vt[swz128(n, k)], v_byte(rows_on_m_a_token(k), rows_on_m_d(n))) << "row " << n << " position " << k;
    }
  }
  std::set<int> ds, tokens;
  for (int n = 0; n < 128; ++n) ds.insert(rows_on_m_d(n)), tokens.insert(rows_on_m_a_token(n));
  EXPECT_EQ(ds.size(), 128u);
  EXPECT_EQ(tokens.size(), 128u);
  // The A fragment: register j of step kk (rows l / 4 + 8 (j % 2)) packs elements
  // 16 kk + 8 (j / 2) + 2 (j % 2) + {0, 1, 4, 5}, bytes at A positions 32 kk + 16 (j / 2) + 4 (l % 4) + c.
  for (int l = 0; l < 32; ++l) {
    for (int kk = 0; kk < 4; ++kk) {
      for (int j = 0; j < 4; ++j) {
        const int offsets[4] = {0, 1, 4, 5};
        for (int c = 0; c < 4; ++c) {
          const int e = 16 * kk + 8 * (j >> 1) + 2 * (j & 1) + offsets[c];
          EXPECT_EQ((e >> 1) & 1, j & 1) << "register " << j << " holds one row";
          EXPECT_EQ(rows_on_m_token(e, l), rows_on_m_a_token(32 * kk + 16 * (j >> 1) + 4 * (l & 3) + c))
              << "lane " << l << " step " << kk << " register " << j << " byte " << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace deca::gqa::sm90
