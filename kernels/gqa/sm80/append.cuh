// The portable GQA kernel's fused decode step (decode.cuh, Cfg::kRopeStyle != 0; the arithmetic
// in kernels/gqa/fused.cuh). Two phases of the kernel's own:
//  - rope: before q is loaded, the CTA's q rows rotated into the start of the dynamic shared memory
//    (the pipeline's ring, unused until the prologue); CtaCoords::q_row then points there.
//  - append: when a work item's tile holds new tokens of this CTA's range, their K and V codes
//    replace the slots' bytes in the landed ring stage, and the CTA of row block 0 writes them to
//    the cache. Each new token lies in exactly one split's range (the ranges partition the keys),
//    so each slot has one writer, and no CTA reads a slot that another CTA writes: the tile's
//    copy of the slot is overwritten in shared memory before any warp reads it.
#pragma once

#include "kernels/gqa/fused.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// The rotated q rows: kRows x head_dim q-dtype values at the dynamic shared memory's start.
template <class T>
__device__ __forceinline__ void rope_q_rows(const GqaParams& p, const CtaCoords<T>& cta, unsigned char* smem,
                                            int tid) {
  static_assert(T::kRows * T::kHeadDim * 2 <= T::kPipeBytes, "rotated q fits the ring");
  constexpr int kPairs = T::kHeadDim / 2;
  unsigned short* dst = reinterpret_cast<unsigned short*>(smem);
  for (int k = tid; k < T::kRows * kPairs; k += T::kThreads) {
    const int r = k / kPairs;
    const int j = k % kPairs;
    const int row = cta.row0 + r;
    if (row >= cta.rows_total) break;  // rows in order: every later k is past them too
    const int b = cta.row_batch(row);
    const int i = cta.row_tok(row);
    const int len = T::kBeamWidth == 1 ? cta.seq_len : load_seq_len<T>(p, b);
    const long long off = static_cast<const unsigned short*>(cta.q_src(p, row)) -
                          static_cast<const unsigned short*>(p.q);
    const fused::PairDims d = fused::pair_dims<T>(j);
    // An empty request (len 0) has no position; its rows output zeros whatever q holds.
    const float2 v = fused::rotated_pair<T>(p, p.q, off, len > 0 ? fused::token_pos<T>(p, b, i, len) : 0,
                                            len > 0 ? d : fused::PairDims{d.a, d.b, false}, j);
    dst[r * T::kHeadDim + d.a] = fused::q_bits<T>(v.x);
    dst[r * T::kHeadDim + d.b] = fused::q_bits<T>(v.y);
  }
}

// Whether the tile from t0 may hold a new token (CTA-uniform): the new tokens are the last q_len
// keys of each beam.
template <class T>
__device__ __forceinline__ bool tile_has_new(const GqaParams& p, const CtaCoords<T>& cta, int t0) {
  return t0 + T::kTile > cta.seq_min - p.q_len && t0 < cta.seq_len;
}

// The new tokens of the tile from t0 (work item of beam `beam_only`, -1: all beams) inside
// [range.begin, range.end): their codes into the landed stage (ks / vs generic pointers), and,
// for row block 0, into the cache (fused.cuh append_tile; `early`: beam 0's item coded at the
// start). The caller synchronises before the warps read the stage.
template <class T>
__device__ __forceinline__ void append_new_tokens(const GqaParams& p, const CtaCoords<T>& cta, const KeyRange& range,
                                                  int t0, int beam_only, unsigned char* ks, unsigned char* vs,
                                                  int tid, const fused::EarlyPair& early) {
  const bool write = cta.row_block == 0;
  const auto store = [&](int r, int j, const fused::NewPair& c) {
    unsigned char* k_row = ks + r * T::kRowStride;
    unsigned char* v_row = vs + r * T::kRowStride;
    fused::store_code<T>(k_row, c.kd.a, c.k0);
    fused::store_code<T>(k_row, c.kd.b, c.k1);
    fused::store_code<T>(v_row, 2 * j, c.v0);
    fused::store_code<T>(v_row, 2 * j + 1, c.v1);
  };
#pragma unroll 1
  for (int beam = 0; beam < T::kBeamWidth; ++beam) {
    if (beam_only >= 0 && beam != beam_only) continue;
    const int b = cta.batch + beam;
    const int len = T::kBeamWidth == 1 ? cta.seq_len : load_seq_len<T>(p, b);
    fused::append_tile<T>(p, b, len, cta.kv_head, range.begin, range.end, t0, T::kTile, tid, T::kThreads,
                          beam == 0 ? early : fused::no_early_pair(), write, store);
  }
}

}  // namespace deca::gqa
