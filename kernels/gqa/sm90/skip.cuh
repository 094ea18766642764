// Hopper (sm_90a) GQA decode with skip-softmax (Cfg::kSkip, 8 or 16 query rows on wgmma's N;
// docs/semantics.md "Skip-softmax") for fp8 and 16-bit (bf16 / fp16, Traits::k16) caches:
// decode.cuh's kernel with the order of its work changed so that a tile's V is issued only once
// the tile's logits are known.
//
// The decision unit is the ring's tile (fp8 128 tokens; 16-bit 64 at head_dim 128, 128 at 64, 32
// at 256), per query row: a row drops the tile when its largest logit m_t has m_t < m_ref +
// log2(f / L) (log2 units), m_ref being the largest logit of the tiles the row kept before; a
// tile no real row keeps is not loaded (V), transposed (fp8) nor multiplied.
//
// The QK of tile j + 1 (its S, masked, and its rows' maxima through the warps' `red`) runs in
// iteration j, ahead of tile j's softmax and PV, and its S stays in registers for the next
// iteration (N floats per thread): nothing is computed twice. K is loaded three tiles ahead (a
// ring of four K stages), V one tile ahead (two V stages): the six 16 KB stages of decode.cuh's
// three-stage ring. Iteration j:
//   wait<1>, barrier           V_j and K_{j+1} have landed
//   QK on K_{j+1} (async), V_j -> V^T in place under it (fp8, if tile j is kept; 16-bit V is
//                              read as stored, decode.cuh)
//   mask, maxima, barrier      rows' decisions for tile j + 1; __syncthreads_or: the CTA's vote
//   issue V_{j+1} (if voted), K_{j+3}; page ids of K_{j+4} and V_{j+2}
//   softmax of tile j (P of dropped rows 0), P to shared memory, barrier, PV
// The arithmetic of a kept tile is decode.cuh's instruction for instruction (its fp8 and its
// 16-bit branches alike), so a factor under which no tile falls gives decode.cuh's bits.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/cta.cuh"
#include "kernels/gqa/sm90/decode.cuh"
#include "kernels/gqa/sm90/q_tile.cuh"
#include "kernels/gqa/sm90/tile_loader.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {

// The ring: four K stages, then two V stages (byte offsets from the base) in the six stage slots
// of a three-stage plan.
struct SkipSlots {
  static __device__ __forceinline__ unsigned k(int item) { return (item % 4) * kStageBytes; }
  static __device__ __forceinline__ unsigned v(int item) { return (4 + item % 2) * kStageBytes; }
};

// A query row's threshold log2(f / L) (docs/semantics.md "Skip-softmax"): L the keys its causal
// window spans from position pos, with a tree mask plus the drafts after the row (which its mask
// may show). Both Hopper skip kernels (here and skip_rows.cuh).
template <class T>
__device__ __forceinline__ float skip_threshold(const GqaParams& p, int pos, int seq_len) {
  const int causal = pos + 1;
  int span = T::kWindow && p.window < causal ? p.window : causal;
  if constexpr (T::kTree) span += seq_len - causal;
  return __log2f(p.skip_softmax_factor) - __log2f(static_cast<float>(span > 1 ? span : 1));
}

// GqaParams::skip_counts: the V rows a CTA copied and those of its tiles, added once at its end.
struct SkipCounts {
  unsigned long long copied = 0ull, all = 0ull;
  template <int kTileT>
  __device__ __forceinline__ void add(const Unit& u, int item, bool copy) {
    const int t0 = u.first + item * kTileT;
    const int rows = u.end - t0 < kTileT ? u.end - t0 : kTileT;
    all += static_cast<unsigned>(rows);
    if (copy) copied += static_cast<unsigned>(rows);
  }
  __device__ __forceinline__ void flush(const GqaParams& p, int tid, int tiles) const {
    if (p.skip_counts != nullptr && tid == 0 && tiles > 0) {
      atomicAdd(p.skip_counts, copied);
      atomicAdd(p.skip_counts + 1, all);
    }
  }
};

template <class Cfg>
__device__ __forceinline__ void gqa_decode_skip_kernel(const GqaParams& p, unsigned char* smem_raw) {
  using T = Traits<Cfg>;
  static_assert(T::kStages == 3 && !T::kRowsOnM, "the skip ring takes a three-stage plan's six slots");
  constexpr int N = T::kRows;
  constexpr int kAcc = N / 2;
  constexpr SmemPlan kPlan = T::kPlan;
  using Mma = WgmmaE4m3<N>;
  constexpr int kHalves = T::kHeadDim / 64;  // O^T's m64 blocks of d (decode.cuh)
  constexpr int kTileT = T::kTile;
  // S^T's m64 halves of tokens; 16-bit d256's 32-token tile pads M (decode.cuh kPadWarps).
  constexpr int kSHalves = kTileT >= 64 ? kTileT / 64 : 1;
  constexpr bool kPadWarps = kTileT < 64;
  const int tid = threadIdx.x;
  const int w = tid >> 5;
  const int l = tid & 31;
  const int q_len = p.q_len;
  const int rows_total = q_len * T::kGroup;
  int* bad_item = checked_ring_items<T>();
  const CtaSmem cs(smem_raw);
  const unsigned base = cs.base;
  unsigned char* smem = cs.smem;
  float* red = reinterpret_cast<float*>(smem + kPlan.red);      // [4 warps][N]
  float* q_inv = reinterpret_cast<float*>(smem + kPlan.q_inv);  // [N]
  auto desc = [&](unsigned offset) { return cs.desc(offset); };

  SplitCta c;
  if (!split_cta<T>(p, N, c)) return;
  const Unit u = c.unit;
  const int row0 = c.row_block * N;
  const int n = u.tiles;
  auto cursor = [&](int i) { return TileCursor{u, i, n, i >= n}; };
  TileLoader<T> loader(p, bad_item, tid);    // K, page ids a tile ahead
  // V, its page ids read a tile before the issue (read at the issue, each kept tile's copies
  // waited a page-table round trip on the loop's critical path).
  TileLoader<T> v_loader(p, bad_item, tid);

  // Accumulator coordinates, V transpose and P placement: decode.cuh's.
  auto col_row = [&](int cc) { return 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1); };
  unsigned ldsm_off[4], stsm_off[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) ldsm_off[i] = 4096u * w + rows_on_m_ldsm_offset(l, i);
#pragma unroll
  for (int i = 0; i < 2; ++i) stsm_off[i] = rows_on_m_stsm_offset(l, 2 * w + i);
  const unsigned p_pos = 16 * (4 * ((l >> 2) & 1) + w) + 4 * (l >> 3);
  const unsigned p_sel = ((l >> 2) & 1) ? 0x3726u : 0x5140u;

  // m_ref's seed (16-bit): a split after the one that holds the CTA's first visible tile (the
  // tile of key max(0, p0 - W + 1), p0 the first row's position: no row of the CTA sees a key
  // before it) starts each row's m_ref at the row's largest logit in that tile rather than at
  // -inf. That split keeps the tile for the row (its first tile with a key the row sees, decided
  // against -inf), so the seed is one of the row's kept logits and the bound holds
  // (docs/semantics.md); every split then knows the request's early heavy keys (attention
  // sinks), which a long request's later splits otherwise miss. One more K tile per such CTA.
  // (fp8 keeps its loop as measured: kSeedRef off.)
  constexpr bool kSeedRef = T::k16;
  const int first_key = u.seq_len - q_len - p.window + 1;  // with a window: the first row's first key
  const int seed_t0 = (T::kWindow && first_key > 0 ? first_key : 0) / kTileT * kTileT;
  const bool seed = kSeedRef && n > 0 && seed_t0 < u.first;  // CTA-uniform
  const TileCursor seed_cursor{u, (seed_t0 - u.first) / kTileT, n, false};

  // ---- Prologue: K and V of tile 0, (the seed's K,) K of tiles 1 and 2 ----
  loader.fetch_pages(cursor(0), 0);
  if constexpr (kSeedRef) {
    if (seed) v_loader.fetch_pages(seed_cursor, 3);  // the seed's checked-mode slot: tile 3's
  }
  if (n > 0) loader.template issue_copies<true, true>(cursor(0), base + SkipSlots::k(0), base + SkipSlots::v(0));
  ptx::cp_async_commit();
  if constexpr (kSeedRef) {  // its own group (empty without a seed), into tile 3's K stage
    if (seed) v_loader.template issue_copies<true, false>(seed_cursor, base + SkipSlots::k(3), 0u);
    ptx::cp_async_commit();
  }
#pragma unroll
  for (int i = 1; i < 3; ++i) {
    loader.fetch_pages(cursor(i), i);
    if (i < n) loader.template issue_copies<true, false>(cursor(i), base + SkipSlots::k(i), 0u);
    ptx::cp_async_commit();
  }
  loader.fetch_pages(cursor(3), 3);
  v_loader.fetch_pages(cursor(1), 1);

  const int batch = u.request, kv_head = u.kv_head, seq_len = u.seq_len;
  const int* page_row = loader.page_row_of(batch);
  const float k_scale = p.k_scales ? p.k_scales[kv_head] : p.k_scale;
  const float v_scale = p.v_scales ? p.v_scales[kv_head] : p.v_scale;
  const float qk_scale = p.softmax_scale * k_scale;
  if constexpr (T::k16) {
    load_q_16bit<T, N>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, [](int m) { return m; });
  } else {
    load_q_two_term<T, N>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, base + kPlan.q_lo, q_inv,
                          [](int m) { return m; });
  }
  __syncthreads();  // q_inv written
  const float logit_scale = T::kSoftcap ? qk_scale : qk_scale * kLog2e;
  const int causal_start = seq_len - q_len;
  float row_scale[T::kCols], m_run[T::kCols], l_run[T::kCols];
  float thr[T::kCols], m_ref[T::kCols];  // log2(f / L) and the kept tiles' maximum, per column
  unsigned real = 0u;                    // bit cc: column cc is one of the CTA's rows
#pragma unroll
  for (int cc = 0; cc < T::kCols; ++cc) {
    const int row = row0 + col_row(cc);
    row_scale[cc] = T::k16 ? logit_scale : logit_scale * q_inv[col_row(cc)];
    m_run[cc] = kNegInf, l_run[cc] = 0.f, m_ref[cc] = kNegInf;
    thr[cc] = skip_threshold<T>(p, causal_start + (row < rows_total ? row : 0) / T::kGroup, seq_len);
    if (row < rows_total) real |= 1u << cc;
  }
  float o[kHalves][kAcc];
#pragma unroll
  for (int m = 0; m < kHalves; ++m) {
#pragma unroll
    for (int e = 0; e < kAcc; ++e) o[m][e] = 0.f;
  }
  SkipCounts counts;
  auto count = [&](int item, bool copied) { counts.add<kTileT>(u, item, copied); };

  // Tile `item`'s S (issued on its K stage before; waited for here), scaled, soft-capped and
  // masked (decode.cuh's block), and its rows' maxima across the warps into m_tile. `slot`: the
  // ring item whose checked-mode record the tile's page ids are in (the tile's own, but the
  // seed's: tile 3's).
  auto logits_and_maxima = [&](int item, int slot, float (&s)[kSHalves][kAcc], float (&m_tile)[T::kCols]) {
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < kSHalves; ++h) fence_regs(s[h]);
    const int tile_t0 = u.first + item * kTileT;
    const bool bad_tile = T::kChecked && bad_item[slot % (T::kStages + 1)] == slot;
    const bool need_mask = tile_needs_mask<T>(p, u, tile_t0, bad_tile, causal_start, seq_len);
    scale_mask_tile<T, kSHalves, kAcc, kPadWarps>(p, s, row_scale, u, tile_t0, need_mask, bad_tile, causal_start,
                                                  row0, rows_total, batch, page_row, w, l);
    float mx[T::kCols];
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) mx[cc] = kNegInf;
#pragma unroll
    for (int h = 0; h < kSHalves; ++h) {
#pragma unroll
      for (int e = 0; e < kAcc; ++e) mx[2 * (e >> 2) + (e & 1)] = fmaxf(mx[2 * (e >> 2) + (e & 1)], s[h][e]);
    }
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) {
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) mx[cc] = fmaxf(mx[cc], __shfl_xor_sync(0xffffffffu, mx[cc], m));
    }
    if (l < 4) {
#pragma unroll
      for (int cc = 0; cc < T::kCols; ++cc) red[w * N + col_row(cc)] = mx[cc];
    }
    __syncthreads();  // red complete (its next writer is the next tile's, after a barrier)
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) {
      const int r = col_row(cc);
      m_tile[cc] = fmaxf(fmaxf(red[r], red[N + r]), fmaxf(red[2 * N + r], red[3 * N + r]));
    }
  };
  // The rows' decisions on a tile's maxima (bit cc: column cc keeps it), m_ref brought up to date.
  auto decide = [&](const float (&m_tile)[T::kCols]) {
    unsigned keep = 0u;
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) {
      if (!(m_tile[cc] < m_ref[cc] + thr[cc])) {  // m_ref = -inf: kept
        keep |= 1u << cc;
        m_ref[cc] = fmaxf(m_ref[cc], m_tile[cc]);
      }
    }
    return keep;
  };

  // S^T of the K stage at k_off (decode.cuh's QK), issued, not waited for.
  auto issue_qk = [&](unsigned k_off, float (&s)[kSHalves][kAcc]) {
    if constexpr (T::k16) {
      qk_chain_16bit<T, N>(s, desc, k_off, kPlan.q_hi);
    } else {
      two_term_chain<Mma>(s, desc, k_off, kPlan.q_hi, kPlan.q_lo);
    }
  };

  // ---- The seed of m_ref (kSeedRef): the first visible tile's maxima, its K in tile 3's stage ----
  if constexpr (kSeedRef) {
    if (seed) {
      ptx::cp_async_wait<2>();  // tile 0's group and the seed's (K of tiles 1 and 2 may fly)
      fence_proxy_async_smem();
      __syncthreads();
      float s_seed[kSHalves][kAcc];
      issue_qk(SkipSlots::k(3), s_seed);
      logits_and_maxima(seed_cursor.i, 3, s_seed, m_ref);
    }
  }

  // ---- Tile 0's logits: its K waited for alone ----
  float s_cur[kSHalves][kAcc], m_cur[T::kCols];
  unsigned keep_cur = 0u;
  bool vote_cur = false;
  if (n > 0) {
    ptx::cp_async_wait<kSeedRef ? 3 : 2>();  // tile 0's group (kSeedRef: the seed's after it)
    fence_proxy_async_smem();
    __syncthreads();
    issue_qk(SkipSlots::k(0), s_cur);
    logits_and_maxima(0, 0, s_cur, m_cur);
    keep_cur = decide(m_cur);
    vote_cur = true;  // V of tile 0 is in flight whatever the decisions
    count(0, true);
  }

  for (int item = 0; item < n; ++item) {
    ptx::cp_async_wait<1>();
    fence_proxy_async_smem();  // this thread's landed chunks, to the wgmma (async proxy) readers
    __syncthreads();           // V of `item`, K of item + 1 landed; the last tile's stages are free
    const bool next = item + 1 < n;  // CTA-uniform
    const unsigned vs = base + SkipSlots::v(item);
    float s_next[kSHalves][kAcc], m_next[T::kCols];
    unsigned keep_next = 0u;
    bool vote_next = false;
    if (next) issue_qk(SkipSlots::k(item + 1), s_next);
    if constexpr (!T::k16) {
      if (vote_cur) transpose_v_in_place(vs, ldsm_off, stsm_off);
    }
    if (next) {
      logits_and_maxima(item + 1, item + 1, s_next, m_next);
      keep_next = decide(m_next);
      vote_next = __syncthreads_or((keep_next & real) != 0u) != 0;
      if (p.skip_counts != nullptr) count(item + 1, vote_next);
      if (vote_next) v_loader.template issue_copies<false, true>(cursor(item + 1), 0u, base + SkipSlots::v(item + 1));
    }
    ptx::cp_async_commit();
    if (item + 3 < n) loader.template issue_copies<true, false>(cursor(item + 3), base + SkipSlots::k(item + 3), 0u);
    ptx::cp_async_commit();
    loader.fetch_pages(cursor(item + 4), item + 4);
    v_loader.fetch_pages(cursor(item + 2), item + 2);

    // 16-bit: the softmax and the PV run for a dropped tile too, every row's P at 0 against the
    // tile's K stage in V's place (the request's keys or the loader's zeros: finite for a finite
    // cache; free until K of item + 4): its O, sums and maxima stay as they were. A PV under the
    // vote's branch made ptxas serialize every wgmma of the kernel (C7520: the warpgroup.arrive
    // it adds for O's registers, in a divergent path); 16-bit O accumulates in the tensor core,
    // so its registers are the wgmma's. fp8 branches (its PV writes a fresh accumulator).
    if (T::k16 || vote_cur) {
      // ---- decode.cuh's softmax per query row (column cc), a dropped row's P at 0 ----
      // fp8: O's rescale waits for the PV: o = fma(o, alpha, ot), one rounding, as ptxas contracts
      // decode.cuh's o *= alpha ... o += ot (one FFMA per element in its SASS); a multiply and an
      // add would round twice and give other bits than decode.cuh wherever a row's max moves.
      // 16-bit: O is rescaled in registers before the PV accumulates into it, as decode.cuh.
      const unsigned keep_rows = T::k16 && !vote_cur ? 0u : keep_cur;
      float alpha_col[T::kCols];
#pragma unroll
      for (int cc = 0; cc < T::kCols; ++cc) {
        const int r = col_row(cc);
        const bool kept = (keep_rows >> cc) & 1u;
        const float m_tile = kept ? m_cur[cc] : kNegInf;
        const float m_new = fmaxf(m_run[cc], m_tile);
        const float m_use = m_new == kNegInf ? 0.f : m_new;
        const float alpha = ptx::ex2(m_run[cc] - m_use);
        m_run[cc] = m_new;
        const float shift = m_use - 8.f;
        const int e0 = 4 * (cc >> 1) + (cc & 1);
        float pr[4] = {0.f, 0.f, 0.f, 0.f};
        if (kept) {
#pragma unroll
          for (int h = 0; h < kSHalves; ++h) {
            pr[2 * h] = ptx::ex2(s_cur[h][e0] - shift);
            pr[2 * h + 1] = ptx::ex2(s_cur[h][e0 + 2] - shift);
          }
        }
        l_run[cc] = __fmaf_rn(l_run[cc], alpha, (pr[0] + pr[1]) + (pr[2] + pr[3]));
        store_p_row<T>(base + kPlan.p_hi, base + kPlan.p_lo, r, pr, w, l, p_pos, p_sel);
        if constexpr (T::k16) {
#pragma unroll
          for (int m = 0; m < kHalves; ++m) o[m][e0] *= alpha, o[m][e0 + 2] *= alpha;
        } else {
          alpha_col[cc] = alpha;
        }
      }
      fence_proxy_async_smem();  // P and V^T, to the wgmma
      __syncthreads();
      if constexpr (T::k16) {
        // O rescaled before the wgmma fence (else the rescale sinks past it and ptxas adds an arrive).
#pragma unroll
        for (int m = 0; m < kHalves; ++m) fence_regs(o[m]);
        pv_chain_16bit<T, N>(o, desc, vote_cur ? SkipSlots::v(item) : SkipSlots::k(item), kPlan.p_hi);
        wgmma_wait<0>();
#pragma unroll
        for (int m = 0; m < kHalves; ++m) fence_regs(o[m]);
      } else {
        float ot[kHalves][kAcc];
        two_term_chain<Mma>(ot, desc, SkipSlots::v(item), kPlan.p_hi, kPlan.p_lo);
        wgmma_wait<0>();
#pragma unroll
        for (int m = 0; m < kHalves; ++m) {
          fence_regs(ot[m]);
#pragma unroll
          for (int e = 0; e < kAcc; ++e) o[m][e] = __fmaf_rn(o[m][e], alpha_col[2 * (e >> 2) + (e & 1)], ot[m][e]);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kSHalves; ++h) {
#pragma unroll
      for (int e = 0; e < kAcc; ++e) s_cur[h][e] = s_next[h][e];
    }
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) m_cur[cc] = m_next[cc];
    keep_cur = keep_next;
    vote_cur = vote_next;
  }
  counts.flush(p, tid, n);

  // ---- decode.cuh's epilogue: the rows into the merge area, the output, LSE or partials ----
  ptx::cp_async_wait<0>();
  finish_rows_on_n<T>(p, smem, red, l, w, m_run, l_run, o, c, row0, rows_total, batch, kv_head, v_scale);
}

}  // namespace deca::gqa::sm90
