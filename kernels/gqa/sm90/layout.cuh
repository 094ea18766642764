// Shared-memory layouts of the Hopper fp8 GQA kernel's tiles (kernels/gqa/sm90/decode.cuh), as
// plain constexpr functions: the device code and the host tests (tests/plan/gqa_sm90_layout_test.cpp,
// coverage and bank conflicts) read the same lines.
#pragma once

#include "kernels/common/kv_kind.cuh"  // DECA_HD

namespace deca::gqa::sm90 {

// Byte `byte` of row `row` in a tile of 128-byte rows in the 128-byte swizzle.
DECA_HD constexpr unsigned swz128(int row, int byte) {
  return static_cast<unsigned>(row * 128 + ((((byte >> 4) ^ (row & 7))) << 4) + (byte & 15));
}

// PV's token order. The PV product sums over the tile's tokens in any order, so V^T and P^T store
// token 64 h + 16 w + r + 8 e (h, e in {0, 1}, w the warp, r in 0..7) at byte position
// 4 (8 w + r) + 2 h + e of their rows: the four S^T values a thread holds for one query row (its
// tokens 16 w + l / 4 + {0, 8, 64, 72}) are then four consecutive bytes of P^T, one 32-bit store
// per term. V is transposed in the same grouping: a block is the four tokens of one position
// quad qd (rows t(qd) + {0, 8, 64, 72}, t(qd) = 16 (qd / 8) + qd % 8) times four d.
DECA_HD constexpr int quad_token(int qd) { return 16 * (qd >> 3) + (qd & 7); }

// The blocks (quad qd, d block db: d 4 db ..) a thread transposes in iteration i (0..7) of warp w:
// a linear map of the lane's bits, chosen so that the 32 lanes' 32-bit reads (token rows) and
// writes (d rows) each hit 32 distinct banks through the swizzle, XORed with w * 8 + i so that the
// 4 warps x 8 iterations x 32 lanes cover each of the 32 x 32 blocks once (tests/plan/
// gqa_sm90_layout_test.cpp checks both).
DECA_HD constexpr void transpose_block(int w, int i, int l, int& qd, int& db) {
  const int l0 = l & 1, l1 = (l >> 1) & 1, l2 = (l >> 2) & 1, l3 = (l >> 3) & 1, l4 = (l >> 4) & 1;
  qd = l0 | (l1 << 1) | (l2 << 2) | (l3 << 3) | ((l4 ^ l0) << 4);
  db = (l0 | (l1 << 1) | ((l2 ^ l0) << 2) | ((l3 ^ l1) << 3) | ((l4 ^ l2) << 4)) ^ (w * 8 + i);
}

// Byte offsets of iteration i's block of thread (w, l) from a 1024-aligned tile: where its four
// token rows are read (rows + 0, 8, 64, 72 at + 0, 1024, 8192, 9216: the same row % 8, so the same
// swizzle) and where its four d rows j are written (((tile + write) ^ 16 j) + 128 j: in
// swz128(4 db + j, x) the 16-byte unit is (x / 16) ^ ((4 db + j) % 8) = ((x / 16) ^ 4 (db % 2)) ^ j,
// and the XOR commutes with adding a 1024-aligned base).
DECA_HD constexpr unsigned transpose_read_offset(int w, int i, int l) {
  int qd = 0, db = 0;
  transpose_block(w, i, l, qd, db);
  return swz128(quad_token(qd), 4 * db);
}
DECA_HD constexpr unsigned transpose_write_offset(int w, int i, int l) {
  int qd = 0, db = 0;
  transpose_block(w, i, l, qd, db);
  return swz128(4 * db, 4 * qd);
}

// The rows-on-M kernel's V transpose (decode_rows.cuh). K and V stay in token order, so element e
// of lane l of the S accumulator is token rows_on_m_token(e, l) = 8 (e / 4) + 2 (l % 4) + (e & 1)
// of the tile. The 8-bit A fragment of a k32 step takes k positions 4 (l % 4) + c (and + 16): a
// lane packs its elements 16 kk + {0, 1, 4, 5} (+ 8), so A position 16 g + 4 q + c holds token
// 16 g + 2 q + (c & 1) + 8 (c >> 1). The transpose writes V^T in that order: ldmatrix.trans of
// two 8 x 8 b16 blocks of V (tokens tb .. tb + 15, 16 d bytes) gives lane (q = l % 4, g = l / 4)
// tokens tb + 2 q, + 1 (and + 8, + 9) of d 2 g and 2 g + 1; two prmt make the four tokens of each d,
// which is that order; stmatrix writes them. V^T's rows are permuted in d so that each stmatrix
// block is eight consecutive rows: row n holds d rows_on_m_d(n) = 16 (n / 16) + 2 (n % 8) +
// (n / 8) % 2 (O's columns come out in that order, the epilogue maps them back).
DECA_HD constexpr int rows_on_m_token(int e, int l) { return 8 * (e >> 2) + 2 * (l & 3) + (e & 1); }
DECA_HD constexpr int rows_on_m_a_token(int k) {  // token at A position k of a tile
  return (k & ~15) + 2 * ((k >> 2) & 3) + (k & 1) + 8 * ((k >> 1) & 1);
}
DECA_HD constexpr int rows_on_m_d(int n) { return (n & ~15) + 2 * (n & 7) + ((n >> 3) & 1); }
// Per lane: the ldmatrix row address of d block dbi (32 d) relative to token block 0 of the V
// tile (token block b adds 2048 b), and the stmatrix row address of token block tbi (16 tokens)
// relative to V^T (d block dbi adds 4096 dbi).
DECA_HD constexpr unsigned rows_on_m_ldsm_offset(int l, int dbi) {
  return swz128((l & 7) + 8 * ((l >> 3) & 1), 32 * dbi + 16 * (l >> 4));
}
DECA_HD constexpr unsigned rows_on_m_stsm_offset(int l, int tbi) { return swz128(l, 16 * tbi); }

}  // namespace deca::gqa::sm90
