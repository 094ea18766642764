// The portable GQA kernel's softmax (decode.cuh): per thread, the two query rows it holds in the
// mma fragments (rows g and g + 8 of its warp's slice), what masks their keys, and the online
// softmax over each chunk of S = q K^T.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// P comes out of ex2 times 2^kPShift: 256 (e4m3's range) on the two-term e4m3 PV, else 1. l and O
// carry the same factor, and the max a warp reports is lowered by it, so the merge, the sink, LSE
// and the splits see consistent (m, l, o) with no extra multiply.
template <class T>
constexpr float kPShift = T::kPvTwoTerm ? 8.f : 0.f;

// The thread's rows g and g + 8 (h = 0, 1): what masks their keys, and their logit scales. The
// arrays are the kernel's (gqa_decode_kernel says why).
struct RowFacts {
  int causal_start;  // keys below are visible to every row (window aside)
  int (&pos)[2];     // causal position of the row's query token
  int (&len)[2];     // the row's own sequence length (its beam's)
  int (&beam)[2];
  int (&drafts)[2];  // first draft key of the row's beam
  const unsigned* (&tree)[2];
  float (&qk_scale)[2];    // logit scale with the row's q scale undone (soft-cap's input)
  float (&log2_scale)[2];  // the same in log2 units
};

template <class T>
__device__ __forceinline__ void fill_row_facts(RowFacts& f, const GqaParams& p, const CtaCoords<T>& cta,
                                               int row_lo, int row_hi, const float (&row_inv)[2],
                                               const KvScales& sc) {
  f.causal_start = cta.seq_min - cta.q_len;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h ? row_hi : row_lo;
    const int rr = row < cta.rows_total ? row : 0;
    const int tok = cta.row_tok(rr);
    f.beam[h] = T::kBeamWidth == 1 ? 0 : rr / cta.rows_per_beam;
    f.len[h] = T::kBeamWidth == 1 ? cta.seq_len : load_seq_len<T>(p, cta.row_batch(rr));
    f.drafts[h] = f.len[h] - cta.q_len;
    f.pos[h] = f.drafts[h] + tok;
    if constexpr (T::kTree) {
      f.tree[h] = p.tree_mask + cta.row_batch(rr) * p.mask_stride_batch + tok * p.mask_stride_token;
    }
  }
  f.qk_scale[0] = sc.qk * row_inv[0];
  f.qk_scale[1] = sc.qk * row_inv[1];
  f.log2_scale[0] = sc.log2 * row_inv[0];
  f.log2_scale[1] = sc.log2 * row_inv[1];
}

// S of kChunk tokens from key t0 on, of a work item whose keys end at `end` (the split's) and
// that holds every beam (`beam` -1) or one: scaled into log2 units (soft-capped first), and where
// `need_mask` (the kernel's warp-uniform test of the chunk) the keys a row must not see set to
// -inf. Checked mode: when a page id of the item was out of range (`bad`), its keys loaded as
// zeros and page_ok(t) tests each key's id again (only on this rare path).
template <class T, int kN8, class PageOk>
__device__ __forceinline__ void scale_and_mask(const GqaParams& p, const RowFacts& rows, int end, const int& beam,
                                               bool bad, const PageOk& page_ok, bool need_mask, int t0, int c,
                                               float (&s_acc)[kN8][4]) {
  constexpr int kBeams = T::kBeamWidth;
#pragma unroll
  for (int j = 0; j < kN8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s_acc[j][e];
      if constexpr (T::kSoftcap) {
        x = p.softcap * tanhf(x * rows.qk_scale[e / 2] / p.softcap) * kLog2e;
      } else {
        x *= rows.log2_scale[e / 2];
      }
      if (need_mask) {
        const int h = e / 2;
        const int t = t0 + j * 8 + 2 * c + (e % 2);
        bool visible = t < end;
        if constexpr (kBeams > 1) {
          visible = visible && t < rows.len[h] && (beam < 0 || beam == rows.beam[h]);
        }
        visible = visible && row_sees_key<T>(p, t, rows.pos[h], rows.drafts[h], rows.tree[h]);
        if constexpr (T::kChecked) {
          if (bad && visible) visible = page_ok(t);
        }
        if (!visible) x = kNegInf;
      }
      s_acc[j][e] = x;
    }
  }
}

// The chunk's logits -> P = 2^(x - m) (times 2^kPShift) in place, with the thread's share of the
// online softmax brought up to the chunk, per row (h = 0: row g, 1: row g + 8): the running max
// m_run and sum l_run (this thread's partial: the four threads of a group share a row and sum at
// the end) and the output accumulators O, kOTiles n8 tiles of the warp's 16 x head_dim block.
template <class T, int kN8, int kOTiles>
__device__ __forceinline__ void online_softmax(float (&s_acc)[kN8][4], float (&m_run)[2], float (&l_run)[2],
                                               float (&o_acc)[kOTiles][4], float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = kNegInf;
#pragma unroll
    for (int j = 0; j < kN8; ++j) mx = fmaxf(mx, fmaxf(s_acc[j][2 * h], s_acc[j][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run[h], mx);
    // A row that has seen nothing yet keeps m = -inf; subtracting 0 then keeps exp2 at 0
    // instead of NaN (-inf - -inf).
    const float m_use = m_new == kNegInf ? 0.f : m_new;
    alpha[h] = ptx::ex2(m_run[h] - m_use);
    m_run[h] = m_new;
    const float m_p = m_use - kPShift<T>;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kN8; ++j) {
      s_acc[j][2 * h] = ptx::ex2(s_acc[j][2 * h] - m_p);
      s_acc[j][2 * h + 1] = ptx::ex2(s_acc[j][2 * h + 1] - m_p);
      sum += s_acc[j][2 * h] + s_acc[j][2 * h + 1];
    }
    l_run[h] = l_run[h] * alpha[h] + sum;  // per-thread partial; summed over the group at the end
  }
  // Once a row's max settles (the common case after the first tiles) alpha is exactly 1: skip
  // the head_dim / 2 multiplies when no row of the warp moved.
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int o = 0; o < kOTiles; ++o) {
      o_acc[o][0] *= alpha[0];
      o_acc[o][1] *= alpha[0];
      o_acc[o][2] *= alpha[1];
      o_acc[o][3] *= alpha[1];
    }
  }
}

}  // namespace deca::gqa
