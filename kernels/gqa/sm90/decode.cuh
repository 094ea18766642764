// Hopper (sm_90a) GQA decode for an fp8 (e4m3) KV cache on the e4m3 wgmma, up to 16 query rows
// per KV head (docs/design-gqa-sm90.md; 32 and 64 rows: decode_rows.cuh). One CTA = one
// warpgroup = (request, kv head, block of 8 or 16 query rows, split of the keys), as the portable
// kernel (sm80/decode.cuh) whose host side, split policy and epilogue it shares. Per 128-token
// tile:
//
//   S^T [128 tokens x N rows] = K . (q_hi + q_lo)^T      tokens on M (two m64 halves), rows on N
//   online softmax down the tokens (a row is a column of S^T: a max across the four warps)
//   O^T [128 d x N]          += V^T . (P_hi + P_lo)^T     d on M, the tile's tokens on K
//
// K and V stay as stored (e4m3); q (once per CTA) and the softmax weights P (per tile) are split
// into two e4m3 terms each (0.1-0.2 % relative RMS where e4m3 q and P alone cost 3.5-5 %), the
// fp32 accumulators take both terms. 8-bit wgmma operands must be K-major, so V is transposed in
// shared memory once per tile (ldmatrix.trans + prmt + stmatrix, in place).
// Loads: all 128 threads copy 16-byte chunks with cp.async into a ring of kStages stages, each
// chunk where the 128-byte swizzle of the wgmma descriptors puts it; page ids are read a tile
// ahead. The merge of the CTA's rows, the output, LSE, sinks and split-KV are the portable
// kernel's (epilogue.cuh); O comes out times 256 (P's scale) and the max reported 8 lower, the
// same convention as the portable kernel's two-term path.
//
// 16-bit caches (bf16 / fp16, Traits::k16): tiles of the same 16 KB (64 tokens at head_dim 128,
// 128 at 64), q and P one term of the cache's type on the k16 wgmma (head_dim / 16 k-steps of S^T
// per m64 half of tokens), and V read as stored: 16-bit wgmma operands may be MN-major, so O^T's
// A = V^T is V's tile with tnspA = 1 (no transpose, O^T's rows in d order). O accumulates in the
// tensor core (f32 at full precision for 16-bit products), rescaled in registers before each
// tile's PV. Head_dim 256: 32-token tiles (16 KB per K or V, the same ring), S^T's M half padding
// (its rows read the next column block's bytes and are set to -inf), O^T in four m64 d blocks.
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

// acc[h] = A_h (B_hi + B_lo)^T for the H m64 halves of the A tile at byte offset a_off (K for
// S^T = K q^T, V^T for O^T = V^T P^T), B's two terms at b_hi / b_lo: 4 k-steps of 32 x 2 terms
// per half, into fresh accumulators, one wgmma group, not waited for. desc(offset) gives the
// descriptor of an operand at that offset from the shared base.
template <class Mma, int H, int A, class Desc>
__device__ __forceinline__ void two_term_chain(float (&acc)[H][A], const Desc& desc, unsigned a_off,
                                               unsigned b_hi, unsigned b_lo) {
  wgmma_fence();
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long da = desc(a_off + 8192 * h + 32 * kk);
      Mma::mma(acc[h], da, desc(b_hi + 32 * kk), kk > 0);
      Mma::mma(acc[h], da, desc(b_lo + 32 * kk), true);
    }
  }
  wgmma_commit();
}

// V -> V^T in place in the stage at `vs` by ldmatrix.trans + prmt + stmatrix (layout.cuh, as the
// rows-on-M kernel): V^T's token positions in rows_on_m_a_token order and its rows in rows_on_m_d
// order, which P^T's stores and the epilogue follow. Warp w takes token blocks 2 w, 2 w + 1 of
// the four d blocks (the thread's ldmatrix and stmatrix row offsets: ldsm_off, stsm_off); 8
// ldmatrix, 32 prmt and 8 stmatrix per warp and tile.
__device__ __forceinline__ void transpose_v_in_place(unsigned vs, const unsigned (&ldsm_off)[4],
                                                     const unsigned (&stsm_off)[2]) {
  unsigned r[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    ptx::ldmatrix_x4_trans(vs + 2048u * (i >> 2) + ldsm_off[i & 3], r[i][0], r[i][1], r[i][2], r[i][3]);
  }
  __syncthreads();  // in place: every warp's reads before any write
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const unsigned c[4] = {ptx::prmt(r[i][0], r[i][1], 0x6420u), ptx::prmt(r[i][0], r[i][1], 0x7531u),
                           ptx::prmt(r[i][2], r[i][3], 0x6420u), ptx::prmt(r[i][2], r[i][3], 0x7531u)};
    stmatrix_x4(vs + 4096u * (i & 3) + stsm_off[i >> 2], c);
  }
}

// S^T = K q^T for a 16-bit cache: per m64 half h of the tile's tokens, head_dim / 16 k-steps of
// 16 dims, K at byte offset k_off and q at q_off (column blocks of 128 B, blocked128: the tile's
// token rows, N query rows), into fresh accumulators, one wgmma group, not waited for.
template <class T, int N, int H, int kAcc, class Desc>
__device__ __forceinline__ void qk_chain_16bit(float (&acc)[H][kAcc], const Desc& desc, unsigned k_off,
                                               unsigned q_off) {
  wgmma_fence();
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int kk = 0; kk < T::kHeadDim / 16; ++kk) {
      Wgmma16<T::kF16>::template ss_n<N, 0>(acc[h], desc(k_off + blocked128(64 * h, 32 * kk, T::kTile)),
                                            desc(q_off + blocked128(0, 32 * kk, N)), kk > 0);
    }
  }
  wgmma_commit();
}

// O^T += V^T P^T for a 16-bit cache: for each m64 half m of d, one k-step per 16 tokens, A = the V
// tile at v_off read MN-major (d block m at m x tile x 128 B, 16 tokens = two 8-row groups at
// 2048 kk), B = P^T at p_off (N rows of the tile's tokens, K-major, blocked128). Accumulates into
// o; one group, not waited for.
template <class T, int N, int M, int kAcc, class Desc>
__device__ __forceinline__ void pv_chain_16bit(float (&o)[M][kAcc], const Desc& desc, unsigned v_off,
                                               unsigned p_off) {
  wgmma_fence();
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int kk = 0; kk < T::kTile / 16; ++kk) {
      Wgmma16<T::kF16>::template ss_n<N, 1>(o[m], desc(v_off + 128u * T::kTile * m + 2048u * kk),
                                            desc(p_off + blocked128(0, 32 * kk, N)), true);
    }
  }
  wgmma_commit();
}

// Query row r's softmax weights as PV's B operand (both rows-on-N kernels: this file's and
// skip.cuh's). pr: the thread's tokens 16 w + l / 4 (pr[2 h]) and + 8 (pr[2 h + 1]) of S^T's m64
// half h. fp8: two e4m3 terms at p_hi and p_lo in PV's token order (lanes l and l ^ 4 swap one
// term word; p_pos / p_sel: the gqa_decode_kernel's). 16-bit: P^T row r, tokens 64 h + 16 w + l /
// 4 and + 8, one value of the cache's type each at p_hi, in token order (column blocks of 64
// tokens, blocked128, at 128 tokens; at 32 the padding warps store nothing: PV reads the first
// 64 B of each row).
template <class T>
__device__ __forceinline__ void store_p_row(unsigned p_hi, unsigned p_lo, int r, const float (&pr)[4], int w, int l,
                                            unsigned p_pos, unsigned p_sel) {
  constexpr int N = T::kRows;
  if constexpr (T::k16) {
    constexpr int kTileT = T::kTile;
    constexpr int kSHalves = kTileT >= 64 ? kTileT / 64 : 1;
#pragma unroll
    for (int h = 0; h < kSHalves; ++h) {
      if (kTileT < 64 && 16 * w >= kTileT) break;
      const unsigned two = ptx::pack2<T::kF16>(pr[2 * h], pr[2 * h + 1]);
      const int tok = 64 * h + 16 * w + (l >> 2);
      sts16(p_hi + blocked128(r, 2 * tok, N), static_cast<unsigned short>(two & 0xFFFFu));
      sts16(p_hi + blocked128(r, 2 * (tok + 8), N), static_cast<unsigned short>(two >> 16));
    }
  } else {
    unsigned hi, lo;
    kv::split_e4m3_f32(pr[0], pr[1], pr[2], pr[3], hi, lo);
    const unsigned hi_pair = __shfl_xor_sync(0xffffffffu, hi, 4);
    const unsigned lo_pair = __shfl_xor_sync(0xffffffffu, lo, 4);
    sts32(p_hi + swz128(r, p_pos), ptx::prmt(hi, hi_pair, p_sel));
    sts32(p_lo + swz128(r, p_pos), ptx::prmt(lo, lo_pair, p_sel));
  }
}

// A tile's logits scaled (log2 units, the row's q scale undone: row_scale), soft-capped and masked
// in place, in the rows-on-N kernels (this file's and skip.cuh's): S^T's accumulator e of half h
// is key tile_t0 + 64 h + 16 w + l / 4 (+ 8) for query column cc = 2 (e >> 2) + (e & 1), the
// CTA's row row0 + col_row(cc). A key past the unit's end, outside the row's causal window or
// tree, behind a page id the checked build refused (`bad_tile`: read again here), or on M's
// padding rows (kPadWarps) becomes -inf; only where `need_mask` (the caller's test of the tile
// against the rows' views: a tile inside all of them skips the mask).
template <class T, int kSHalves, int kAcc, bool kPadWarps>
__device__ __forceinline__ void scale_mask_tile(const GqaParams& p, float (&s)[kSHalves][kAcc],
                                                const float (&row_scale)[T::kCols], const Unit& u, int tile_t0,
                                                bool need_mask, bool bad_tile, int causal_start, int row0,
                                                int rows_total, int batch, const int* page_row, int w, int l) {
  constexpr int kTileT = T::kTile;
  auto col_row = [&](int cc) { return 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1); };
#pragma unroll
  for (int h = 0; h < kSHalves; ++h) {
#pragma unroll
    for (int e = 0; e < kAcc; ++e) {
      const int cc = 2 * (e >> 2) + (e & 1);
      float x = s[h][e];
      if constexpr (T::kSoftcap) {
        x = p.softcap * tanhf(x * row_scale[cc] / p.softcap) * kLog2e;
      } else {
        x *= row_scale[cc];
      }
      if (need_mask) {
        const int t = tile_t0 + 64 * h + 16 * w + (l >> 2) + 8 * ((e >> 1) & 1);
        const int row = row0 + col_row(cc);
        const int tok = (row < rows_total ? row : 0) / T::kGroup;
        const unsigned* tree =
            T::kTree ? p.tree_mask + batch * p.mask_stride_batch + tok * p.mask_stride_token : nullptr;
        bool visible = t < u.end && row_sees_key<T>(p, t, causal_start + tok, causal_start, tree);
        if constexpr (T::kChecked) {
          if (bad_tile && visible) {
            visible = static_cast<unsigned>(__ldg(page_row + t / T::kPageSize)) <
                      static_cast<unsigned>(p.num_pages);
          }
        }
        if (!visible) x = kNegInf;
      }
      if constexpr (kPadWarps) {
        if (16 * w >= kTileT) x = kNegInf;  // padding rows of M (warp-uniform)
      }
      s[h][e] = x;
    }
  }
}

// The end of the rows-on-N kernels (this file's and skip.cuh's), the ring drained: the rows' sums
// across lanes and warps, O and (max, sum) into the epilogue's merge area (one slice: kWarpsN =
// 1), which reuses the stages, then the output, LSE or the split's partials (epilogue.cuh).
template <class T, int kHalves, int kAcc>
__device__ __forceinline__ void finish_rows_on_n(const GqaParams& p, unsigned char* smem, float* red, int l, int w,
                                                 const float (&m_run)[T::kCols], float (&l_run)[T::kCols],
                                                 const float (&o)[kHalves][kAcc], const SplitCta& c, int row0,
                                                 int rows_total, int batch, int kv_head, float v_scale) {
  constexpr int N = T::kRows;
  auto col_row = [&](int cc) { return 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1); };
  const int row_blocks = c.row_blocks, row_block = c.row_block, split = c.split;
#pragma unroll
  for (int cc = 0; cc < T::kCols; ++cc) {
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) l_run[cc] += __shfl_xor_sync(0xffffffffu, l_run[cc], m);
  }
  __syncthreads();  // the last tile's readers are done with its stage and red
  if (l < 4) {
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) red[w * N + col_row(cc)] = l_run[cc];
  }
  const MergeArea<T> area(smem);
#pragma unroll
  for (int m = 0; m < kHalves; ++m) {
#pragma unroll
    for (int e = 0; e < kAcc; ++e) {
      const int n = 64 * m + 16 * w + (l >> 2) + 8 * ((e >> 1) & 1);  // V^T's row
      const int d = T::k16 ? n : rows_on_m_d(n);  // 16-bit: V^T read in d order
      area.o[col_row(2 * (e >> 2) + (e & 1)) * T::kHeadDim + d] = o[m][e];
    }
  }
  __syncthreads();
  if (w == 0 && l < 4) {
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) {
      const int r = col_row(cc);
      area.ml[2 * r] = m_run[cc] - 8.f;  // P's scale (the header)
      area.ml[2 * r + 1] = red[r] + red[N + r] + red[2 * N + r] + red[3 * N + r];
    }
  }
  __syncthreads();
  const CtaRows cta{batch, batch, kv_head, row_blocks, row_block, split, row0, rows_total, rows_total};
  finish_cta<T>(p, smem, cta, v_scale);
}

template <class Cfg>
__device__ __forceinline__ void gqa_decode_kernel(const GqaParams& p, unsigned char* smem_raw) {
  using T = Traits<Cfg>;
  constexpr int N = T::kRows;
  constexpr int kAcc = N / 2;  // accumulator floats per thread per m64 tile
  constexpr SmemPlan kPlan = T::kPlan;
  using Mma = WgmmaE4m3<N>;
  constexpr int kHalves = T::kHeadDim / 64;  // m64 blocks of d (O^T): 2, 1 at head_dim 64, 4 at 256
  constexpr int kTileT = T::kTile;
  // m64 halves of the tile's tokens (S^T): 2 at 128 tokens, 1 at 64 or 32 (16-bit d256: rows
  // 32..63 of S^T's M are padding, warps 2 and 3 hold no token; kPadWarps).
  constexpr int kSHalves = kTileT >= 64 ? kTileT / 64 : 1;
  constexpr bool kPadWarps = kTileT < 64;
  const int tid = threadIdx.x;
  const int w = tid >> 5;  // warp
  const int l = tid & 31;
  const int q_len = p.q_len;
  const int rows_total = q_len * T::kGroup;
  int* bad_item = checked_ring_items<T>();
  const CtaSmem cs(smem_raw);  // cta.cuh
  const unsigned base = cs.base;
  unsigned char* smem = cs.smem;
  float* red = reinterpret_cast<float*>(smem + kPlan.red);      // [4 warps][N]
  float* q_inv = reinterpret_cast<float*>(smem + kPlan.q_inv);  // [N]
  auto desc = [&](unsigned offset) { return cs.desc(offset); };

  // ---- Schedule: one unit (request, kv head, row block), the keys of split blockIdx.x; the
  // loader (tile_loader.cuh) reads the first tiles' page ids for the promised maximum length
  // while the request's length is read ----
  SplitCta c;
  if (!split_cta_coords<T>(p, N, c)) return;
  const int row_block = c.row_block;
  const int row0 = row_block * N;
  const int batch = c.unit.request;
  const int kv_head = c.unit.kv_head;
  constexpr int kAhead = T::kStages - 1;  // tiles in flight before the first is waited for
  TileLoader<T> loader(p, bad_item, tid);
  const Unit guess = unit_of_length<T>(p, c, p.max_seq_len);
  int guessed[kAhead][TileLoader<T>::kIdSlots];
  loader.read_guess(guess, guessed);
  const int length = load_seq_len<T>(p, batch);  // in flight with the guessed ids and q
  const float k_scale = p.k_scales ? p.k_scales[kv_head] : p.k_scale;
  const float v_scale = p.v_scales ? p.v_scales[kv_head] : p.v_scale;

  // The unit (its keys known once the length is) and the loader's cursor: the next tile to issue,
  // whose page ids pages_next holds; `pend_item` is its index in the ring.
  Unit u;
  TileCursor pend;
  int pend_item = 0;
  auto issue_next = [&] { loader.issue_next(pend, pend_item, cs); };
  // ---- Prologue: kStages - 1 tiles in flight ----
  auto start_copies = [&] {
    c.unit = unit_of_length<T>(p, c, length);
    u = c.unit;
    pend = TileCursor{u, 0, u.tiles, u.tiles <= 0};
    loader.template start<kAhead>(pend, pend_item, cs, guess, guessed);
    stamp_word(kStampTilesWord, u.tiles + 1ull);
    stamp(kStampIssued);  // the stamp build only (kernels/gqa/stamps.cuh)
  };

  // ---- q: rows scaled by a power of two each into [128, 256), split into two e4m3 terms (16-bit:
  // one term of the cache's type, no scale). Its loads go out with the length and the page ids,
  // the first copies are issued when those three are back, and q is converted while the copies
  // fly. The fused step's q needs the length and its positions first: it follows the copies ----
  auto load_q = [&](const auto& between) {
    if constexpr (T::k16) {
      load_q_16bit<T, N>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, [](int m) { return m; }, false,
                         between);
    } else {
      load_q_two_term<T, N>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, base + kPlan.q_lo,
                            q_inv, [](int m) { return m; }, false, between);
    }
    stamp(kStampQ);
  };
  if constexpr (T::kFused) {
    start_copies();
  } else {
    load_q(start_copies);
  }

  // ---- Per-thread accumulator coordinates ----
  // S^T element e of m64 half h: token 64 h + 16 w + l / 4 + 8 ((e >> 1) & 1), column (query row)
  // 8 (e / 4) + 2 (l % 4) + (e & 1); column index cc = 2 (e / 4) + (e & 1) of this thread's kCols.
  // O^T element e of d half m: d 64 m + 16 w + l / 4 + 8 ((e >> 1) & 1), same columns.
  auto col_row = [&](int cc) { return 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1); };
  // The V transpose's row offsets (transpose_v_in_place).
  unsigned ldsm_off[4], stsm_off[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) ldsm_off[i] = 4096u * w + rows_on_m_ldsm_offset(l, i);
#pragma unroll
  for (int i = 0; i < 2; ++i) stsm_off[i] = rows_on_m_stsm_offset(l, 2 * w + i);
  // This thread's P^T bytes in a row: its tokens 16 w + l / 4 (+ 8) of each half sit at A
  // positions 4 (l / 8) + (l / 4) % 2 (+ 2) of token block w (+ 4); lanes l and l ^ 4 swap one
  // term word, and the even one stores the first half's four bytes, the odd one the second's.
  const unsigned p_pos = 16 * (4 * ((l >> 2) & 1) + w) + 4 * (l >> 3);
  const unsigned p_sel = ((l >> 2) & 1) ? 0x3726u : 0x5140u;

  // Fused step (append.cuh): this thread's first new-token item coded while the tiles fly.
  const fused::EarlyPair early = early_new_pair<T>(p, u, row_block);
  if constexpr (T::kFused) load_q(NoWork{});

  const int seq_len = u.seq_len;
  const int* page_row = loader.page_row_of(batch);
  const float qk_scale = p.softmax_scale * k_scale;
  __syncthreads();  // q_inv written
  // Logit scale of column cc (log2 units, the row's q scale undone).
  const float logit_scale = T::kSoftcap ? qk_scale : qk_scale * kLog2e;
  float row_scale[T::kCols];
#pragma unroll
  for (int cc = 0; cc < T::kCols; ++cc) row_scale[cc] = T::k16 ? logit_scale : logit_scale * q_inv[col_row(cc)];
  float m_run[T::kCols], l_run[T::kCols];
#pragma unroll
  for (int cc = 0; cc < T::kCols; ++cc) m_run[cc] = kNegInf, l_run[cc] = 0.f;
  float o[kHalves][kAcc];  // O^T of d half m
#pragma unroll
  for (int m = 0; m < kHalves; ++m) {
#pragma unroll
    for (int e = 0; e < kAcc; ++e) o[m][e] = 0.f;
  }
  const int causal_start = seq_len - q_len;  // keys below are visible to every row (window aside)

  // The stamp build waits for the first tile before the loop, so that the loop's body is the
  // plain kernel's (its first wait and barrier then pass at once).
  if constexpr (T::kStamps) {
    if (u.tiles > 0) {
      ptx::cp_async_wait<T::kStages - 2>();
      __syncthreads();
      stamp(kStampFirstTile);
    }
  }
  for (int i_tile = 0, item = 0; i_tile < u.tiles; ++i_tile, ++item) {
    ptx::cp_async_wait<T::kStages - 2>();
    fence_proxy_async_smem();  // this thread's landed chunks, to the wgmma (async proxy) readers
    __syncthreads();           // tile `item` landed for all; stage (item - 1) % kStages is free
    issue_next();              // tile item + kStages - 1
    const int stage = item % T::kStages;
    const unsigned k_off = stage * 2 * kStageBytes;  // from the base
    const unsigned v_off = k_off + kStageBytes;
    const unsigned vs = base + v_off;
    const int tile_t0 = u.first + i_tile * kTileT;
    // ---- Fused step, append phase (append.cuh): the tile's new tokens into the stage and the cache ----
    if constexpr (T::kFused) {
      if (tile_has_new<T>(p, u, tile_t0)) {
        append_new_tokens<T>(p, u, row_block, tile_t0, smem + k_off, smem + v_off, early);
        fence_proxy_async_smem();
        __syncthreads();
      }
    }

    // S^T = K (q_hi + q_lo)^T (2 halves x 4 k-steps of 32 dims x 2 terms), and under it V -> V^T
    // in place; 16-bit: S^T = K q^T (8 k-steps of 16 dims), V stays.
    float s[kSHalves][kAcc];  // S^T of token half h
    if constexpr (T::k16) {
      qk_chain_16bit<T, N>(s, desc, k_off, kPlan.q_hi);
    } else {
      two_term_chain<Mma>(s, desc, k_off, kPlan.q_hi, kPlan.q_lo);
      transpose_v_in_place(vs, ldsm_off, stsm_off);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < kSHalves; ++h) fence_regs(s[h]);

    // ---- Scale, soft-cap, mask ----
    const bool bad_tile = T::kChecked && bad_item[item % (T::kStages + 1)] == item;
    const bool need_mask = tile_needs_mask<T>(p, u, tile_t0, bad_tile, causal_start, seq_len);
    scale_mask_tile<T, kSHalves, kAcc, kPadWarps>(p, s, row_scale, u, tile_t0, need_mask, bad_tile, causal_start,
                                                  row0, rows_total, batch, page_row, w, l);

    // ---- Online softmax down the tokens: column maxima across lanes, then across the warps ----
    float mx[T::kCols];
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) mx[cc] = kNegInf;
#pragma unroll
    for (int h = 0; h < kSHalves; ++h) {
#pragma unroll
      for (int e = 0; e < kAcc; ++e) {
        const int cc = 2 * (e >> 2) + (e & 1);
        mx[cc] = fmaxf(mx[cc], s[h][e]);
      }
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
    __syncthreads();  // red complete
    // Per query row (column cc): the new max, P = 2^(x - m + 8) (times 256: e4m3's range) as two
    // e4m3 terms stored as the B operand (query rows of token bytes in PV's token order), the
    // row's sum and O rescaled. One column at a time keeps no per-column arrays live.
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) {
      const int r = col_row(cc);
      const float m_tile = fmaxf(fmaxf(red[r], red[N + r]), fmaxf(red[2 * N + r], red[3 * N + r]));
      const float m_new = fmaxf(m_run[cc], m_tile);
      // A row that has seen nothing keeps m = -inf; subtracting 0 keeps exp2 at 0, not NaN.
      const float m_use = m_new == kNegInf ? 0.f : m_new;
      const float alpha = ptx::ex2(m_run[cc] - m_use);
      m_run[cc] = m_new;
      const float shift = m_use - 8.f;
      const int e0 = 4 * (cc >> 1) + (cc & 1);  // elements e0 (token +0) and e0 + 2 (token +8)
      float pr[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int h = 0; h < kSHalves; ++h) {
        pr[2 * h] = ptx::ex2(s[h][e0] - shift);
        pr[2 * h + 1] = ptx::ex2(s[h][e0 + 2] - shift);
      }
      l_run[cc] = l_run[cc] * alpha + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
      store_p_row<T>(base + kPlan.p_hi, base + kPlan.p_lo, r, pr, w, l, p_pos, p_sel);
#pragma unroll
      for (int m = 0; m < kHalves; ++m) o[m][e0] *= alpha, o[m][e0 + 2] *= alpha;
    }
    fence_proxy_async_smem();  // P and V^T, to the wgmma
    __syncthreads();

    // O^T += V^T (P_hi + P_lo)^T: 2 halves of d x 4 k-steps of 32 tokens x 2 terms, into a fresh
    // accumulator per tile that is added to O in fp32. Hopper's fp8 wgmma keeps only ~14 bits
    // when it accumulates (DeepSeek-V3 report, "FP8 GEMM accumulation precision"): carried over
    // a whole sequence in the tensor core, O drifted by 0.3 % relative RMS at 4096 tokens.
    // 16-bit: O^T += V^T P^T straight into O (rescaled above), V read MN-major.
    if constexpr (T::k16) {
      pv_chain_16bit<T, N>(o, desc, v_off, kPlan.p_hi);
      wgmma_wait<0>();
#pragma unroll
      for (int m = 0; m < kHalves; ++m) fence_regs(o[m]);
    } else {
      float ot[kHalves][kAcc];
      two_term_chain<Mma>(ot, desc, v_off, kPlan.p_hi, kPlan.p_lo);
      wgmma_wait<0>();
#pragma unroll
      for (int m = 0; m < kHalves; ++m) {
        fence_regs(ot[m]);
#pragma unroll
        for (int e = 0; e < kAcc; ++e) o[m][e] += ot[m][e];
      }
    }
  }

  // ---- The rows into the epilogue's merge area (one slice: kWarpsN = 1), which reuses the
  // stages: every one is free once the ring is drained ----
  stamp(kStampLastPv);  // the stamp build only: the last tile's PV waited for
  ptx::cp_async_wait<0>();
  finish_rows_on_n<T>(p, smem, red, l, w, m_run, l_run, o, c, row0, rows_total, batch, kv_head, v_scale);
}

}  // namespace deca::gqa::sm90
