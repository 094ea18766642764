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

// The rows-on-M kernel's token orders (decode_rows.cuh). The S accumulator of a k32 step gives
// lane l columns 8 j + 2 (l % 4) + {0, 1}; the 8-bit A fragment wants k 4 (l % 4) + 0..3 (and
// + 16). Token t = 16 g + 4 a + 2 b + c of a tile goes to K row 16 g + 8 b + 2 a + c, so that
// element e of lane l (column 8 (e / 4) + 2 (l % 4) + (e & 1)) is token
// rows_on_m_token(e, l) and the four values a lane packs into one A register are tokens
// 4 (l % 4) + 0..3 of their 16: A position k is token k, and V^T wants the plain order.
DECA_HD constexpr int rows_on_m_k_row(int t) {
  return (t & ~15) | (((t >> 1) & 1) << 3) | (((t >> 2) & 3) << 1) | (t & 1);
}
DECA_HD constexpr int rows_on_m_token(int e, int l) {
  return 16 * (e >> 3) + 4 * (l & 3) + 2 * ((e >> 2) & 1) + (e & 1);
}
// V row of token t = 4 qd + j: the row the transpose reads as byte j of block qd (quad_token(qd) +
// 0, 8, 64, 72), so that V^T byte position t holds token t.
DECA_HD constexpr int rows_on_m_v_row(int t) {
  return quad_token(t >> 2) + 8 * (t & 1) + 64 * ((t >> 1) & 1);
}

}  // namespace deca::gqa::sm90
