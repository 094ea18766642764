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

// The loader's map (tile_loader.cuh) at every 16-bit head_dim: C chunks per token row taken by L
// = min(C, 16) threads, thread (row tid / L + (128 / L) i, chunk tid % L + L j), its destination
// the first one's plus 128 B per row step and two column blocks per j (head_dim 256): each chunk
// where blocked128 puts it, every byte of the 16 KB tile once, every source byte of the rows once.
TEST(GqaSm90Layout16, LoaderChunksCoverATileOnce) {
  ASSERT_EQ(kTok, 64);
  for (int d : {64, 128, 256}) {
    const int tok = tile_tokens(2, d), chunks = 2 * d / 16;
    const int lane_chunks = chunks < 16 ? chunks : 16, reps = chunks / lane_chunks;
    const int row_step = 128 / lane_chunks, row_loads = tok / row_step;
    const unsigned rep_src = 16u * lane_chunks, rep_dst = rep_src / 128u * tok * 128u;
    ASSERT_EQ(row_step % 8, 0) << d;  // the swizzle phase (row % 8) is the same for all rows of a thread
    ASSERT_EQ(row_loads * reps * 128, tok * chunks) << d;
    std::vector<int> hits(kStageBytes, 0), src_hits(tok * 2 * d, 0);
    for (int tid = 0; tid < 128; ++tid) {
      const int row0 = tid / lane_chunks, chunk = tid % lane_chunks;
      const unsigned dst0 = blocked128(row0, 16 * chunk, tok);
      for (int i = 0; i < row_loads; ++i) {
        for (int j = 0; j < reps; ++j) {
          const unsigned dst = dst0 + 128u * row_step * i + rep_dst * j;  // the loader's steps
          const int row = row0 + row_step * i;
          const unsigned src = 16u * chunk + rep_src * j;  // bytes into the token's row
          EXPECT_EQ(dst, blocked128(row, static_cast<int>(src), tok)) << d;
          for (int b = 0; b < 16; ++b) ++hits[dst + b], ++src_hits[row * 2 * d + src + b];
        }
      }
    }
    for (int b = 0; b < kStageBytes; ++b) ASSERT_EQ(hits[b], 1) << d << " " << b;
    for (int b = 0; b < tok * 2 * d; ++b) ASSERT_EQ(src_hits[b], 1) << d << " " << b;
  }
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

// head_dim 256 (32-token tiles, four column blocks of 32 rows: 4 KB apart; q of 512 B rows, four
// blocks of N or 64 rows). Rows on N: S^T's A = K with M = 64 (rows 32..63 padding, read inside
// the stage), B = q; O^T's A = V^T, d block m at 4096 m, 16 tokens at 2048 kk; P^T's 32 tokens in
// the first 64 B of each row. Rows on M: S's A = q, B = K with N = 32; O's B = V with N = 256
// over the four blocks, LBO 4096.
TEST(GqaSm90Layout16, HeadDim256DescriptorsSeeTheirOperands) {
  constexpr int kT = tile_tokens(2, 256);
  ASSERT_EQ(kT, 32);
  for (int rows : {8, 16, 64}) {
    const bool on_m = rows == 64;
    const SmemPlan plan = make_kernel_plan(rows, 2, on_m, 2, 256);
    ASSERT_EQ(plan.p_hi - plan.q_hi, rows * 512);
    const unsigned k_off = 2 * kStageBytes, v_off = k_off + kStageBytes;  // stage 1
    for (int kk = 0; kk < 16; ++kk) {  // QK: 256 dims
      for (int k = 0; k < 16; ++k) {
        const int d = 16 * kk + k;
        for (int t = 0; t < 64; ++t) {
          const unsigned a = kmajor(kBase + k_off + blocked128(0, 32 * kk, kT), 1024, t, k);
          if (t < kT) {
            ASSERT_EQ(a, kBase + k_off + blocked128(t, 2 * d, kT));
          } else {  // padding rows of S^T (rows on N): inside the stage's K and V
            ASSERT_GE(a, kBase + k_off);
            ASSERT_LT(a, kBase + k_off + 2 * kStageBytes);
          }
        }
        for (int r = 0; r < rows; ++r) {
          ASSERT_EQ(kmajor(kBase + plan.q_hi + blocked128(0, 32 * kk, rows), 1024, r, k),
                    kBase + plan.q_hi + blocked128(r, 2 * d, rows));
        }
      }
    }
    for (int kk = 0; kk < kT / 16; ++kk) {  // PV: 32 tokens
      for (int k = 0; k < 16; ++k) {
        const int t = 16 * kk + k;
        for (int m = 0; m < 4; ++m) {
          for (int mn = 0; mn < 64; ++mn) {  // rows on N: A = V^T, d block m
            ASSERT_EQ(mnmajor(kBase + v_off + 128u * kT * m + 2048u * kk, 16, 1024, mn, k),
                      kBase + v_off + blocked128(t, 2 * (64 * m + mn), kT));
          }
        }
        for (int d = 0; d < 256; ++d) {  // rows on M: B = V, N = 256
          ASSERT_EQ(mnmajor(kBase + v_off + 2048u * kk, 128u * kT, 1024, d, k), kBase + v_off + blocked128(t, 2 * d, kT));
        }
        for (int n = 0; n < rows && !on_m; ++n) {  // P^T
          ASSERT_EQ(kmajor(kBase + plan.p_hi + blocked128(0, 32 * kk, rows), 1024, n, k),
                    kBase + plan.p_hi + swz128(n, 2 * t));
        }
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
    for (int tile : {64, 32}) {  // head_dim 128; 256, whose warps 2 and 3 are padding and store nothing
    std::vector<int> hits(rows * 128, 0);
    for (int w = 0; w < tile / 16; ++w) {
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
    for (int n = 0; n < rows; ++n) {
      for (int x = 0; x < 128; ++x) {  // PV reads bytes 0 .. 2 tile - 1 of a row
        ASSERT_EQ(hits[swz128(n, x)], x < 2 * tile ? 1 : 0) << rows << " " << n << " " << x;
      }
    }
    }
  }
}

}  // namespace
}  // namespace deca::gqa::sm90
