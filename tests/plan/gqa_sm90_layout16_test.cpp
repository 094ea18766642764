// The Hopper GQA kernels' layouts for 16-bit caches (kernels/gqa/sm90/layout.cuh blocked128,
// traits.cuh, tile_loader.cuh, decode.cuh, decode_rows.cuh) on the host: the loader's chunks cover
// a tile once, and every wgmma descriptor the kernels build (start offset, LBO, SBO, the 128-byte
// swizzle) addresses, by the PTX ISA's canonical K-major and MN-major layouts, the bytes where the
// loader, q's store and P's stores put each element; the accumulator-to-fragment maps.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kernels/gqa/sm90/layout.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {
namespace {

// The hardware's 128-byte swizzle on an absolute shared address: bits [4, 6] ^= bits [7, 9].
unsigned swizzle128(unsigned a) { return a ^ (((a >> 7) & 7u) << 4); }
// Element (row, k) of a K-major 16-bit operand in the 128-byte swizzle (PTX ISA, "Shared Memory
// Matrix Layout"): 8-row groups SBO apart, rows of 128 B, k < 64 - (start % 128) / 2.
unsigned kmajor(unsigned start, unsigned sbo, int row, int k) {
  return swizzle128(start + (row / 8) * sbo + (row % 8) * 128 + 2 * k);
}
// Element (mn, k) of an MN-major 16-bit operand: 64 values of M or N per 128 B row, blocks of 64
// LBO apart, K rows of 128 B in groups of 8 SBO apart.
unsigned mnmajor(unsigned start, unsigned lbo, unsigned sbo, int mn, int k) {
  return swizzle128(start + (mn / 64) * lbo + 2 * (mn % 64) + (k % 8) * 128 + (k / 8) * sbo);
}

constexpr unsigned kBase = 0x8000;  // any 1024-aligned base (CtaSmem rounds it up)
constexpr int kTok = tile_tokens(2);

TEST(GqaSm90Layout16, LoaderChunksCoverATileOnce) {
  ASSERT_EQ(kTok, 64);
  constexpr int kChunks = 16, kRowStep = 128 / kChunks, kLoads = kTok * kChunks / 128;
  std::vector<int> hits(kStageBytes, 0);
  for (int tid = 0; tid < 128; ++tid) {
    const int row0 = tid >> 4, chunk = tid & 15;
    const unsigned dst0 = blocked128(row0, 16 * chunk, kTok);
    for (int i = 0; i < kLoads; ++i) {
      const unsigned dst = dst0 + 128u * kRowStep * i;  // the loader's step
      EXPECT_EQ(dst, blocked128(row0 + kRowStep * i, 16 * chunk, kTok));
      for (int b = 0; b < 16; ++b) ++hits[dst + b];
    }
  }
  for (int b = 0; b < kStageBytes; ++b) ASSERT_EQ(hits[b], 1) << b;
}

// S^T = K q^T (rows on N, decode.cuh qk_chain_16bit) and S = q K^T (rows on M): K and q K-major,
// a k16 step kk starting at blocked128(0, 32 kk, rows), SBO 1024.
TEST(GqaSm90Layout16, KMajorDescriptorsSeeKAndQWhereTheyAreStored) {
  for (int stages : {2, 3}) {
    for (int rows : {8, 16, 64}) {
      const SmemPlan plan = make_plan(rows == 64 ? 64 : rows, stages, rows == 64);
      ASSERT_EQ(plan.q_lo - plan.q_hi, rows * 128);  // q's second column block is the q_lo area
      for (int st = 0; st < stages; ++st) {
        const unsigned k_off = st * 2 * kStageBytes;
        for (int kk = 0; kk < kDim / 16; ++kk) {
          for (int k = 0; k < 16; ++k) {
            const int d = 16 * kk + k;
            for (int t = 0; t < kTok; ++t) {
              ASSERT_EQ(kmajor(kBase + k_off + blocked128(0, 32 * kk, kTok), 1024, t, k),
                        kBase + k_off + blocked128(t, 2 * d, kTok));
            }
            for (int r = 0; r < rows; ++r) {
              ASSERT_EQ(kmajor(kBase + plan.q_hi + blocked128(0, 32 * kk, rows), 1024, r, k),
                        kBase + plan.q_hi + blocked128(r, 2 * d, rows));
            }
          }
        }
      }
      if (rows == 64) continue;
      // P^T (rows on N): N rows of 64 tokens, one column block; step kk starts at 32 kk.
      for (int kk = 0; kk < kTok / 16; ++kk) {
        for (int n = 0; n < rows; ++n) {
          for (int k = 0; k < 16; ++k) {
            ASSERT_EQ(kmajor(kBase + plan.p_hi + 32 * kk, 1024, n, k),
                      kBase + plan.p_hi + swz128(n, 2 * (16 * kk + k)));
          }
        }
      }
    }
  }
}

// V read as stored, MN-major: rows on N, A = V^T (d half m: start 8192 m + 2048 kk, M = 64 so
// LBO unused); rows on M, B = V with N = 128 d (LBO 8192 between the d blocks).
TEST(GqaSm90Layout16, MnMajorDescriptorsSeeVAsStored) {
  const unsigned v_off = kStageBytes;  // stage 0's V
  for (int kk = 0; kk < kTok / 16; ++kk) {
    for (int k = 0; k < 16; ++k) {
      const int t = 16 * kk + k;
      for (int m = 0; m < 2; ++m) {
        for (int mn = 0; mn < 64; ++mn) {
          ASSERT_EQ(mnmajor(kBase + v_off + 8192u * m + 2048u * kk, 16, 1024, mn, k),
                    kBase + v_off + blocked128(t, 2 * (64 * m + mn), kTok));
        }
      }
      for (int d = 0; d < kDim; ++d) {
        ASSERT_EQ(mnmajor(kBase + v_off + 2048u * kk, 8192, 1024, d, k), kBase + v_off + blocked128(t, 2 * d, kTok));
      }
    }
  }
}

// head_dim 64 (128-token tiles of one column block): S^T's two m64 token halves at 8192 h, P^T of
// 128 tokens in two column blocks (the p_hi and p_lo areas), V's single d block read MN-major at
// 2048 kk over eight k-steps; rows on M: S's B = K with N = 128 tokens, O's B = V with N = 64.
TEST(GqaSm90Layout16, HeadDim64DescriptorsSeeTheirOperands) {
  constexpr int kTok64 = tile_tokens(2, 64);
  ASSERT_EQ(kTok64, 128);
  for (int rows : {8, 16}) {
    const SmemPlan plan = make_plan(rows, 3);
    ASSERT_EQ(plan.p_lo - plan.p_hi, rows * 128);  // P^T's second column block
    for (int kk = 0; kk < 4; ++kk) {                // QK: 64 dims
      for (int k = 0; k < 16; ++k) {
        for (int h = 0; h < 2; ++h) {
          for (int t = 0; t < 64; ++t) {
            ASSERT_EQ(kmajor(kBase + blocked128(64 * h, 32 * kk, kTok64), 1024, t, k),
                      kBase + blocked128(64 * h + t, 2 * (16 * kk + k), kTok64));
          }
        }
      }
    }
    for (int kk = 0; kk < kTok64 / 16; ++kk) {  // PV: 128 tokens
      for (int k = 0; k < 16; ++k) {
        const int t = 16 * kk + k;
        for (int n = 0; n < rows; ++n) {
          ASSERT_EQ(kmajor(kBase + plan.p_hi + blocked128(0, 32 * kk, rows), 1024, n, k),
                    kBase + plan.p_hi + blocked128(n, 2 * t, rows));
        }
        for (int d = 0; d < 64; ++d) {  // A = V^T (M = 64 d) and, rows on M, B = V (N = 64 d)
          ASSERT_EQ(mnmajor(kBase + kStageBytes + 2048u * kk, 128u * kTok64, 1024, d, k),
                    kBase + kStageBytes + blocked128(t, 2 * d, kTok64));
        }
      }
    }
  }
  // Rows on M: S = q K^T, B = K with N = 128 token rows (16 groups of 8, SBO 1024).
  for (int kk = 0; kk < 4; ++kk) {
    for (int k = 0; k < 16; ++k) {
      for (int t = 0; t < kTok64; ++t) {
        ASSERT_EQ(kmajor(kBase + blocked128(0, 32 * kk, kTok64), 1024, t, k),
                  kBase + blocked128(t, 2 * (16 * kk + k), kTok64));
      }
    }
  }
}

// Rows on M: the S accumulators (m64n64, element e of lane l: row l / 4 + 8 ((e >> 1) & 1), column
// 8 (e >> 2) + 2 (l % 4) + (e & 1)) packed as A register j of step kk from elements 8 kk + 2 j, + 1
// are the m64k16 fragment's (a0 row l / 4, k 2 (l % 4) + {0, 1}; a1 row + 8; a2 k + 8; a3 both).
TEST(GqaSm90Layout16, RowsOnMAccumulatorsAreTheAFragments) {
  for (int l = 0; l < 32; ++l) {
    for (int kk = 0; kk < 4; ++kk) {
      for (int j = 0; j < 4; ++j) {
        for (int c = 0; c < 2; ++c) {
          const int e = 8 * kk + 2 * j + c;
          const int s_row = l / 4 + 8 * ((e >> 1) & 1), s_col = 8 * (e >> 2) + 2 * (l % 4) + (e & 1);
          const int a_row = l / 4 + 8 * (j & 1), a_k = 2 * (l % 4) + c + 8 * (j >> 1);
          EXPECT_EQ(s_row, a_row);
          EXPECT_EQ(s_col, 16 * kk + a_k);
        }
      }
    }
  }
}

// Rows on N: P^T's 16-bit stores (decode.cuh) write every (query row, token) of a tile once; the
// token of S^T element e0 / e0 + 2 of column cc is the stored one.
TEST(GqaSm90Layout16, RowsOnNPStoresCoverPOnce) {
  for (int rows : {8, 16}) {
    std::vector<int> hits(rows * 128, 0);
    for (int w = 0; w < 4; ++w) {
      for (int l = 0; l < 32; ++l) {
        for (int cc = 0; cc < rows / 4; ++cc) {
          const int r = 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1);
          const int e0 = 4 * (cc >> 1) + (cc & 1);
          for (int half = 0; half < 2; ++half) {
            const int e = e0 + 2 * half;
            const int tok_acc = 16 * w + (l >> 2) + 8 * ((e >> 1) & 1);  // S^T's token of e
            const int col_acc = 8 * (e >> 2) + 2 * (l & 3) + (e & 1);    // S^T's column of e
            const int tok = 16 * w + (l >> 2) + 8 * half;                 // the stored one
            EXPECT_EQ(tok_acc, tok);
            EXPECT_EQ(col_acc, r);
            const unsigned a = swz128(r, 2 * tok);
            ++hits[a], ++hits[a + 1];
          }
        }
      }
    }
    for (int b = 0; b < rows * 128; ++b) ASSERT_EQ(hits[b], 1) << rows << " " << b;
  }
}

}  // namespace
}  // namespace deca::gqa::sm90
