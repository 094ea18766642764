// Portable GQA decode kernel: mma.sync tensor cores and cp.async, sm_80 and newer (runs on
// Hopper too). One CTA = (request, kv head, block of `kRows` query rows, split of the keys).
//
// Rows are (query token, q head of the group) pairs: the whole group shares every K/V tile load,
// which is the point of GQA. Four warps: `kWarpsM` side by side along rows (16 rows each) times
// `kWarpsN` along the tokens of a tile, each with its own online-softmax state; they meet once, at
// the end, in shared memory. All 128 threads stream K and V tiles with cp.async through a
// `kStages`-deep ring (kv_loader.cuh); 8-bit caches stay 8-bit in shared memory (twice the tokens
// per stage) and are widened in registers right before the mma (kernels/common/kv_convert.cuh),
// or multiplied as they are against two-term q and P (qk.cuh, pv.cuh).
//
// The kernel in the order it runs: the CTA's rows, keys and work items (cta.cuh); q as mma
// fragments (q_operand.cuh); then per work item and per chunk of a warp's tokens S = q K^T
// (qk.cuh), scale, mask and online softmax (softmax.cuh), O += P V (pv.cuh); at the end the warps'
// rows merged in shared memory and the output, LSE and split-KV partials written (epilogue.cuh).
//
// Split-KV: CTAs of one (request, kv head, row block) take disjoint tile ranges, write partial
// (max, sum, unnormalised output) to the workspace, and the last to arrive (atomic counter, which
// it resets to zero for the next launch) merges them in a fixed order: bitwise reproducible.
//
// Skip-softmax (Cfg::kSkip): skip.cuh's main loop replaces the one below (the CTA's setup and the
// epilogue are shared); the exact kernels compile to the code without it.
//
// Checked mode (Cfg::kChecked): every page id is range-tested where it is read, once per page
// slot per CTA; a bad one is never dereferenced (its keys load as zeros and are masked) and is
// recorded in the workspace (kernels/common/check_record.cuh), as is a sequence length out of
// range (the request is then treated as empty). Unchecked kernels compile to the code without it.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/append.cuh"
#include "kernels/gqa/sm80/cta.cuh"
#include "kernels/gqa/sm80/kv_loader.cuh"
#include "kernels/gqa/sm80/pv.cuh"
#include "kernels/gqa/sm80/q_operand.cuh"
#include "kernels/gqa/sm80/qk.cuh"
#include "kernels/gqa/sm80/skip.cuh"
#include "kernels/gqa/sm80/softmax.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// Output column of accumulator tile `o`, column `col` (0..7) of a warp's 16 x head_dim block. The
// 16-bit path keeps the natural order; the 8-bit V paths take tile pairs per 16-dim block: even
// dims of the block, then odd (their ldmatrix.trans + prmt byte split).
template <class T>
__device__ __forceinline__ int out_dim(int o, int col) {
  if constexpr (T::kVPairs16) {
    return (o / 2) * 16 + 2 * col + (o % 2);
  } else {
    return o * 8 + col;
  }
}

// The warp's rows into the epilogue's merge area: its slice's unnormalised O and, per row, the
// max (P's scale undone) and the sum over the row's four threads.
template <class T, int kOTiles>
__device__ __forceinline__ void warp_rows_to_merge_area(unsigned char* smem, const Lane& ln, const float (&m_run)[2],
                                                        float (&l_run)[2], const float (&o_acc)[kOTiles][4]) {
  constexpr int D = T::kHeadDim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  const MergeArea<T> area(smem);
  float* merge_o = area.o;
  float* merge_ml = area.ml;
  const int lrow_lo = ln.warp_m * 16 + ln.g;
#pragma unroll
  for (int o = 0; o < kOTiles; ++o) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int lrow = lrow_lo + (e / 2) * 8;
      const int d = out_dim<T>(o, 2 * ln.c + (e % 2));
      merge_o[(ln.warp_n * T::kRows + lrow) * D + d] = o_acc[o][e];
    }
  }
  if (ln.c == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lrow = lrow_lo + h * 8;
      merge_ml[(ln.warp_n * T::kRows + lrow) * 2 + 0] = m_run[h] - kPShift<T>;  // P's scale
      merge_ml[(ln.warp_n * T::kRows + lrow) * 2 + 1] = l_run[h];
    }
  }
}

// The kernel's arrays (q's fragments and their staging, the row facts, the softmax state, the page
// ids in flight, S and the two-term paths' working arrays) are its own locals, declared in the
// order below and handed to the phases by reference. The compiler turns arrays into registers in
// an order that follows where they are declared, and ptxas assigns registers in that order: kept
// here, they leave the kernel's SASS instruction for instruction what it was as one function
// (docs/perf-notes.md, "SASS unchanged").
template <class Cfg>
__device__ __forceinline__ void gqa_decode_kernel(const GqaParams& p, unsigned char* smem) {
  using T = Traits<Cfg>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(!T::kPvTwoTerm, "the two-term e4m3 path needs sm_89+ (e4m3 mma.sync)");
#endif
  using Q = QLayout<T>;
  constexpr int kBeams = T::kBeamWidth;
  constexpr int kOTiles = T::kHeadDim / 8;

  // ---- The CTA's rows and keys, its work items, the kv head's scales ----
  const Lane ln = lane_of_thread<T>();
  const CtaCoords<T> cta = cta_coords<T>(p);
  // Row blocks are sized from the plan's max q_len; with a shorter q_len the tail blocks have no
  // rows. All CTAs of such a block leave together, so its split counter stays untouched.
  if (cta.row0 >= cta.rows_total) return;
  int* bad_item = checked_items<T>(ln.tid);
  const KeyRange range = split_range<T>(p, cta.seq_min, cta.seq_len, cta.split);
  const int num_tiles = range.end > range.begin ? (range.end - range.begin + T::kTile - 1) / T::kTile : 0;
  int shared_tiles = num_tiles;
  if constexpr (kBeams > 1) {
    __shared__ int first_diverged;
    shared_tiles = beams_shared_tiles<T>(p, cta, range, num_tiles, first_diverged);
  }
  const WorkItems<T> items{shared_tiles, shared_tiles + (num_tiles - shared_tiles) * kBeams};
  const KvScales scales = kv_scales<T>(p, cta.kv_head);
  const unsigned smem_base = ptx::smem_addr(smem);

  // ---- Fused step, rope phase (append.cuh): the CTA's q rows rotated into shared memory ----
  if constexpr (T::kFused) {
    rope_q_rows<T>(p, cta, smem, ln.tid);
    __syncthreads();
  }

  // ---- q: this warp's 16 rows (g and g + 8 per thread) as A fragments ----
  const unsigned q_smem = Q::smem(smem_base);
  const int my_row_lo = cta.row0 + ln.warp_m * 16 + ln.g;
  const int my_row_hi = my_row_lo + 8;
  float row_inv[2] = {1.f, 1.f};
  unsigned q_frag[Q::kFragSteps][4] = {};
  unsigned q8_frag[Q::kFrag8Steps][2][4];
  if constexpr (T::kQInRegs && T::kTwoTerm) {
    float4 f[T::kK32Steps][4];  // staging of the loads
    float amax[2];
    float sc[2];
    load_q_two_term<T>(p, cta, ln, row_inv, q8_frag, f, amax, sc);
  } else if constexpr (T::kQInRegs) {
    float2 f[Q::kKSteps][4];  // staging of the loads
    float sc[2];
    float amax[2];
    load_q_16bit<T>(p, cta, ln, row_inv, q_frag, f, sc, amax);
  } else {
    __shared__ float q_scale_smem[T::kRows];
    load_q_shared<T>(p, cta, ln, q_smem, q_scale_smem, row_inv);
  }
  const QOperand<T> q{q_frag, q8_frag, q_smem};
  int row_pos[2], row_len[2], row_beam[2], row_drafts[2];
  const unsigned* row_tree[2] = {nullptr, nullptr};
  float row_qk_scale[2], row_log2_scale[2];
  RowFacts rows{0, row_pos, row_len, row_beam, row_drafts, row_tree, row_qk_scale, row_log2_scale};
  fill_row_facts<T>(rows, p, cta, my_row_lo, my_row_hi, row_inv, scales);

  // ---- Softmax state (softmax.cuh) and output accumulators ----
  float m_run[2] = {kNegInf, kNegInf};
  float l_run[2] = {0.f, 0.f};
  float o_acc[kOTiles][4];
#pragma unroll
  for (int o = 0; o < kOTiles; ++o) o_acc[o][0] = o_acc[o][1] = o_acc[o][2] = o_acc[o][3] = 0.f;

  if constexpr (T::kFused) __syncthreads();  // the rotated q read before the ring reuses its bytes

  // ---- Prologue: the first kStages - 1 tiles in flight ----
  int pages_next[T::kLoadsPerThread];
  if constexpr (T::kSkip) {
    const SkipLoop<T, kOTiles> loop{p, cta, range, items, bad_item, ln, smem_base, q, rows, m_run, l_run, o_acc};
    skip_main_loop<T>(loop, pages_next);
  } else {
    KvLoader<T> loader(p, cta, range, items, bad_item, ln, smem_base, pages_next);
    loader.fetch_pages(0);
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
      if (s < items.num_items) loader.issue_tile(s, s);
      ptx::cp_async_commit();
      loader.fetch_pages(s + 1);
    }
    // ---- Fused step (append.cuh): this thread's first new-token item coded while tiles fly ----
    const fused::EarlyPair early = fused::kernel_early_pair<T>(p, cta.batch, cta.seq_len, cta.kv_head, range.begin,
                                                               range.end, ln.tid, cta.row_block == 0);

    // ---- Per work item: the next tile issued, then per chunk of the warp's tokens QK, softmax, PV ----
    for (int item = 0; item < items.num_items; ++item) {
      ptx::cp_async_wait<T::kStages - 2>();
      __syncthreads();  // item `item` landed for everyone; stage (item - 1) % kStages is free
      {
        const int next = item + T::kStages - 1;
        if (next < items.num_items) loader.issue_tile(next, next % T::kStages);
        ptx::cp_async_commit();
        loader.fetch_pages(next + 1);
      }
      const int stage = item % T::kStages;
      const unsigned ks = SharedStorage<T>::k_stage(smem_base, stage);
      const unsigned vs = SharedStorage<T>::v_stage(smem_base, stage);
      const int tile_t0 = range.begin + items.tile(item) * T::kTile;
      const int beam_only = kBeams == 1 ? -1 : items.beam(item);  // >= 0: keys of that beam only
      // ---- Fused step, append phase (append.cuh): the tile's new tokens into the stage and the cache ----
      if constexpr (T::kFused) {
        if (tile_has_new<T>(p, cta, tile_t0)) {
          append_new_tokens<T>(p, cta, range, tile_t0, beam_only, smem + (ks - smem_base), smem + (vs - smem_base),
                               ln.tid, early);
          __syncthreads();
        }
      }
      bool bad_tile = false;
      if constexpr (T::kChecked) bad_tile = bad_item[item % T::kBadItemSlots] == item;
      const int* page_rows = loader.page_rows;
      // Checked mode: key t's page id in range (t < range.end: an entry the request's length uses).
      auto page_ok = [&](int t) {
        const int* row = page_rows + (beam_only > 0 ? beam_only * p.page_table_stride : 0);
        return static_cast<unsigned>(__ldg(row + t / T::kPageSize)) < static_cast<unsigned>(p.num_pages);
      };

#pragma unroll 1
      for (int ch = 0; ch < T::kWarpTokens / T::kChunk; ++ch) {
        const int local0 = ln.warp_n * T::kWarpTokens + ch * T::kChunk;  // first token row in the stage
        const int t0 = tile_t0 + local0;
        if (t0 >= range.end) break;  // warp-uniform
        constexpr int kN8 = T::kChunk / 8;
        float s_acc[kN8][4];
        int s_hi[2][4], s_lo[2][4];  // the two-term paths' working arrays (qk.cuh QkScratch)
        unsigned qh[4], ql[4];
        QkScratch qk_scratch{s_hi, s_lo, qh, ql};
        qk_chunk<T>(q, ks, local0, ln, s_acc, qk_scratch);
        // Warp-uniform: whether some row must not see a key of the chunk (its causal start, the
        // window, the item's beam, a bad page id); if not, scale_and_mask skips the per-key test.
        const bool need_mask = (kBeams > 1 && beam_only >= 0) || (t0 + T::kChunk > rows.causal_start) ||
                               (T::kWindow && t0 < cta.seq_len - p.window) || (T::kChecked && bad_tile);
        scale_and_mask<T>(p, rows, range.end, beam_only, bad_tile, page_ok, need_mask, t0, ln.c, s_acc);
        float alpha[2];  // the rows' rescale of O
        online_softmax<T>(s_acc, m_run, l_run, o_acc, alpha);
        pv_chunk<T>(s_acc, vs, local0, ln.lane, o_acc);
      }
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // pipeline buffers are now free for the merge

  // ---- Epilogue: the warps' rows merged, the output, LSE or the split's partial written ----
  warp_rows_to_merge_area<T>(smem, ln, m_run, l_run, o_acc);
  __syncthreads();
  const CtaRows rows_of_cta{cta.batch, cta.request, cta.kv_head, cta.row_blocks, cta.row_block,
                            cta.split, cta.row0, cta.rows_total, cta.rows_per_beam};
  finish_cta<T>(p, smem, rows_of_cta, scales.v);
}

}  // namespace deca::gqa
