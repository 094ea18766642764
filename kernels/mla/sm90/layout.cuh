// The addresses and fragment orders of the sm90a MLA kernels: the K tile's stores of the wide
// kernel's producers (producer.cuh) and the records' orders the direct kernel's consumers read
// (direct_consumer.cuh), as host- and device-callable functions so that tests/plan can check them
// without a GPU.
#pragma once

#include "kernels/mla/sm90/traits.cuh"

namespace deca::mla::sm90 {

// Byte offset of 16-byte unit `unit` (0..7) of row `row` inside a 64-row x 128 B swizzled chunk
// (the 128 B swizzle: unit u of row r at u ^ (r % 8)).
DECA_HD constexpr unsigned swz(int row, int unit) {
  return static_cast<unsigned>(row * 128 + ((unit ^ (row & 7)) << 4));
}

// The whole-row pieces (producer.cuh): lane l (0..31, one token per warp) converts unit l % 8 of
// chunk rows_chunk(l) (its first store) and of chunk rows_chunk(l) + 2 (its second): the 8 NoPE bytes
// at rows_nope_byte(l) and 128 further, with the two groups' scales (chunks c, c + 2 are groups
// c / 2 and c / 2 + 1: adjacent) as one 8-byte load at rows_scale_byte(l). Eight lanes fill one
// 128-byte row per store: a store instruction writes four whole rows (chunks 0, 1, 4, 5, then
// 2, 3, 6, 7).
DECA_HD constexpr int rows_chunk(int l) { return ((l >> 3) & 1) + 4 * (l >> 4); }
DECA_HD constexpr int rows_nope_byte(int l) { return 64 * rows_chunk(l) + 8 * (l & 7); }
DECA_HD constexpr int rows_scale_byte(int l) { return kDimNope + 8 * (l >> 4); }

// The whole-row pieces in a producer warpgroup's share of a block (first_token a multiple of 8,
// 16 / kWays pieces per lane): lane l of warp g stores its piece u (token n = first_token + g + 4 u) at
// at[u % 2] + 512 u of the tile (the first unit; the second 2 kChunkBytes further), since
// n % 8 = g + 4 (u % 2): two registers and immediates instead of one address per piece.
struct RowsStores {
  unsigned at[2];
};
DECA_HD constexpr RowsStores rows_stores(int l, int g, int first_token) {
  const unsigned row0 = static_cast<unsigned>(rows_chunk(l) * kChunkBytes + (first_token + g) * 128);
  const unsigned sw = static_cast<unsigned>(((l & 7) ^ g) << 4);
  return RowsStores{{row0 + sw, row0 + (sw ^ 64u)}};
}

// ---- The direct kernel (direct.cuh): the orders its consumers' fragments read the records in ----
// (direct_layout tests: bijections, conflict-free loads, the identities the kernel relies on.)

// P V's token order: k position kappa = 32 ks + 16 e + 4 q + j of a k step pair holds token
// direct_token(kappa) = 32 ks + 16 e + 8 (j % 2) + 2 q + j / 2. The four lanes q of a fragment
// load then read records 2 apart (656 B = 4 banks per record: 8 banks apart, conflict-free), and
// the tokens r0, r0 + 8 a thread holds in S^T (r0 = 16 w + i) sit at kappa 16 w + 2 i and + 1.
DECA_HD constexpr int direct_token(int kappa) {
  const int ks = kappa >> 5, e = (kappa >> 4) & 1, q = (kappa >> 2) & 3, j = kappa & 3;
  return 32 * ks + 16 * e + 8 * (j & 1) + 2 * q + (j >> 1);
}
// P V's column order: row m of m-block mb (64 rows, two per group) holds column
// direct_column(mb, m) of the group-major 512: a thread's rows r0, r0 + 8 of m-blocks 2 g and
// 2 g + 1 are four adjacent columns (its fragment loads are single words; its stores 4 columns).
DECA_HD constexpr int direct_column(int mb, int m) {
  const int w = m >> 4, i = m & 7, hi = (m >> 3) & 1;
  return 128 * (mb >> 1) + 4 * (8 * w + i) + 2 * (mb & 1) + hi;
}

// S^T's k order over the NoPE part: a thread's fragment words are the record's bytes 32 c + 4 q
// .. + 3 and 16 further (c = 0..15, the fp8 chunk); widened to f16 pairs, bytes 4 q, + 1 and
// 4 q + 2, + 3 of each word are k 2 q, + 1 and 8 + 2 q, + 1 of a k16 step (steps 2 c and 2 c + 1
// for the two words). NoPE dimension d is therefore at k16 step j = d / 16, position
// direct_q_k(d % 16) of it; the f16 Q row keeps that order (chunk j / 4, bytes 32 (j % 4) + 2 k).
DECA_HD constexpr int direct_q_k(int p) { return 2 * (p >> 2) + (p & 1) + 8 * ((p >> 1) & 1); }


// ---- The direct kernel's MODEL1 token (direct_model1.cuh) ----
// P V's column order: m-block mb holds one B (one scale group), so row m of it is column
// direct_m1_column(mb, m) of group mb (mb 7: the RoPE's 64 columns): a thread's rows r0, r0 + 8
// are two adjacent columns, one 16-bit load a token (one 32-bit word of the RoPE).
DECA_HD constexpr int direct_m1_column(int mb, int m) {
  const int w = m >> 4, i = m & 7, hi = (m >> 3) & 1;
  return 64 * mb + 16 * w + 2 * i + hi;
}
// The RoPE block's k order (bf16 P, k16 steps): k position kappa = 16 s + 8 h + 2 q + b holds
// token 16 s + 8 b + 2 q + h (bits 0 and 3 swapped: its own inverse). A fragment load of lane
// (i, q) then reads records 2 q + h + 8 b (x 4 banks: 8 q + 4 h, conflict-free over i), and the
// tokens r0, r0 + 8 of a thread's S^T rows sit at adjacent k positions (one word of P a head).
DECA_HD constexpr int direct_m1_rope_token(int kappa) {
  return (kappa & ~9) | ((kappa & 1) << 3) | ((kappa >> 3) & 1);
}
DECA_HD constexpr int direct_m1_rope_kappa(int token) { return direct_m1_rope_token(token); }

}  // namespace deca::mla::sm90
