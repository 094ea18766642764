// Hopper (sm_90a) GQA decode with skip-softmax (Cfg::kSkip) for 32 or 64 query rows on wgmma's M
// (Cfg::kRowsOnM: speculative decoding; docs/semantics.md "Skip-softmax"), fp8 and 16-bit caches:
// decode_rows.cuh's kernel with its work reordered so that a tile's V is issued only once the
// tile's logits are known.
//
// The decision unit is the ring's tile (fp8 128 tokens; 16-bit 64 at head_dim 128, 128 at 64, 32
// at 256), per query row: a row drops the tile when its largest logit m_t has m_t < m_ref +
// log2(f / L) (log2 units), m_ref being the largest logit of the tiles the row kept before; a
// tile no real row keeps is not loaded (V) nor transposed (fp8). A row lives in one quad of
// lanes, so its decision needs no cross-warp maximum; the CTA's vote is one __syncthreads_or.
//
// The ring: the two-stage plan's four 16 KB slots, stage i % 2 holding tile i's K and V as in
// decode_rows.cuh, but K issued a tile ahead of V. Iteration j:
//   wait<0>, barrier        K_{j+1} and V_j landed; K_j's and V_{j-1}'s slots and V^T are free
//   issue K_{j+2}; page ids of K_{j+3}
//   QK on K_{j+1} (async); fp8: V_j -> V^T under it (if tile j was voted)
//   mask, the rows' maxima and decisions on tile j + 1; __syncthreads_or: the CTA's vote (fp8:
//                           also V^T complete)
//   issue V_{j+1} (if voted); page ids of V_{j+2}
//   softmax of tile j + 1: m, l, alpha and P_{j+1} into the A fragments (a dropped row's P 0)
//   PV of tile j with P_j (the last iteration's), O rescaled by alpha_j
// What crosses the iteration is P (fp8 32 registers, 16-bit 16 at head_dim 128) and alpha, not
// S (64 / 32): tile j + 1's softmax moves ahead of tile j's PV, which changes no arithmetic (O
// still takes alpha_j, then P_j V_j, then alpha_{j+1}; l and m in tile order). fp8 at 64 rows
// (kPvFirst) cannot hold two tiles' P beside O and the PV's accumulator: there tile j's V^T and
// PV come first (after the top barrier, a barrier between them), then tile j + 1's QK, decisions,
// vote and softmax (docs/perf-notes.md "Skip-softmax on the rows-on-M kernel": the registers).
//
// A kept tile runs decode_rows.cuh's arithmetic for it in its order (its QK, transpose, mask,
// P, 16-bit PV and epilogue functions; the fp8 PV in two halves of d, below, the same k-chain
// per element), so a factor under which no tile falls gives
// decode_rows.cuh's bits (GqaSkipGpu's tiny-factor check).
//
// A tile the CTA drops still runs its PV, every row's P at 0, against K_{j+1}'s slot in V's place
// (landed, finite for a finite cache, not rewritten before K_{j+3}): O, the sums and maxima stay
// as they were. Under the vote's branch the PV's wgmma (the 16-bit one accumulates into O's
// registers) would be serialized by ptxas (C7518 / C7520, docs/perf-notes.md "Skip-softmax").
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/cta.cuh"
#include "kernels/gqa/sm90/decode_rows.cuh"
#include "kernels/gqa/sm90/q_tile.cuh"
#include "kernels/gqa/sm90/skip.cuh"
#include "kernels/gqa/sm90/tile_loader.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {

// The fp8 PV: O = O alpha + (P_hi + P_lo) V^T (V^T, or any finite 16 KB tile when P is 0, at
// byte offset b_off), the tile's product in a fresh accumulator added in fp32 (Hopper's fp8 wgmma
// keeps ~14 bits when it accumulates: decode.cuh), as decode_rows.cuh, but in two halves of d
// (m64n64k32, V^T rows 64 nh ..): a 32-register accumulator instead of 64, which with tile j + 1's
// P held (this kernel's order) keeps 64 rows within 255 registers. Each O element is the same
// k-chain of products whatever N, so the halves give the m64n128k32 chain's bits (the GPU test's
// tiny-factor check).
template <int kHalves, class Desc>
__device__ __forceinline__ void rows_on_m_pv_e4m3_halves(float (&o)[64], const unsigned (&p_hi)[4][4],
                                                         const unsigned (&p_lo)[4][4], const float (&alpha)[kHalves],
                                                         const Desc& desc, unsigned b_off) {
#pragma unroll
  for (int nh = 0; nh < 2; ++nh) {
    float ot[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long db = desc(b_off + 8192u * nh + 32 * kk);
      wgmma_m64n64k32_e4m3_rs(ot, p_hi[kk], db, kk > 0);
      wgmma_m64n64k32_e4m3_rs(ot, p_lo[kk], db, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(ot);
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int h = (e >> 1) & 1;
      if (h < kHalves) o[32 * nh + e] = o[32 * nh + e] * alpha[h] + ot[e];
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void gqa_decode_skip_rows_kernel(const GqaParams& p, unsigned char* smem_raw) {
  using T = Traits<Cfg>;
  static_assert(T::kRowsOnM && T::kStages == 2 && !T::kFused,
                "the skip ring takes a two-stage plan's four slots; no fused step");
  constexpr int N = T::kRows;               // query rows of the CTA: 32 or 64
  constexpr int kHalves = N == 64 ? 2 : 1;  // a thread's rows: l / 4 and, at 64, l / 4 + 8
  constexpr SmemPlan kPlan = T::kPlan;
  constexpr int kTileT = T::kTile;
  constexpr int kS = kTileT / 2;                     // S accumulators per thread
  constexpr int kO = T::k16 ? T::kHeadDim / 2 : 64;  // O accumulators per thread
  constexpr int kTerms = T::k16 ? 1 : 2;             // P's terms (fp8: hi and lo)
  constexpr int kSteps = T::k16 ? kS / 8 : 4;        // P's k steps (k16, fp8 k32)
  // The order of tile j's PV and tile j + 1's softmax (the header): fp8 at 64 rows runs the PV
  // first, so that no P of two tiles is held at once (ptxas: 255 registers and spills otherwise).
  constexpr bool kPvFirst = !T::k16 && N == 64;
  const int tid = threadIdx.x;
  const int w = tid >> 5;
  const int l = tid & 31;
  const int q_len = p.q_len;
  const int rows_total = q_len * T::kGroup;
  int* bad_item = checked_ring_items<T>();
  const CtaSmem cs(smem_raw);
  const unsigned base = cs.base;
  unsigned char* smem = cs.smem;
  float* q_inv = reinterpret_cast<float*>(smem + kPlan.q_inv);  // [64 operand rows]
  auto desc = [&](unsigned offset) { return cs.desc(offset); };
  const unsigned long long desc16_v0 = T::k16 ? smem_desc_sw128(cs.base, 128u * kTileT, 1024) : 0ull;
  auto desc16_v = [&](unsigned offset) { return desc_advance(desc16_v0, offset); };

  SplitCta c;
  if (!split_cta<T>(p, N, c)) return;
  const Unit u = c.unit;
  const int row0 = c.row_block * N;
  const int n = u.tiles;
  auto cursor = [&](int i) { return TileCursor{u, i, n, i >= n}; };
  auto k_slot = [](int i) { return static_cast<unsigned>((i & 1) * 2 * kStageBytes); };
  auto v_slot = [](int i) { return static_cast<unsigned>((i & 1) * 2 * kStageBytes + kStageBytes); };
  TileLoader<T> loader(p, bad_item, tid);    // K, page ids a tile ahead of the issue
  TileLoader<T> v_loader(p, bad_item, tid);  // V, likewise

  // ---- Prologue: K and V of tile 0 (kept whatever the decisions), K of tile 1 ----
  loader.fetch_pages(cursor(0), 0);
  if (n > 0) loader.template issue_copies<true, true>(cursor(0), base + k_slot(0), base + v_slot(0));
  ptx::cp_async_commit();
  loader.fetch_pages(cursor(1), 1);
  if (n > 1) loader.template issue_copies<true, false>(cursor(1), base + k_slot(1), 0u);
  ptx::cp_async_commit();
  loader.fetch_pages(cursor(2), 2);
  v_loader.fetch_pages(cursor(1), 1);

  // ---- q and the rows (decode_rows.cuh's): operand row 16 w + l / 4 + 8 h ----
  auto row_of_operand = [](int m) { return N == 64 ? m : ((m & 8) ? -1 : 8 * (m >> 4) + (m & 7)); };
  int qrow[kHalves];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) qrow[h] = row_of_operand(16 * w + (l >> 2) + 8 * h);
  const int batch = u.request, kv_head = u.kv_head, seq_len = u.seq_len;
  const int* page_row = loader.page_row_of(batch);
  const float k_scale = p.k_scales ? p.k_scales[kv_head] : p.k_scale;
  const float v_scale = p.v_scales ? p.v_scales[kv_head] : p.v_scale;
  const float qk_scale_signed = p.softmax_scale * k_scale;  // its sign into q, as decode_rows.cuh
  const float qk_scale = fmaxf(fabsf(qk_scale_signed), 1e-30f);
  if constexpr (T::k16) {
    load_q_16bit<T, kRowsOnMOperandRows>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, row_of_operand,
                                         qk_scale_signed < 0.f);
  } else {
    load_q_two_term<T, kRowsOnMOperandRows>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi,
                                            base + kPlan.q_lo, q_inv, row_of_operand, qk_scale_signed < 0.f);
  }
  __syncthreads();  // q_inv written
  const float logit_scale = T::kSoftcap ? qk_scale : qk_scale * kLog2e;
  const int causal_start = seq_len - q_len;
  float row_scale[kHalves], m_run[kHalves], l_run[kHalves];
  float thr[kHalves], m_ref[kHalves];  // log2(f / L) and the kept tiles' maximum, per row
  const unsigned* tree[kHalves];
  int row_pos[kHalves];
  unsigned real = 0u;  // bit h: row h is one of the CTA's query rows
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    row_scale[h] = T::k16 ? logit_scale : logit_scale * q_inv[16 * w + (l >> 2) + 8 * h];
    m_run[h] = kNegInf, l_run[h] = 0.f, m_ref[h] = kNegInf;
    const int row = row0 + qrow[h];
    const int tok = (row < rows_total ? row : 0) / T::kGroup;
    row_pos[h] = causal_start + tok;
    tree[h] = T::kTree ? p.tree_mask + batch * p.mask_stride_batch + tok * p.mask_stride_token : nullptr;
    thr[h] = skip_threshold<T>(p, row_pos[h], seq_len);
    if (qrow[h] >= 0 && row < rows_total) real |= 1u << h;
  }
  auto logit = [&](float x, int h) {  // decode_rows.cuh's: log2 units, -inf stays -inf
    if constexpr (T::kSoftcap) {
      return x == kNegInf ? kNegInf : p.softcap * tanhf(x * row_scale[h] / p.softcap) * kLog2e;
    } else {
      return x * row_scale[h];
    }
  };
  float o[kO];
#pragma unroll
  for (int e = 0; e < kO; ++e) o[e] = 0.f;
  const unsigned vt = base + kPlan.vt;
  unsigned ldsm_off[4], stsm_off[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) ldsm_off[i] = 4096u * w + rows_on_m_ldsm_offset(l, i);
#pragma unroll
  for (int i = 0; i < 2; ++i) stsm_off[i] = rows_on_m_stsm_offset(l, 2 * w + i);
  SkipCounts counts;  // GqaParams::skip_counts
  auto count = [&](int item, bool copied) { counts.add<kTileT>(u, item, copied); };

  // Tile `item`'s S (issued; waited for here), masked, and the rows' decisions (bit h: row h
  // keeps it), m_ref brought up to date; m_t: the rows' largest logits of the tile.
  auto decide = [&](int item, float (&s)[kS], float (&m_t)[kHalves]) {
    wgmma_wait<0>();
    fence_regs(s);
    const bool bad_tile = T::kChecked && bad_item[item % (T::kStages + 1)] == item;
    float mx[kHalves];
    rows_on_m_mask_max<T, kHalves>(s, mx, p, u, u.first + item * kTileT, bad_tile, row_pos, tree, page_row, l);
    unsigned keep = 0u;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      m_t[h] = logit(mx[h], h);
      if (!(m_t[h] < m_ref[h] + thr[h])) {  // m_ref = -inf: kept
        keep |= 1u << h;
        m_ref[h] = fmaxf(m_ref[h], m_t[h]);
      }
    }
    return keep;
  };
  // A tile's softmax (decode_rows.cuh's for a kept row): m_run, l_run, alpha, and P into the A
  // fragments; a dropped row keeps its maximum (alpha 1) and its P is 0 (shift +inf).
  auto softmax = [&](const float (&s)[kS], unsigned keep, const float (&m_t)[kHalves],
                     unsigned (&pa)[kTerms][kSteps][4], float (&alpha)[kHalves]) {
    float shift[kHalves], sum[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const bool kept = (keep >> h) & 1u;
      const float m_new = kept ? fmaxf(m_run[h], m_t[h]) : m_run[h];
      const float m_use = m_new == kNegInf ? 0.f : m_new;
      alpha[h] = ptx::ex2(m_run[h] - m_use);
      m_run[h] = m_new;
      shift[h] = kept ? m_use - 8.f : -kNegInf;  // P times 256 (decode_rows.cuh)
    }
    if constexpr (T::k16) {
      rows_on_m_p_16bit<T, kHalves>(s, shift, row_scale, logit, pa[0], sum);
    } else {
      rows_on_m_p_e4m3<T, kHalves>(s, shift, row_scale, logit, pa[0], pa[1], sum);
    }
#pragma unroll
    for (int h = 0; h < kHalves; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];
  };

  // ---- Tile 0: its K waited for alone, its softmax ----
  unsigned pa[kTerms][kSteps][4];
  float alpha_cur[kHalves];
  bool vote_cur = false;
  if (n > 0) {
    ptx::cp_async_wait<1>();
    fence_proxy_async_smem();
    __syncthreads();
    float s[kS], m_t[kHalves];
    rows_on_m_qk<T>(s, desc, k_slot(0));
    const unsigned keep = decide(0, s, m_t);
    softmax(s, keep, m_t, pa, alpha_cur);
    vote_cur = true;  // V of tile 0 is in flight whatever the decisions
    count(0, true);
  }

  // PV of tile `item` with P_item and alpha_item (pa, alpha_cur); a tile the CTA dropped (P 0)
  // against K of item + 1's slot.
  auto pv = [&](int item) {
    if constexpr (T::k16) {
      rows_on_m_pv_16bit_mma<T, kHalves>(o, pa[0], alpha_cur, desc16_v, vote_cur ? v_slot(item) : k_slot(item + 1));
    } else {
      rows_on_m_pv_e4m3_halves<kHalves>(o, pa[0], pa[1], alpha_cur, desc, vote_cur ? kPlan.vt : k_slot(item + 1));
    }
  };
  for (int item = 0; item < n; ++item) {
    ptx::cp_async_wait<0>();
    fence_proxy_async_smem();  // this thread's landed chunks, to the wgmma (async proxy) readers
    __syncthreads();           // K of item + 1, V of item landed; the last tile's slots and V^T free
    const bool next = item + 1 < n;  // CTA-uniform
    if (item + 2 < n) loader.template issue_copies<true, false>(cursor(item + 2), base + k_slot(item + 2), 0u);
    ptx::cp_async_commit();
    loader.fetch_pages(cursor(item + 3), item + 3);
    if constexpr (kPvFirst) {  // fp8 64 rows: V^T, then the PV of `item` before tile item + 1's QK
      if (vote_cur) rows_on_m_transpose_v(base + v_slot(item), vt, ldsm_off, stsm_off);
      fence_proxy_async_smem();  // this thread's V^T words, to the wgmma
      __syncthreads();           // V^T complete
      pv(item);
    }
    float s[kS];
    if (next) rows_on_m_qk<T>(s, desc, k_slot(item + 1));
    if constexpr (!T::k16 && !kPvFirst) {
      if (vote_cur) rows_on_m_transpose_v(base + v_slot(item), vt, ldsm_off, stsm_off);  // under the QK
      fence_proxy_async_smem();  // this thread's V^T words, to the wgmma (after the next barrier)
    }
    // Tile item + 1's P and alpha: into pa / alpha_cur where the PV of `item` is done, else held
    // beside them until it is.
    unsigned pn[kTerms][kSteps][4];
    float alpha_next[kHalves];
    bool vote_next = false;
    if (next) {
      float m_t[kHalves];
      const unsigned keep = decide(item + 1, s, m_t);
      vote_next = __syncthreads_or((keep & real) != 0u) != 0;  // fp8 (PV last): V^T complete too
      if (p.skip_counts != nullptr) count(item + 1, vote_next);
      if (vote_next) v_loader.template issue_copies<false, true>(cursor(item + 1), 0u, base + v_slot(item + 1));
      ptx::cp_async_commit();
      v_loader.fetch_pages(cursor(item + 2), item + 2);
      if constexpr (kPvFirst) {
        softmax(s, keep, m_t, pa, alpha_cur);
      } else {
        softmax(s, keep, m_t, pn, alpha_next);
      }
    } else if constexpr (!T::k16 && !kPvFirst) {
      __syncthreads();  // V^T complete
    }
    if constexpr (!kPvFirst) {
      pv(item);
#pragma unroll
      for (int t = 0; t < kTerms; ++t) {
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
          for (int j = 0; j < 4; ++j) pa[t][kk][j] = pn[t][kk][j];
        }
      }
#pragma unroll
      for (int h = 0; h < kHalves; ++h) alpha_cur[h] = alpha_next[h];
    }
    vote_cur = vote_next;
  }
  counts.flush(p, tid, n);

  // ---- decode_rows.cuh's epilogue ----
  const CtaRows cta{batch, batch, kv_head, c.row_blocks, c.row_block, c.split, row0, rows_total, rows_total};
  rows_on_m_finish<T, kHalves>(p, smem, o, m_run, l_run, qrow, l, cta, v_scale);
}

}  // namespace deca::gqa::sm90
