// Hopper (sm_90a) GQA decode for an fp8 KV cache with many query rows per KV head (speculative
// decoding: q_len x group = 32 or 64), query rows on wgmma's M (docs/design-gqa-sm90.md, "Rows
// on M"; docs/perf-notes.md).
// One CTA = one warpgroup = (request, kv head, block of 32 or 64 rows, split of the keys), the
// tokens-on-M kernel's (decode.cuh) grid, loader, q and epilogue. Per 128-token tile:
//
//   S [64 rows x 128 tokens] = (q_hi + q_lo) . K^T      rows on M, tokens on N
//   online softmax along each row: a thread's two rows, a quad of lanes per row (no barrier)
//   O [64 rows x 128 d]     += (P_hi + P_lo) . V         P from registers (the RS wgmma)
//
// Why: with the rows on N (decode.cuh) every query row is a column spread over the four warps,
// so at 32 / 64 rows each thread runs 8 / 16 column softmaxes per tile with a cross-warp maximum
// and stores P to shared memory for the PV wgmma; here a row lives in one quad, P goes from the
// S accumulators to the A fragments in registers, and a tile needs two barriers instead of four.
// The price at 32 rows: M is 64, so half of every wgmma's rows are padding (the tensor cores are
// ~4x below the memory rate there); the softmax skips them.
//
// Token order: K and V stay in token order; the V transpose (ldmatrix.trans + prmt + stmatrix,
// layout.cuh) writes V^T with its tokens in the order of the A fragments a lane packs from its S
// accumulators, and its rows in a d order that keeps every stmatrix block on eight consecutive
// rows; the epilogue maps O's columns back.
//
// 16-bit caches (bf16 / fp16, Traits::k16): 64-token tiles; S [64 x 64 tokens] = q K^T on eight
// m64n64k16 steps, P packed from the S accumulators into the m64k16 A fragments (the accumulator
// columns of an n16 block are the fragment's k positions: no reordering), and O += P V with V as
// stored, MN-major (tnspB = 1): no transpose, no V^T tile, one CTA barrier per tile, O in d
// order and accumulated in the tensor core after its rescale in registers. Head_dim 256: 32-token
// tiles, S on m64n32k16, O one m64n256 accumulator (128 registers per thread), two stages and
// two CTAs per SM; the merge area (64 x 256 f32) runs over the stages into q (traits.cuh).
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/append.cuh"
#include "kernels/gqa/sm90/cta.cuh"
#include "kernels/gqa/sm90/q_tile.cuh"
#include "kernels/gqa/sm90/tile_loader.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {

using namespace ::deca::sm90;

// The 16-bit cache's P of a tile (Traits::k16): P = 2^(x - m + 8) for the thread's rows (a padding
// row at 32 rows gives zeros; a shift of +inf, skip_rows.cuh's dropped row, too) packed into the A
// fragments of the tile's k16 steps (register j of step kk: S elements 8 kk + 2 j, + 1, i.e. row
// h = j & 1, tokens 16 kk + 2 (l % 4) + 8 (j >> 1) and + 1), and the rows' sums.
template <class T, int kHalves, int kS, class Logit>
__device__ __forceinline__ void rows_on_m_p_16bit(const float (&s)[kS], const float (&shift)[kHalves],
                                                  const float (&row_scale)[kHalves], const Logit& logit,
                                                  unsigned (&a)[kS / 8][4], float (&sum)[kHalves]) {
  constexpr int kSteps = kS / 8;  // k16 steps of the tile's tokens
#pragma unroll
  for (int h = 0; h < kHalves; ++h) sum[h] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = j & 1;
      if (h >= kHalves) {
        a[kk][j] = 0u;
        continue;
      }
      float pr[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = s[8 * kk + 2 * j + c];
        pr[c] = ptx::ex2(T::kSoftcap ? logit(x, h) - shift[h] : fmaf(x, row_scale[h], -shift[h]));
      }
      sum[h] += pr[0] + pr[1];
      a[kk][j] = ptx::pack2<T::kF16>(pr[0], pr[1]);
    }
  }
}

// The 16-bit cache's PV: O rescaled by alpha in registers, then O += P V (V, or any finite 16 KB
// tile when P is 0, at byte offset v_off, MN-major through desc_v: N = head_dim), waited for.
template <class T, int kHalves, int kSteps, int kO, class DescV>
__device__ __forceinline__ void rows_on_m_pv_16bit_mma(float (&o)[kO], const unsigned (&a)[kSteps][4],
                                                       const float (&alpha)[kHalves], const DescV& desc_v,
                                                       unsigned v_off) {
#pragma unroll
  for (int e = 0; e < kO; ++e) {
    const int h = (e >> 1) & 1;
    if (h < kHalves) o[e] *= alpha[h];
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    if constexpr (kO == 128) {
      Wgmma16<T::kF16>::rs_n256_tb(o, a[kk], desc_v(v_off + 2048u * kk), true);  // head_dim 256
    } else if constexpr (kO == 64) {
      Wgmma16<T::kF16>::rs_n128_tb(o, a[kk], desc_v(v_off + 2048u * kk), true);
    } else {
      Wgmma16<T::kF16>::rs_n64_tb(o, a[kk], desc_v(v_off + 2048u * kk), true);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(o);
}

// The 16-bit cache's end of a tile: P and the rows' sums (rows_on_m_p_16bit), l_run, then the PV.
template <class T, int kHalves, int kS, int kO, class Logit, class DescV>
__device__ __forceinline__ void rows_on_m_pv_16bit(const float (&s)[kS], float (&o)[kO], const float (&alpha)[kHalves],
                                                   const float (&shift)[kHalves], const float (&row_scale)[kHalves],
                                                   float (&l_run)[kHalves], const Logit& logit, const DescV& desc_v,
                                                   unsigned v_off) {
  unsigned a[kS / 8][4];
  float sum[kHalves];
  rows_on_m_p_16bit<T, kHalves>(s, shift, row_scale, logit, a, sum);
#pragma unroll
  for (int h = 0; h < kHalves; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];
  rows_on_m_pv_16bit_mma<T, kHalves>(o, a, alpha, desc_v, v_off);
}

// S = q K^T of the K tile at byte offset k_off (rows on M, tokens on N), issued and committed, not
// waited for: 16-bit head_dim / 16 k-steps of 16 dims, q and K in column blocks of 64 dims
// (blocked128); fp8 4 k-steps of 32 dims x the two terms of q.
template <class T, int kS, class Desc>
__device__ __forceinline__ void rows_on_m_qk(float (&s)[kS], const Desc& desc, unsigned k_off) {
  constexpr SmemPlan kPlan = T::kPlan;
  constexpr int kTileT = T::kTile;
  wgmma_fence();
  if constexpr (T::k16) {
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
      const unsigned long long da = desc(kPlan.q_hi + blocked128(0, 32 * kk, kRowsOnMOperandRows));
      const unsigned long long db = desc(k_off + blocked128(0, 32 * kk, kTileT));
      if constexpr (kS == 64) {
        Wgmma16<T::kF16>::ss_n128(s, da, db, kk > 0);  // head_dim 64: 128 tokens
      } else if constexpr (kS == 16) {
        Wgmma16<T::kF16>::ss_n32(s, da, db, kk > 0);  // head_dim 256: 32 tokens
      } else {
        Wgmma16<T::kF16>::ss_n64(s, da, db, kk > 0);
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long db = desc(k_off + 32 * kk);
      wgmma_m64n128k32_e4m3_ss(s, desc(kPlan.q_hi + 32 * kk), db, kk > 0);
      wgmma_m64n128k32_e4m3_ss(s, desc(kPlan.q_lo + 32 * kk), db, true);
    }
  }
  wgmma_commit();
}

// The fp8 V transpose (layout.cuh): V at vs into the V^T tile at vt; warp w takes token blocks
// 2 w and 2 w + 1 (16 tokens each) of every d block (32 d): one ldmatrix.trans, four prmt and one
// stmatrix per pair.
__device__ __forceinline__ void rows_on_m_transpose_v(unsigned vs, unsigned vt, const unsigned (&ldsm_off)[4],
                                                      const unsigned (&stsm_off)[2]) {
#pragma unroll
  for (int tb = 0; tb < 2; ++tb) {
#pragma unroll
    for (int db = 0; db < 4; ++db) {
      unsigned r[4], c[4];
      ptx::ldmatrix_x4_trans(vs + 2048u * tb + ldsm_off[db], r[0], r[1], r[2], r[3]);
      c[0] = ptx::prmt(r[0], r[1], 0x6420u);  // even d of the first 16: tokens 2q, 2q+1, 2q+8, 2q+9
      c[1] = ptx::prmt(r[0], r[1], 0x7531u);  // odd d
      c[2] = ptx::prmt(r[2], r[3], 0x6420u);  // the next 16 d
      c[3] = ptx::prmt(r[2], r[3], 0x7531u);
      stmatrix_x4(vt + 4096u * db + stsm_off[tb], c);
    }
  }
}

// The fp8 P = 2^(x - m + 8) as two e4m3 terms, straight into the A fragments of the k32 steps:
// register j of step kk holds elements 16 kk + 8 (j >> 1) + {0, 1, 4, 5} + 2 (j & 1); and the
// rows' sums. A shift of +inf (a dropped row) gives zeros.
template <class T, int kHalves, int kS, class Logit>
__device__ __forceinline__ void rows_on_m_p_e4m3(const float (&s)[kS], const float (&shift)[kHalves],
                                                 const float (&row_scale)[kHalves], const Logit& logit,
                                                 unsigned (&p_hi)[4][4], unsigned (&p_lo)[4][4],
                                                 float (&sum)[kHalves]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) sum[h] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = j & 1;
      if (h >= kHalves) {
        p_hi[kk][j] = 0u, p_lo[kk][j] = 0u;
        continue;
      }
      const int e0 = 16 * kk + 8 * (j >> 1) + 2 * h;
      float pr[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float x = s[e0 + (c & 1) + 4 * (c >> 1)];
        // Without soft-cap one FFMA: x scale - shift.
        pr[c] = ptx::ex2(T::kSoftcap ? logit(x, h) - shift[h] : fmaf(x, row_scale[h], -shift[h]));
      }
      sum[h] += (pr[0] + pr[1]) + (pr[2] + pr[3]);
      kv::split_e4m3_f32(pr[0], pr[1], pr[2], pr[3], p_hi[kk][j], p_lo[kk][j]);
    }
  }
}

// A tile's mask (one that needs it: the causal edge, the unit's end, a window, checked mode's bad
// page ids) on S, then the rows' maxima of the raw logits (a quad of lanes per row): the scale is
// >= 0 and the soft-cap monotonic, so they are the scaled maxima.
template <class T, int kHalves, int kS>
__device__ __forceinline__ void rows_on_m_mask_max(float (&s)[kS], float (&mx)[kHalves], const GqaParams& p,
                                                   const Unit& unit, int tile_t0, bool bad_tile,
                                                   const int (&row_pos)[kHalves], const unsigned* const (&tree)[kHalves],
                                                   const int* page_row, int l) {
  const int seq_len = unit.seq_len;
  const int causal_start = seq_len - p.q_len;
  if (tile_needs_mask<T>(p, unit, tile_t0, bad_tile, causal_start, seq_len)) {
#pragma unroll
    for (int e = 0; e < kS; ++e) {
      const int h = (e >> 1) & 1;
      if (h >= kHalves) continue;  // padding row
      const int t = tile_t0 + rows_on_m_token(e, l);
      bool visible = t < unit.end && row_sees_key<T>(p, t, row_pos[h], causal_start, tree[h]);
      if constexpr (T::kChecked) {
        if (bad_tile && visible) {
          visible = static_cast<unsigned>(__ldg(page_row + t / T::kPageSize)) <
                    static_cast<unsigned>(p.num_pages);
        }
      }
      if (!visible) s[e] = kNegInf;
    }
  }
#pragma unroll
  for (int h = 0; h < kHalves; ++h) mx[h] = kNegInf;
#pragma unroll
  for (int e = 0; e < kS; ++e) {
    const int h = (e >> 1) & 1;
    if (h < kHalves) mx[h] = fmaxf(mx[h], s[e]);
  }
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
}

// The rows into the epilogue's merge area (one slice: kWarpsN = 1), then the output, LSE or
// partials (finish_cta): O's columns back in d order (fp8: V^T's row order), m with P's scale.
template <class T, int kHalves, int kO>
__device__ __forceinline__ void rows_on_m_finish(const GqaParams& p, unsigned char* smem, const float (&o)[kO],
                                                 const float (&m_run)[kHalves], float (&l_run)[kHalves],
                                                 const int (&qrow)[kHalves], int l, const CtaRows& cta,
                                                 float v_scale) {
  ptx::cp_async_wait<0>();
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  __syncthreads();  // every warp's wgmma reads of the stages are done: the area reuses them
  const MergeArea<T> area(smem);
#pragma unroll
  for (int e = 0; e < kO; ++e) {
    const int h = (e >> 1) & 1;
    if (h >= kHalves) continue;
    const int n = 8 * (e >> 2) + 2 * (l & 3) + (e & 1);
    const int d = T::k16 ? n : rows_on_m_d(n);  // V^T's row order (16-bit: d order)
    area.o[qrow[h] * T::kHeadDim + d] = o[e];
  }
  if ((l & 3) == 0) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      area.ml[2 * qrow[h]] = m_run[h] - 8.f;  // P's scale (2^8, as decode.cuh)
      area.ml[2 * qrow[h] + 1] = l_run[h];
    }
  }
  __syncthreads();
  finish_cta<T>(p, smem, cta, v_scale);
}

template <class Cfg>
__device__ __forceinline__ void gqa_decode_rows_kernel(const GqaParams& p, unsigned char* smem_raw) {
  using T = Traits<Cfg>;
  constexpr int N = T::kRows;                       // query rows of the CTA: 32 or 64
  constexpr int kHalves = N == 64 ? 2 : 1;          // a thread's rows: l / 4 and, at 64, l / 4 + 8
  constexpr SmemPlan kPlan = T::kPlan;
  constexpr int kTileT = T::kTile;
  // S accumulators per thread: 64 (128 tokens), 32 (16-bit d128: 64 tokens) or 16 (d256: 32).
  constexpr int kS = kTileT / 2;
  constexpr int kO = T::k16 ? T::kHeadDim / 2 : 64;  // O accumulators per thread (N = head_dim)
  const int tid = threadIdx.x;
  const int w = tid >> 5;
  const int l = tid & 31;
  const int q_len = p.q_len;
  const int rows_total = q_len * T::kGroup;
  int* bad_item = checked_ring_items<T>();
  const CtaSmem cs(smem_raw);  // cta.cuh
  const unsigned base = cs.base;
  unsigned char* smem = cs.smem;
  float* q_inv = reinterpret_cast<float*>(smem + kPlan.q_inv);  // [64 operand rows]
  auto desc = [&](unsigned offset) { return cs.desc(offset); };
  // 16-bit: V as PV's B operand, MN-major: d blocks of 64 (LBO: a column block, tile x 128 B),
  // 8-token groups (SBO 1024 B).
  const unsigned long long desc16_v0 = T::k16 ? smem_desc_sw128(cs.base, 128u * kTileT, 1024) : 0ull;
  auto desc16_v = [&](unsigned offset) { return desc_advance(desc16_v0, offset); };

  // ---- Schedule: one unit (request, kv head, row block), the keys of split blockIdx.x; the
  // loader (tile_loader.cuh) reads the first tiles' page ids for the promised maximum length
  // while the request's length is read ----
  SplitCta cta_unit;
  if (!split_cta_coords<T>(p, N, cta_unit)) return;
  const int split = cta_unit.split, row_blocks = cta_unit.row_blocks, row_block = cta_unit.row_block;
  const int kv_head = cta_unit.unit.kv_head;
  const int batch = cta_unit.unit.request;
  const int row0 = row_block * N;
  constexpr int kAhead = T::kStages - 1;  // tiles in flight before the first is waited for
  TileLoader<T> loader(p, bad_item, tid);
  const Unit guess = unit_of_length<T>(p, cta_unit, p.max_seq_len);
  int guessed[kAhead][TileLoader<T>::kIdSlots];
  loader.read_guess(guess, guessed);
  const int length = load_seq_len<T>(p, batch);  // in flight with the guessed ids and q

  // ---- Operand rows: thread (w, l) holds operand rows 16 w + l / 4 + 8 h. At 64 rows operand row
  // m is query row m; at 32, query row 8 w + r sits in operand row 16 w + r (r < 8) and the rows
  // 16 w + 8 .. are padding, so every thread has one real row and the softmax skips the other ----
  auto row_of_operand = [](int m) { return N == 64 ? m : ((m & 8) ? -1 : 8 * (m >> 4) + (m & 7)); };
  int qrow[kHalves];  // the CTA's query row of the thread's row h
#pragma unroll
  for (int h = 0; h < kHalves; ++h) qrow[h] = row_of_operand(16 * w + (l >> 2) + 8 * h);

  const float k_scale = p.k_scales ? p.k_scales[kv_head] : p.k_scale;
  const float v_scale = p.v_scales ? p.v_scales[kv_head] : p.v_scale;
  // The logit scale's sign goes into q (a negative k_scale flips it), so that the scale is >= 0
  // and a row's maximum logit is its maximum raw S: the softmax takes the maximum before scaling
  // and scales inside the exponent's FFMA. A zero scale (k_scale 0: every logit 0) is kept
  // positive so that masked keys (-inf) stay -inf, not NaN.
  const float qk_scale_signed = p.softmax_scale * k_scale;
  const float qk_scale = fmaxf(fabsf(qk_scale_signed), 1e-30f);
  // q read with the length and the page ids, before any copy is issued; the fused step's q needs
  // the length and its positions first, so it follows the first copies.
  auto load_q = [&] {
    if constexpr (T::k16) {
      load_q_16bit<T, kRowsOnMOperandRows>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, row_of_operand,
                                           qk_scale_signed < 0.f);
    } else {
      load_q_two_term<T, kRowsOnMOperandRows>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi,
                                              base + kPlan.q_lo, q_inv, row_of_operand, qk_scale_signed < 0.f);
    }
    stamp(kStampQ);  // the stamp build only (kernels/gqa/stamps.cuh)
  };
  if constexpr (!T::kFused) load_q();
  const Unit unit = unit_of_length<T>(p, cta_unit, length);
  const int seq_len = unit.seq_len;
  const int* page_row = loader.page_row_of(batch);
  TileCursor pend{unit, 0, unit.tiles, unit.tiles <= 0};
  int pend_item = 0;
  auto issue_next = [&] { loader.issue_next(pend, pend_item, cs); };

  // ---- Prologue: kStages - 1 tiles in flight ----
  loader.template start<kAhead>(pend, pend_item, cs, guess, guessed);
  stamp_word(kStampTilesWord, unit.tiles + 1ull);
  stamp(kStampIssued);
  // Fused step (append.cuh): this thread's first new-token item coded while the tiles fly.
  const fused::EarlyPair early = early_new_pair<T>(p, unit, row_block);
  if constexpr (T::kFused) load_q();
  __syncthreads();  // q_inv written
  const float logit_scale = T::kSoftcap ? qk_scale : qk_scale * kLog2e;
  float row_scale[kHalves], m_run[kHalves], l_run[kHalves];
  const unsigned* tree[kHalves];
  int row_pos[kHalves];  // causal position of the row's query token
  const int causal_start = seq_len - q_len;  // keys below are visible to every row (window aside)
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    row_scale[h] = T::k16 ? logit_scale : logit_scale * q_inv[16 * w + (l >> 2) + 8 * h];
    m_run[h] = kNegInf;
    l_run[h] = 0.f;
    const int row = row0 + qrow[h];
    const int tok = (row < rows_total ? row : 0) / T::kGroup;
    row_pos[h] = causal_start + tok;
    tree[h] = T::kTree ? p.tree_mask + batch * p.mask_stride_batch + tok * p.mask_stride_token : nullptr;
  }
  float o[kO];  // O: element e is row h = (e >> 1) & 1, V^T row 8 (e >> 2) + 2 (l % 4) + (e & 1)
#pragma unroll
  for (int e = 0; e < kO; ++e) o[e] = 0.f;
  const unsigned vt = base + kPlan.vt;
  // The V transpose (layout.cuh): warp w takes token blocks 2 w and 2 w + 1 (16 tokens each) of
  // every d block (32 d): one ldmatrix.trans, four prmt and one stmatrix per pair.
  unsigned ldsm_off[4], stsm_off[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) ldsm_off[i] = 4096u * w + rows_on_m_ldsm_offset(l, i);
#pragma unroll
  for (int i = 0; i < 2; ++i) stsm_off[i] = rows_on_m_stsm_offset(l, 2 * w + i);
  // The stamp build waits for the first tile before the loop (the loop's body stays the plain
  // kernel's).
  if constexpr (T::kStamps) {
    if (unit.tiles > 0) {
      ptx::cp_async_wait<T::kStages - 2>();
      __syncthreads();
      stamp(kStampFirstTile);
    }
  }
  for (int i_tile = 0, item = 0; i_tile < unit.tiles; ++i_tile, ++item) {
    ptx::cp_async_wait<T::kStages - 2>();
    fence_proxy_async_smem();  // this thread's landed chunks, to the wgmma (async proxy) readers
    __syncthreads();           // tile `item` landed; the last tile's stage and V^T are free
    issue_next();              // tile item + kStages - 1
    const int stage = item % T::kStages;
    const unsigned k_off = stage * 2 * kStageBytes;
    const unsigned vs = base + k_off + kStageBytes;
    const int tile_t0 = unit.first + i_tile * kTileT;
    // ---- Fused step, append phase (append.cuh): the tile's new tokens into the stage and the cache ----
    if constexpr (T::kFused) {
      if (tile_has_new<T>(p, unit, tile_t0)) {
        append_new_tokens<T>(p, unit, row_block, tile_t0, smem + k_off, smem + k_off + kStageBytes, early);
        fence_proxy_async_smem();
        __syncthreads();
      }
    }

    float s[kS];
    rows_on_m_qk<T>(s, desc, k_off);  // fp8: under the V transpose
    if constexpr (!T::k16) rows_on_m_transpose_v(vs, vt, ldsm_off, stsm_off);
    wgmma_wait<0>();
    fence_regs(s);

    const bool bad_tile = T::kChecked && bad_item[item % (T::kStages + 1)] == item;
    float mx[kHalves];
    rows_on_m_mask_max<T, kHalves>(s, mx, p, unit, tile_t0, bad_tile, row_pos, tree, page_row, l);
    // The logit in log2 units of a raw S value (-inf stays -inf).
    auto logit = [&](float x, int h) {
      if constexpr (T::kSoftcap) {
        return x == kNegInf ? kNegInf : p.softcap * tanhf(x * row_scale[h] / p.softcap) * kLog2e;
      } else {
        return x * row_scale[h];
      }
    };
    float alpha[kHalves], shift[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const float m_new = fmaxf(m_run[h], logit(mx[h], h));
      // A row that has seen nothing keeps m = -inf; subtracting 0 keeps exp2 at 0, not NaN.
      const float m_use = m_new == kNegInf ? 0.f : m_new;
      alpha[h] = ptx::ex2(m_run[h] - m_use);
      m_run[h] = m_new;
      shift[h] = m_use - 8.f;  // P times 256: e4m3's range (the max reported 8 lower, as decode.cuh)
    }
    if constexpr (T::k16) {
      rows_on_m_pv_16bit<T, kHalves>(s, o, alpha, shift, row_scale, l_run, logit, desc16_v, k_off + kStageBytes);
    } else {

    unsigned p_hi[4][4], p_lo[4][4];
    float sum[kHalves];
    rows_on_m_p_e4m3<T, kHalves>(s, shift, row_scale, logit, p_hi, p_lo, sum);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) l_run[h] = l_run[h] * alpha[h] + sum[h];

    fence_proxy_async_smem();  // this thread's V^T words, to the wgmma
    __syncthreads();           // V^T complete

    // O = O alpha + (P_hi + P_lo) V, the tile's product in a fresh accumulator added in fp32
    // (Hopper's fp8 wgmma keeps ~14 bits when it accumulates: decode.cuh).
    float ot[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long db = desc(kPlan.vt + 32 * kk);
      wgmma_m64n128k32_e4m3_rs(ot, p_hi[kk], db, kk > 0);
      wgmma_m64n128k32_e4m3_rs(ot, p_lo[kk], db, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(ot);
#pragma unroll
    for (int e = 0; e < 64; ++e) {
      const int h = (e >> 1) & 1;
      if (h < kHalves) o[e] = o[e] * alpha[h] + ot[e];
    }
    }
  }

  // ---- The rows into the epilogue's merge area (one slice: kWarpsN = 1) ----
  stamp(kStampLastPv);  // the stamp build only: the last tile's PV waited for
  const CtaRows cta{batch, batch, kv_head, row_blocks, row_block, split, row0, rows_total, rows_total};
  rows_on_m_finish<T, kHalves>(p, smem, o, m_run, l_run, qrow, l, cta, v_scale);
}

}  // namespace deca::gqa::sm90
