// Shared-memory layouts of the Hopper GQA kernels' tiles (kernels/gqa/sm90/decode.cuh,
// decode_rows.cuh), as plain constexpr functions: the device code and the host tests
// (tests/plan/gqa_sm90_layout_test.cpp, coverage and bank conflicts) read the same lines.
#pragma once

#include "kernels/common/kv_kind.cuh"  // DECA_HD

namespace deca::gqa::sm90 {

// Byte `byte` of row `row` in a tile of 128-byte rows in the 128-byte swizzle.
DECA_HD constexpr unsigned swz128(int row, int byte) {
  return static_cast<unsigned>(row * 128 + ((((byte >> 4) ^ (row & 7))) << 4) + (byte & 15));
}

// A KV cache's stride in bytes, as the loader (tile_loader.cuh) adds it to the cache's address:
// GqaParams counts its cache strides in elements (kernels/gqa/params.cuh, the tensors' strides),
// of kKvBytes bytes each (1 fp8, 2 bf16 / fp16: traits.cuh kv_bytes_of). The 16-byte chunk c of
// token row (page, slot) of kv head h starts h x cache_bytes(stride_head) + page x
// cache_bytes(stride_page) + slot x cache_bytes(stride_slot) + 16 c bytes into the cache
// (tests/plan/gqa_sm90_loader_bytes_test.cpp).
template <int kKvBytes>
DECA_HD constexpr long long cache_bytes(long long stride_elems) {
  return stride_elems * kKvBytes;
}

// A K-major operand of rows wider than 128 B (16-bit values at head_dim 128: 256 B per row), as
// the wgmma descriptors of the 128-byte swizzle want it: column blocks of 128 B (64 values), each
// `rows` rows of 128 B swizzled, block b at b x 128 rows bytes. Byte `byte` of row `row`. The
// 16-bit caches' K and V stages (64 token rows: blocks 8 KB apart), q (kRows or 64 operand rows)
// and P^T (64 tokens: one block) use it; a k16 step kk of a K-major operand starts at
// blocked128(0, 32 kk, rows), V read MN-major (d on M / N, tokens on K) starts a 16-token step at
// 2048 kk and d block m at 8192 m.
DECA_HD constexpr unsigned blocked128(int row, int byte, int rows) {
  return static_cast<unsigned>((byte >> 7) * rows * 128) + swz128(row, byte & 127);
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
