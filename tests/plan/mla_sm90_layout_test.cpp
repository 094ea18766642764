// The sm90a MLA kernels' addresses and orders (kernels/mla/sm90/layout.cuh) on the host: the
// wide kernel's whole-row pieces (the bytes each lane converts, whole rows per store instruction)
// and their two store bases; the producers' index check (traits.cuh); the direct kernel's
// fragment orders (permutations, conflict-free loads, the identities its code relies on).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "kernels/mla/sm90/layout.cuh"

namespace deca::mla::sm90 {
namespace {

TEST(MlaSm90Layout, SwizzleKeepsRowsAndPermutesUnits) {
  for (int row = 0; row < 64; ++row) {
    std::set<unsigned> units;
    for (int unit = 0; unit < 8; ++unit) {
      const unsigned a = swz(row, unit);
      EXPECT_EQ(a / 128, static_cast<unsigned>(row));
      units.insert((a % 128) / 16);
    }
    EXPECT_EQ(units.size(), 8u) << row;
  }
}

// The 128-byte row a store address falls in, and its 16-byte unit there (before the swizzle).
struct RowUnit {
  unsigned row_start;
  int unit;
};
RowUnit row_unit(unsigned addr) { return RowUnit{addr / 128 * 128, static_cast<int>(addr % 128 / 16)}; }

// Cfg::kMap = 3: each lane's bytes and scales are those of the units it stores, every unit of the
// token's eight rows is written once, and each store instruction writes four whole 128-byte rows.
TEST(MlaSm90Layout, RowPiecesStoreWholeRowsOfTheirOwnBytes) {
  for (int n = 0; n < 64; ++n) {
    std::set<unsigned> seen;
    for (int second = 0; second < 2; ++second) {
      std::set<unsigned> rows;
      std::set<std::pair<unsigned, int>> row_units;
      for (int l = 0; l < 32; ++l) {
        const int chunk = rows_chunk(l) + 2 * second;
        const int unit = l % 8;
        EXPECT_EQ(rows_nope_byte(l) + 128 * second, 64 * chunk + 8 * unit) << l;
        // The 8-byte scale load holds groups g and g + 1 (4-byte floats from byte 512); the
        // first store's values are in group chunk / 2, the second's in the next.
        const int group = (rows_scale_byte(l) - kDimNope) / 4 + second;
        EXPECT_EQ(group, (64 * chunk + 8 * unit) / 128) << l;
        EXPECT_EQ(rows_scale_byte(l) % 8, 0);
        const unsigned a = static_cast<unsigned>(chunk * kChunkBytes) + swz(n, unit);
        EXPECT_TRUE(seen.insert(a).second) << l;
        const RowUnit ru = row_unit(a);
        rows.insert(ru.row_start);
        row_units.insert({ru.row_start, ru.unit});
      }
      EXPECT_EQ(rows.size(), 4u) << n;        // four rows per instruction,
      EXPECT_EQ(row_units.size(), 32u) << n;  // each of them whole
    }
    EXPECT_EQ(seen.size(), 64u) << n;
  }
}

// Cfg::kMap = 3 in a producer warpgroup's share (two producers: 32 tokens from 0 or 32 without a
// cluster, 16 from 0, 16, 32 or 48 in one; one producer: 64 or 32): the two bases plus 512 per
// piece are the swizzled units of each piece's token, and the share's stores cover its rows'
// units exactly once.
TEST(MlaSm90Layout, RowsStoresAreTheSwizzledUnitsOfEachPiece) {
  struct Share {
    int first_token, tokens;
  };
  for (const Share share : {Share{0, 32}, Share{32, 32}, Share{0, 16}, Share{16, 16}, Share{32, 16},
                            Share{48, 16}, Share{0, 64}}) {
    std::set<unsigned> seen;
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const RowsStores rs = rows_stores(l, g, share.first_token);
        for (int k = 0; 4 * k < share.tokens; ++k) {
          const int n = share.first_token + g + 4 * k;
          const unsigned a = rs.at[k % 2] + 512u * static_cast<unsigned>(k);
          for (int second = 0; second < 2; ++second) {
            const unsigned expect = static_cast<unsigned>((rows_chunk(l) + 2 * second) * kChunkBytes) + swz(n, l % 8);
            EXPECT_EQ(a + static_cast<unsigned>(2 * second * kChunkBytes), expect)
                << share.first_token << " g " << g << " l " << l << " k " << k;
            EXPECT_TRUE(seen.insert(expect).second);
          }
        }
      }
    }
    // 8 chunks x 8 units of each of the share's rows.
    EXPECT_EQ(seen.size(), static_cast<size_t>(64 * share.tokens));
  }
}

// checked_id's one unsigned compare against pool_bound(pool) skips exactly the ids below zero or
// at or above the pool, for pools small, large and beyond what an int32 id can reach.
TEST(MlaSm90Ids, CheckedIdSkipsNegativeAndOutOfPoolIds) {
  const long long pools[] = {0, 1, 64, 4096 * 64, 0x7fffffffll, 0x80000000ll, 0x80000005ll, 1ll << 40};
  const int ids[] = {-2147483647 - 1, -5, -1, 0, 1, 63, 64, 65, 4096 * 64 - 1, 4096 * 64,
                     0x7ffffffe, 0x7fffffff};
  for (const long long pool : pools) {
    for (const int id : ids) {
      const int want = id < 0 || id >= pool ? -1 : id;
      EXPECT_EQ(checked_id(id, pool_bound(pool)), want) << "id " << id << " pool " << pool;
    }
  }
}

}  // namespace
}  // namespace deca::mla::sm90


namespace deca::mla::sm90 {
namespace {

// The direct kernel's orders (Cfg::kDirect, direct.cuh): P V's token order over a block's 64 k
// positions, its column order over the 8 m-blocks' rows, S^T's k order inside a k16 step; each
// a permutation.
TEST(MlaSm90Layout, DirectOrdersArePermutations) {
  std::vector<int> seen(512, 0);
  for (int kappa = 0; kappa < 64; ++kappa) ++seen[direct_token(kappa)];
  for (int t = 0; t < 64; ++t) EXPECT_EQ(seen[t], 1) << "token " << t;
  std::fill(seen.begin(), seen.end(), 0);
  for (int mb = 0; mb < 8; ++mb) {
    for (int m = 0; m < 64; ++m) {
      const int col = direct_column(mb, m);
      ASSERT_GE(col, 0);
      ASSERT_LT(col, 512);
      ++seen[col];
      EXPECT_EQ(col / 128, mb / 2) << "m-blocks 2 g and 2 g + 1 hold group g's columns";
    }
  }
  for (int c = 0; c < 512; ++c) EXPECT_EQ(seen[c], 1) << "column " << c;
  std::fill(seen.begin(), seen.end(), 0);
  for (int p = 0; p < 16; ++p) ++seen[direct_q_k(p)];
  for (int k = 0; k < 16; ++k) EXPECT_EQ(seen[k], 1) << "k " << k;
}

// What the kernel's fragment code assumes of those orders, lane by lane (warp w, lane l: i = l / 4,
// q = l % 4, r0 = 16 w + i), and that its shared-memory loads of a slot (records 656 bytes apart)
// hit 32 different banks per warp instruction.
TEST(MlaSm90Layout, DirectFragmentsFollowTheOrdersWithoutBankConflicts) {
  const auto bank = [](int byte) { return (byte / 4) % 32; };
  for (int w = 0; w < 4; ++w) {
    for (int l = 0; l < 32; ++l) {
      const int i = l / 4, q = l % 4, r0 = 16 * w + i;
      // S^T's rows r0, r0 + 8 are P's k positions 16 w + 2 i and + 1 (one byte pair per head).
      EXPECT_EQ(direct_token(16 * w + 2 * i), r0);
      EXPECT_EQ(direct_token(16 * w + 2 * i + 1), r0 + 8);
      // P V's A fragment: k step ks, half e, byte j of the register is the record the kernel loads.
      for (int ks = 0; ks < 2; ++ks) {
        for (int e = 0; e < 2; ++e) {
          for (int j = 0; j < 4; ++j) {
            EXPECT_EQ(32 * ks + 16 * e + 8 * (j & 1) + (j >> 1) + 2 * q, direct_token(32 * ks + 16 * e + 4 * q + j));
          }
        }
      }
      // O^T's rows r0, r0 + 8 of m-blocks 2 g, 2 g + 1: the four adjacent columns the stores write.
      for (int g = 0; g < 4; ++g) {
        const int col = 128 * g + 4 * (8 * w + i);
        EXPECT_EQ(direct_column(2 * g, r0), col);
        EXPECT_EQ(direct_column(2 * g, r0 + 8), col + 1);
        EXPECT_EQ(direct_column(2 * g + 1, r0), col + 2);
        EXPECT_EQ(direct_column(2 * g + 1, r0 + 8), col + 3);
      }
    }
    // One warp instruction: S^T's words (row r0, byte 32 c + 4 q of group g), P V's (record
    // direct_token(...), column word 4 (8 w + i) of group g).
    for (int g = 0; g < 4; ++g) {
      for (int c = 0; c < 4; ++c) {
        std::vector<int> banks_s(32, 0), banks_v(32, 0);
        for (int l = 0; l < 32; ++l) {
          const int i = l / 4, q = l % 4, r0 = 16 * w + i;
          ++banks_s[bank(r0 * kTokenBytes + 128 * g + 32 * c + 4 * q)];
          const int ks = c / 2, e = c % 2;  // (c picks one of the four (ks, e) loads; j = 0)
          ++banks_v[bank(direct_token(32 * ks + 16 * e + 4 * q) * kTokenBytes + 128 * g + 4 * (8 * w + i))];
        }
        for (int b = 0; b < 32; ++b) {
          EXPECT_EQ(banks_s[b], 1) << "S^T load, warp " << w << " group " << g << " chunk " << c;
          EXPECT_EQ(banks_v[b], 1) << "P V load, warp " << w << " group " << g << " (ks, e) " << c;
        }
      }
    }
  }
  // S^T's widened words: byte 4 q + b of a fragment word is k 2 q + b (b < 2) or 8 + 2 q + b - 2
  // of its k16 step (the f16 pairs .x and .y of e4m3x4_to_f16x4 as a0 and a2).
  for (int q = 0; q < 4; ++q) {
    for (int b = 0; b < 4; ++b) EXPECT_EQ(direct_q_k(4 * q + b), b < 2 ? 2 * q + b : 8 + 2 * q + b - 2);
  }
}

// MODEL1's token in the direct kernel (direct_model1.cuh): P V's column order (m-block mb is one
// scale group, or the RoPE's 64 columns), the RoPE block's k order (an involution).
TEST(MlaSm90Layout, DirectModel1OrdersArePermutations) {
  std::vector<int> seen(512, 0);
  for (int mb = 0; mb < 8; ++mb) {
    for (int m = 0; m < 64; ++m) {
      const int col = direct_m1_column(mb, m);
      ASSERT_GE(col, 0);
      ASSERT_LT(col, 512);
      ++seen[col];
      EXPECT_EQ(col / 64, mb) << "m-block mb holds group mb's columns (7: the RoPE's)";
    }
  }
  for (int c = 0; c < 512; ++c) EXPECT_EQ(seen[c], 1) << "column " << c;
  std::vector<int> tokens(64, 0);
  for (int kappa = 0; kappa < 64; ++kappa) {
    ++tokens[direct_m1_rope_token(kappa)];
    EXPECT_EQ(direct_m1_rope_kappa(direct_m1_rope_token(kappa)), kappa);
    EXPECT_EQ(direct_m1_rope_token(kappa) / 16, kappa / 16) << "a k16 step's tokens stay in it";
  }
  for (int t = 0; t < 64; ++t) EXPECT_EQ(tokens[t], 1) << "token " << t;
}

// The MODEL1 fragments lane by lane (warp w, lane l: i = l / 4, q = l % 4, r0 = 16 w + i) and the
// banks of every shared-memory load pattern of a slot (records 656 bytes apart; the row at 0, the
// RoPE at 448, the scales at 576): each warp instruction reads at most one word per bank (lanes
// reading the same word are one access).
TEST(MlaSm90Layout, DirectModel1FragmentsWithoutBankConflicts) {
  constexpr int kRope = 448, kScales = 576;
  static_assert(kScales + 8 <= kTokenBytes && kTokenBytes % 8 == 0 && kScales % 8 == 0, "scales: one lds64");
  // A warp instruction's bytes (one per lane) touch each bank in at most one word.
  const auto conflict_free = [](const std::vector<int>& bytes) {
    std::vector<std::set<int>> words(32);
    for (const int b : bytes) words[(b / 4) % 32].insert(b / 4);
    for (const auto& w : words) {
      if (w.size() > 1) return false;
    }
    return true;
  };
  for (int w = 0; w < 4; ++w) {
    for (int l = 0; l < 32; ++l) {
      const int i = l / 4, r0 = 16 * w + i;
      // S^T's rows r0, r0 + 8 are the RoPE P's adjacent k positions (one bf16 pair per head).
      EXPECT_EQ(direct_m1_rope_token(direct_m1_rope_kappa(r0)), r0);
      EXPECT_EQ(direct_m1_rope_kappa(r0 + 8), direct_m1_rope_kappa(r0) + 1);
      EXPECT_EQ(direct_m1_rope_kappa(r0) % 2, 0);
      // O^T's rows r0, r0 + 8 of m-block mb: two adjacent columns (bytes of one 16-bit load; the
      // RoPE's one 32-bit word), the stores' column.
      for (int mb = 0; mb < 8; ++mb) {
        EXPECT_EQ(direct_m1_column(mb, r0), 64 * mb + 2 * (8 * w + i));
        EXPECT_EQ(direct_m1_column(mb, r0 + 8), direct_m1_column(mb, r0) + 1);
      }
    }
    // S^T: the NoPE words of group g, chunk c (+ 16: the second word), the RoPE's of step ks.
    for (int g = 0; g < 7; ++g) {
      for (int c = 0; c < 2; ++c) {
        for (int half : {0, 16}) {
          std::vector<int> b;
          for (int l = 0; l < 32; ++l) {
            b.push_back((16 * w + l / 4) * kTokenBytes + 64 * g + 32 * c + 4 * (l % 4) + half);
          }
          EXPECT_TRUE(conflict_free(b)) << "S^T NoPE, warp " << w << " group " << g << " chunk " << c;
        }
      }
    }
    for (int ks = 0; ks < 4; ++ks) {
      std::vector<int> b;
      for (int l = 0; l < 32; ++l) b.push_back((16 * w + l / 4) * kTokenBytes + kRope + 32 * ks + 4 * (l % 4));
      EXPECT_TRUE(conflict_free(b)) << "S^T RoPE, warp " << w << " step " << ks;
    }
    // P V: group g's 16-bit loads of token direct_token(32 ks + 16 e + 4 q + j), columns
    // 64 g + 2 (8 w + i); the RoPE's words of token direct_m1_rope_token(16 st + 8 hh + 2 q + b).
    for (int g = 0; g < 7; ++g) {
      for (int kse = 0; kse < 4; ++kse) {
        for (int j = 0; j < 4; ++j) {
          std::vector<int> b;
          for (int l = 0; l < 32; ++l) {
            const int q = l % 4, i = l / 4;
            b.push_back(direct_token(16 * kse + 4 * q + j) * kTokenBytes + 64 * g + 2 * (8 * w + i));
          }
          EXPECT_TRUE(conflict_free(b)) << "P V NoPE, warp " << w << " group " << g;
        }
      }
    }
    for (int st = 0; st < 4; ++st) {
      for (int hb = 0; hb < 4; ++hb) {
        std::vector<int> b;
        for (int l = 0; l < 32; ++l) {
          const int q = l % 4, i = l / 4;
          b.push_back(direct_m1_rope_token(16 * st + 8 * (hb >> 1) + 2 * q + (hb & 1)) * kTokenBytes + kRope +
                      4 * (8 * w + i));
        }
        EXPECT_TRUE(conflict_free(b)) << "P V RoPE, warp " << w << " step " << st;
      }
    }
  }
  // The kernel's P V loads: token direct_token's closed form at j (+ 2 q in its base offset), and
  // the RoPE pair t, t + 8 for k positions 2 q (+ 8 hh) and + 1.
  for (int q = 0; q < 4; ++q) {
    for (int st = 0; st < 4; ++st) {
      for (int hh = 0; hh < 2; ++hh) {
        const int t = direct_m1_rope_token(16 * st + 8 * hh + 2 * q);
        EXPECT_EQ(direct_m1_rope_token(16 * st + 8 * hh + 2 * q + 1), t + 8);
      }
    }
  }
}

}  // namespace
}  // namespace deca::mla::sm90
