// The portable GQA kernel's skip-softmax main loop (Cfg::kSkip; docs/semantics.md
// "Skip-softmax"), in place of decode.cuh's when the plan's skip_softmax_factor is > 0.
//
// The decision unit is a warp's slice of a tile (kWarpTokens keys) for each of its rows, tile by
// tile: a row drops the slice when the slice's largest logit m_t has m_t < m_ref + log2(f / L) in
// the kernel's log2 units, m_ref being the largest logit of the slices the row kept in the tiles
// before, by any warp of its row block (-inf before the first: a first slice is always kept).
// Shared by the warps, m_ref carries a few heavy keys in one warp's slice to the row's later
// slices in every warp; a warp's own slices alone would leave the other kWarpsN - 1 warps
// comparing the bulk against the bulk. A dropped slice's keys are masked for the row; a warp
// whose rows all drop the slice does no softmax and no PV for it; the V rows of a slice are
// copied only when some warp keeps the slice.
//
// V of a tile is therefore issued only after the tile's QK maxima are known: a max pass runs a
// tile ahead of the exact pass (QK, mask, row maxima, decisions; its S is not kept), and the
// exact pass computes QK again for the slices kept. The K loads stay pipelined three tiles ahead
// (a ring of four K stages), V one tile ahead (two V stages): the same six stages of shared
// memory as the exact kernel's three K + V stages. Iteration j, with one commit group for V then
// one for K so that wait<1> leaves only the newest K in flight:
//   wait<1>, barrier          V_j and K_{j+1} have landed; stages of iteration j - 1 are free
//   m_ref from every warp's kept maxima of tile j (kept_max, written a tile before)
//   max pass on K_{j+1}       decisions for tile j + 1, each warp's vote and kept maxima to
//                             shared memory
//   barrier                   votes visible
//   issue V_{j+1} (kept slices), K_{j+3}; page ids of K_{j+4} and V_{j+2} (beams: V_{j+1}'s
//                             at its issue)
//   exact pass on tile j      QK, mask, the rows' decisions, online softmax, PV
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/kv_loader.cuh"
#include "kernels/gqa/sm80/pv.cuh"
#include "kernels/gqa/sm80/q_operand.cuh"
#include "kernels/gqa/sm80/qk.cuh"
#include "kernels/gqa/sm80/softmax.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// The skip loop's ring: four K stages, then two V stages, in the exact kernel's six stage slots.
template <class T>
struct SkipRing {
  static constexpr int kKStages = 4;
  static constexpr int kVStages = 2;
  static_assert(T::kStages == 3, "the skip ring takes the six stage slots of a three-stage shape");
  static __device__ __forceinline__ unsigned k_stage(unsigned base, int item) {
    return base + (item % kKStages) * T::kStageBytes;
  }
  static __device__ __forceinline__ unsigned v_stage(unsigned base, int item) {
    return base + (kKStages + item % kVStages) * T::kStageBytes;
  }
};

// Everything the skip loop reads from the kernel: its CTA, keys, q and row facts, and the
// softmax state it brings up to date. References to the kernel's own objects.
template <class T, int kOTiles>
struct SkipLoop {
  const GqaParams& p;
  const CtaCoords<T>& cta;
  const KeyRange& range;
  const WorkItems<T>& items;
  int* bad_item;
  const Lane& ln;
  unsigned smem_base;
  const QOperand<T>& q;
  const RowFacts& rows;
  float (&m_run)[2];
  float (&l_run)[2];
  float (&o_acc)[kOTiles][4];
};

// S of chunk `ch` of the warp's slice of work item `item`, whose K tile is at `ks`: QK, scaled to
// log2 units, the keys a row must not see at -inf (the exact kernel's loop body, decode.cuh).
// False when the chunk starts past the CTA's keys (warp-uniform).
template <class T, int kOTiles, int kN8>
__device__ __forceinline__ bool skip_chunk_logits(const SkipLoop<T, kOTiles>& s, int item, unsigned ks, int ch,
                                                  float (&s_acc)[kN8][4]) {
  constexpr int kBeams = T::kBeamWidth;
  const GqaParams& p = s.p;
  const int tile_t0 = s.range.begin + s.items.tile(item) * T::kTile;
  const int local0 = s.ln.warp_n * T::kWarpTokens + ch * T::kChunk;
  const int t0 = tile_t0 + local0;
  if (t0 >= s.range.end) return false;
  const int beam_only = kBeams == 1 ? -1 : s.items.beam(item);
  bool bad_tile = false;
  if constexpr (T::kChecked) bad_tile = s.bad_item[item % T::kBadItemSlots] == item;
  const int* page_rows = p.page_table + s.cta.batch * p.page_table_stride;
  auto page_ok = [&](int t) {
    const int* row = page_rows + (beam_only > 0 ? beam_only * p.page_table_stride : 0);
    return static_cast<unsigned>(__ldg(row + t / T::kPageSize)) < static_cast<unsigned>(p.num_pages);
  };
  int s_hi[2][4], s_lo[2][4];
  unsigned qh[4], ql[4];
  QkScratch qk_scratch{s_hi, s_lo, qh, ql};
  qk_chunk<T>(s.q, ks, local0, s.ln, s_acc, qk_scratch);
  const bool need_mask = (kBeams > 1 && beam_only >= 0) || (t0 + T::kChunk > s.rows.causal_start) ||
                         (T::kWindow && t0 < s.cta.seq_len - p.window) || (T::kChecked && bad_tile);
  scale_and_mask<T>(p, s.rows, s.range.end, beam_only, bad_tile, page_ok, need_mask, t0, s.ln.c, s_acc);
  return true;
}

// f(ch, s_acc) for each chunk of the warp's slice of item `item` (its K tile in the ring) that
// starts before the CTA's end, s_acc holding the chunk's logits (skip_chunk_logits).
template <class T, int kOTiles, class F>
__device__ __forceinline__ void for_each_chunk(const SkipLoop<T, kOTiles>& s, int item, const F& f) {
  const unsigned ks = SkipRing<T>::k_stage(s.smem_base, item);
#pragma unroll 1
  for (int ch = 0; ch < T::kWarpTokens / T::kChunk; ++ch) {
    float s_acc[T::kChunk / 8][4];
    if (!skip_chunk_logits<T>(s, item, ks, ch, s_acc)) break;
    f(ch, s_acc);
  }
}

// The max pass over item `item`'s K tile: per row, the largest logit of the warp's slice, then
// the decision against m_ref (updated with the slice's max when kept). Returns the rows' keep
// bits (bit h: row h keeps the slice); the slice's maxima of the rows that keep it go to
// `kept_max` ([warp][16 rows of its warp_m], -inf for a dropped row) for the other warps.
template <class T, int kOTiles>
__device__ __forceinline__ unsigned skip_decide(const SkipLoop<T, kOTiles>& s, int item, const float (&thr)[2],
                                                float (&m_ref)[2], float* kept_max) {
  float mx[2] = {kNegInf, kNegInf};
  for_each_chunk<T>(s, item, [&](int, auto& s_acc) {
    constexpr int kN8 = T::kChunk / 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < kN8; ++j) mx[h] = fmaxf(mx[h], fmaxf(s_acc[j][2 * h], s_acc[j][2 * h + 1]));
    }
  });
  unsigned keep = 0u;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    // m_ref = -inf: the right side is -inf and the slice is kept.
    const bool kept = !(mx[h] < m_ref[h] + thr[h]);
    if (kept) {
      keep |= 1u << h;
      m_ref[h] = fmaxf(m_ref[h], mx[h]);
    }
    if (s.ln.c == 0) kept_max[s.ln.warp * 16 + s.ln.g + 8 * h] = kept ? mx[h] : kNegInf;
  }
  return keep;
}

// m_ref brought up to the maxima the row block's warps kept in one tile (skip_decide's
// kept_max, visible after a barrier).
template <class T>
__device__ __forceinline__ void merge_kept_max(const Lane& ln, const float* kept_max, float (&m_ref)[2]) {
#pragma unroll
  for (int w = 0; w < T::kWarpsN; ++w) {
    const float* row = kept_max + (ln.warp_m * T::kWarpsN + w) * 16 + ln.g;
#pragma unroll
    for (int h = 0; h < 2; ++h) m_ref[h] = fmaxf(m_ref[h], row[8 * h]);
  }
}

// The exact pass over item `item` for the rows that keep it (`keep`, skip_decide's bits): the
// decode.cuh loop body with a dropped row's logits at -inf.
template <class T, int kOTiles>
__device__ __forceinline__ void skip_exact_pass(const SkipLoop<T, kOTiles>& s, int item, unsigned keep) {
  const unsigned vs = SkipRing<T>::v_stage(s.smem_base, item);
  for_each_chunk<T>(s, item, [&](int ch, auto& s_acc) {
    constexpr int kN8 = T::kChunk / 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!((keep >> h) & 1u)) {
#pragma unroll
        for (int j = 0; j < kN8; ++j) s_acc[j][2 * h] = s_acc[j][2 * h + 1] = kNegInf;
      }
    }
    float alpha[2];
    online_softmax<T>(s_acc, s.m_run, s.l_run, s.o_acc, alpha);
    pv_chunk<T>(s_acc, vs, s.ln.warp_n * T::kWarpTokens + ch * T::kChunk, s.ln.lane, s.o_acc);
  });
}

// Whether the thread's row h is one of the CTA's (a padding row's decisions do not count).
template <class T>
__device__ __forceinline__ bool skip_row_real(const CtaCoords<T>& cta, const Lane& ln, int h) {
  return cta.row0 + ln.warp_m * 16 + ln.g + h * 8 < cta.rows_total;
}

// GqaParams::skip_counts: the V rows (keys before the CTA's end) of item `item`'s slices that
// `slices` sets into v_rows[0], of all its slices into v_rows[1].
template <class T, int kOTiles>
__device__ __forceinline__ void count_v_rows(const SkipLoop<T, kOTiles>& s, int item, unsigned slices,
                                             unsigned long long (&v_rows)[2]) {
  const int t0 = s.range.begin + s.items.tile(item) * T::kTile;
#pragma unroll
  for (int w = 0; w < T::kWarpsN; ++w) {
    const int a = t0 + w * T::kWarpTokens;
    const int rows = s.range.end - a < T::kWarpTokens ? s.range.end - a : T::kWarpTokens;
    if (rows <= 0) continue;
    v_rows[1] += static_cast<unsigned>(rows);
    if ((slices >> w) & 1u) v_rows[0] += static_cast<unsigned>(rows);
  }
}

// The skip-softmax main loop: from the first loads to the last tile's PV (the kernel's epilogue
// follows). `pages_next`: the kernel's page-id array for the K loader.
template <class T, int kOTiles>
__device__ __forceinline__ void skip_main_loop(const SkipLoop<T, kOTiles>& s, int (&pages_next)[T::kLoadsPerThread]) {
  using Ring = SkipRing<T>;
  const GqaParams& p = s.p;
  const int n = s.items.num_items;
  __shared__ int votes[T::kThreads / 32];  // per warp: some real row keeps the slice
  // skip_decide's kept maxima, by the parity of the tile decided: tile j's are written in
  // iteration j - 1 and read after iteration j's first barrier, while tile j + 1's are written.
  __shared__ float kept_max[2][T::kThreads / 32 * 16];

  // f / L per row in log2 units; L = the keys the row's causal window spans, plus with a tree
  // mask the drafts after the row's own (its mask bits may show them).
  float thr[2], m_ref[2] = {kNegInf, kNegInf};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int causal = s.rows.pos[h] + 1;
    int span = T::kWindow && p.window < causal ? p.window : causal;
    if constexpr (T::kTree) span += s.rows.len[h] - causal;
    thr[h] = __log2f(p.skip_softmax_factor) - __log2f(static_cast<float>(span > 1 ? span : 1));
  }
  const bool real0 = skip_row_real<T>(s.cta, s.ln, 0), real1 = skip_row_real<T>(s.cta, s.ln, 1);

  unsigned long long v_rows[2] = {0ull, 0ull};  // GqaParams::skip_counts: copied, of all
  KvLoader<T> loader(p, s.cta, s.range, s.items, s.bad_item, s.ln, s.smem_base, pages_next);
  // V's page ids are read a tile before their issue: read at the issue, each kept tile's copies
  // waited a page-table round trip on the loop's critical path. Beam plans still read them at
  // the issue: their ids held across the iteration (with the beam's length) spill on sm_89's
  // two-term path at 32 rows.
  constexpr bool kPrefetchV = T::kBeamWidth == 1;
  int pages_v[T::kLoadsPerThread];
  KvLoader<T> v_loader(p, s.cta, s.range, s.items, s.bad_item, s.ln, s.smem_base, pages_v);

  // Prologue: K and V of item 0 (a first slice is always kept), K of items 1 and 2.
  loader.fetch_pages(0);
  if (n > 0) loader.template issue_copies<true, true>(0, Ring::k_stage(s.smem_base, 0), Ring::v_stage(s.smem_base, 0), 0u);
  ptx::cp_async_commit();
#pragma unroll
  for (int i = 1; i < 3; ++i) {
    loader.fetch_pages(i);
    if (i < n) loader.template issue_copies<true, false>(i, Ring::k_stage(s.smem_base, i), 0u, 0u);
    ptx::cp_async_commit();
  }
  loader.fetch_pages(3);
  if constexpr (kPrefetchV) v_loader.fetch_pages(1);
  ptx::cp_async_wait<2>();
  __syncthreads();
  // keep: bit h = row h keeps the current item's slice, bit 2 + h the next item's.
  unsigned keep = n > 0 ? skip_decide<T>(s, 0, thr, m_ref, kept_max[0]) : 0u;

  for (int item = 0; item < n; ++item) {
    ptx::cp_async_wait<1>();
    __syncthreads();  // V of `item`, K of item + 1 landed; the stages of item - 1 are free
    const bool next = item + 1 < n;  // CTA-uniform
    if constexpr (T::kWarpsN > 1) merge_kept_max<T>(s.ln, kept_max[item & 1], m_ref);
    if (next) {
      const unsigned k_next = skip_decide<T>(s, item + 1, thr, m_ref, kept_max[(item + 1) & 1]);
      keep |= k_next << 2;
      const bool vote = __any_sync(0xffffffffu, ((k_next & 1u) && real0) || ((k_next & 2u) && real1));
      if (s.ln.lane == 0) votes[s.ln.warp] = vote;
    }
    __syncthreads();  // votes visible
    if (next) {
      unsigned slices = 0u;
#pragma unroll
      for (int w = 0; w < T::kThreads / 32; ++w) slices |= (votes[w] ? 1u : 0u) << (w % T::kWarpsN);
      if (p.skip_counts != nullptr) count_v_rows<T>(s, item + 1, slices, v_rows);
      if (slices != 0u) {
        if constexpr (!kPrefetchV) v_loader.fetch_pages(item + 1);
        v_loader.template issue_copies<false, true>(item + 1, 0u, Ring::v_stage(s.smem_base, item + 1), slices);
      }
    }
    ptx::cp_async_commit();
    if (item + 3 < n) loader.template issue_copies<true, false>(item + 3, Ring::k_stage(s.smem_base, item + 3), 0u, 0u);
    ptx::cp_async_commit();
    loader.fetch_pages(item + 4);
    if constexpr (kPrefetchV) v_loader.fetch_pages(item + 2);

    const bool warp_keeps = __any_sync(0xffffffffu, ((keep & 1u) && real0) || ((keep & 2u) && real1));
    if (warp_keeps) skip_exact_pass<T>(s, item, keep & 3u);
    keep >>= 2;
  }
  if (p.skip_counts != nullptr && s.ln.tid == 0 && n > 0) {
    count_v_rows<T>(s, 0, ~0u, v_rows);  // item 0's V, copied whole in the prologue
    atomicAdd(p.skip_counts, v_rows[0]);
    atomicAdd(p.skip_counts + 1, v_rows[1]);
  }
}

}  // namespace deca::gqa
