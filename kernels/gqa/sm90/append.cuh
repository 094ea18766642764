// The Hopper GQA kernels' fused decode step (decode.cuh, decode_rows.cuh; Cfg::kRopeStyle != 0;
// the arithmetic in kernels/gqa/fused.cuh, the scheme in sm80/append.cuh): q is rotated where it
// is loaded (q_tile.cuh), and a landed tile that holds new tokens of the CTA's key range gets their
// K and V codes written over the slots' bytes, at the 128-byte swizzle's places, before the
// wgmma and the V transpose read the stage; the CTA of row block 0 also writes them to the cache.
#pragma once

#include "kernels/gqa/fused.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/sm90/cta.cuh"
#include "kernels/gqa/sm90/layout.cuh"

namespace deca::gqa::sm90 {

// Whether the tile from t0 may hold a new token (CTA-uniform).
template <class T>
__device__ __forceinline__ bool tile_has_new(const GqaParams& p, const Unit& u, int t0) {
  return t0 + T::kTile > u.seq_len - p.q_len && t0 < u.seq_len;
}

// This thread's first new-token item of the unit, coded at the start (fused.cuh early_pair).
template <class T>
__device__ __forceinline__ fused::EarlyPair early_new_pair(const GqaParams& p, const Unit& u, int row_block) {
  return fused::kernel_early_pair<T>(p, u.request, u.seq_len, u.kv_head, u.first, u.end,
                                     static_cast<int>(threadIdx.x), row_block == 0);
}

// The new tokens of [t0, t0 + kTile) inside the unit's keys into the K and V stages at generic
// addresses ks / vs (fp8: rows of 128 e4m3 bytes, swizzled; 16-bit: the codes at their places in
// the two column blocks, blocked128). The caller fences (generic -> async proxy) and synchronises
// before the stage is read.
template <class T>
__device__ __forceinline__ void append_new_tokens(const GqaParams& p, const Unit& u, int row_block, int t0,
                                                  unsigned char* ks, unsigned char* vs, const fused::EarlyPair& early) {
  fused::append_tile<T>(p, u.request, u.seq_len, u.kv_head, u.first, u.end, t0, T::kTile,
                        static_cast<int>(threadIdx.x), T::kThreads, early, row_block == 0,
                        [&](int r, int j, const fused::NewPair& c) {
                          if constexpr (T::k16) {
                            auto put = [&](unsigned char* tile, int d, unsigned code) {
                              *reinterpret_cast<unsigned short*>(tile + blocked128(r, 2 * d, T::kTile)) =
                                  static_cast<unsigned short>(code);
                            };
                            put(ks, c.kd.a, c.k0), put(ks, c.kd.b, c.k1);
                            put(vs, 2 * j, c.v0), put(vs, 2 * j + 1, c.v1);
                          } else {
                            ks[swz128(r, c.kd.a)] = static_cast<unsigned char>(c.k0);
                            ks[swz128(r, c.kd.b)] = static_cast<unsigned char>(c.k1);
                            vs[swz128(r, 2 * j)] = static_cast<unsigned char>(c.v0);
                            vs[swz128(r, 2 * j + 1)] = static_cast<unsigned char>(c.v1);
                          }
                        });
}

}  // namespace deca::gqa::sm90
