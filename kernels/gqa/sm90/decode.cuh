// Hopper (sm_90a) GQA decode for an fp8 (e4m3) KV cache on the e4m3 wgmma (docs/design-gqa-sm90.md,
// issue 8). One CTA = one warpgroup = (request, kv head, block of up to 64 query rows, split of
// the keys), as the portable kernel (decode.cuh) whose host side, split policy and epilogue it
// shares; or, under the balanced schedule (Cfg::kBalanced, balance.cuh, a knob), one share of the
// whole batch's tiles, unit after unit. Per 128-token tile:
//
//   S^T [128 tokens x N rows] = K . (q_hi + q_lo)^T      tokens on M (two m64 halves), rows on N
//   online softmax down the tokens (a row is a column of S^T: a max across the four warps)
//   O^T [128 d x N]          += V^T . (P_hi + P_lo)^T     d on M, the tile's tokens on K
//
// K and V stay as stored (e4m3); q (once per CTA) and the softmax weights P (per tile) are split
// into two e4m3 terms each (issue 8's two-term products: 0.1-0.2 % relative RMS where e4m3 q and P
// alone cost 3.5-5 %), the fp32 accumulators take both terms. 8-bit wgmma operands must be K-major,
// so V is transposed in shared memory once per tile (4 x 4 byte blocks through prmt, in place).
// Loads: all 128 threads copy 16-byte chunks with cp.async into a ring of kStages stages, each
// chunk where the 128-byte swizzle of the wgmma descriptors puts it; page ids are read a tile
// ahead. The merge of the CTA's rows, the output, LSE, sinks and split-KV are the portable
// kernel's (epilogue.cuh); O comes out times 256 (P's scale) and the max reported 8 lower, the
// same convention as the portable kernel's two-term path.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/cta_scan.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/balance.cuh"
#include "kernels/gqa/sm90/cta.cuh"
#include "kernels/gqa/sm90/q_tile.cuh"
#include "kernels/gqa/sm90/tile_loader.cuh"
#include "kernels/gqa/sm90/tile_ops.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {

using namespace ::deca::sm90;

// S^T = K (q_hi + q_lo)^T for the m64 token halves h0 .. of the K tile at byte offset k_off: 4
// k-steps of 32 dims x 2 terms per half, one wgmma group, not waited for. desc(offset) gives the
// descriptor of an operand at that offset from the shared base.
template <class Mma, int H, int A, class Desc, class Plan>
__device__ __forceinline__ void qk_chain(float (&s)[H][A], const Desc& desc, unsigned k_off,
                                         const Plan& plan, int h0) {
  wgmma_fence();
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long da = desc(k_off + 8192 * (h0 + h) + 32 * kk);
      Mma::mma(s[h], da, desc(plan.q_hi + 32 * kk), kk > 0);
      Mma::mma(s[h], da, desc(plan.q_lo + 32 * kk), true);
    }
  }
  wgmma_commit();
}

// The balanced schedule's pieces of a unit (balance.cuh): CTA first_cta + j holds piece j, in its
// slot 2 c or 2 c + 1; the merge takes them `chunk` at a time.
struct BalancedPieces {
  static constexpr bool kChunked = true;
  int count;
  int index;
  long long unit;  // arrival counter: request x kv heads + kv head
  int first_cta;
  int ctas;
  int pos;
  int total;
  int chunk;
  __device__ __forceinline__ long long slot(int j) const { return piece_slot(first_cta + j, pos, ctas, total); }
};

// This CTA's share of the balanced schedule's line.
struct Share {
  int total;  // positions on the line
  int ctas;   // CTAs taking part
  int b, e;   // the share [b, e)
  Unit first;       // the unit b lies in
};

// The line's length from every request's length (a scan over the CTA's threads, each summing a
// contiguous run of requests), the share, and the unit it starts in. `words`: 6 ints of shared
// memory (the scan's warp totals, then the unit's request and position). False for a CTA past the ones taking part (a small batch).
template <class T, class Fill>
__device__ __forceinline__ bool balanced_share(const GqaParams& p, int* words, Share& sh,
                                               const Fill& fill) {
  const int tid = threadIdx.x;
  const int batch = p.batch;
  auto cost = [&](int r) {
    const int len = load_seq_len<T>(p, r);
    return p.num_kv_heads * (kUnitCost + unit_tiles(first_visible_key<T>(p, len), len, T::kTile));
  };
  const int per = (batch + T::kThreads - 1) / T::kThreads;
  const int lo = tid * per < batch ? tid * per : batch;
  const int hi = lo + per < batch ? lo + per : batch;
  int mine = 0;
  for (int r = lo; r < hi; ++r) mine += cost(r);
  const CtaScan scan = cta_exclusive_scan<T::kThreads>(mine, words);
  const int total = scan.total;
  const int ctas = active_ctas(static_cast<int>(gridDim.x), total);
  const int c = static_cast<int>(blockIdx.x);
  if (c >= ctas) return false;  // the whole CTA
  sh.total = total;
  sh.ctas = ctas;
  sh.b = share_begin(c, ctas, total);
  sh.e = share_begin(c + 1, ctas, total);
  int at = scan.before;  // the first position of request lo
  if (at <= sh.b && sh.b < at + mine) {
    for (int r = lo; r < hi; ++r) {
      const int cr = cost(r);
      if (sh.b < at + cr) {
        words[4] = r;
        words[5] = at;
        break;
      }
      at += cr;
    }
  }
  __syncthreads();
  Unit u{};
  u.request = words[4];
  fill(u);
  const int per_unit = kUnitCost + u.tiles;
  u.kv_head = (sh.b - words[5]) / per_unit;
  u.pos = words[5] + u.kv_head * per_unit;
  sh.first = u;
  __syncthreads();  // words read by all (they live in the softmax's reduction area)
  return true;
}

template <class Cfg>
__device__ __forceinline__ void gqa_decode_kernel(const GqaParams& p, unsigned char* smem_raw) {
  using T = Traits<Cfg>;
  constexpr int N = T::kRows;
  constexpr int kAcc = N / 2;  // accumulator floats per thread per m64 tile
  constexpr SmemPlan kPlan = T::kPlan;
  using Mma = WgmmaE4m3<N>;
  constexpr bool kBalanced = T::kBalanced;

  // Two warpgroups (Cfg::kWarpgroups = 2): warpgroup wg takes m64 half wg of the tile's tokens in
  // S^T and of d in O^T, both share the softmax (max across all 8 warps) and P; one warpgroup
  // takes both halves.
  constexpr int kWG = T::kWarpgroups;
  constexpr int kHalves = 2 / kWG;  // m64 halves per warpgroup
  constexpr int kWarps = 4 * kWG;
  constexpr int kIters = 8 / kWG;   // transpose iterations per thread
  const int tid = threadIdx.x;
  const int wg = kWG == 1 ? 0 : tid >> 7;
  const int w = kWG == 1 ? tid >> 5 : (tid >> 5) & 3;  // warp in the warpgroup
  const int gw = kWG == 1 ? w : tid >> 5;             // warp in the CTA
  const int l = tid & 31;
  const int q_len = p.q_len;
  const int rows_total = q_len * T::kGroup;
  const int heads = p.num_kv_heads;
  int* bad_item = checked_ring_items<T>();
  const CtaSmem cs(smem_raw);  // cta.cuh
  const unsigned base = cs.base;
  unsigned char* smem = cs.smem;
  float* red = reinterpret_cast<float*>(smem + kPlan.red);      // [4 warps][N]
  float* q_inv = reinterpret_cast<float*>(smem + kPlan.q_inv);  // [N]
  auto desc = [&](unsigned offset) { return cs.desc(offset); };

  // ---- Schedule: the units (request, kv head) and tiles this CTA computes ----
  // Split-KV (and no split): one unit, the keys of split blockIdx.x. Balanced (balance.cuh): the
  // units and tiles of this CTA's share of the whole batch's line.
  auto fill = [&](Unit& u) {
    u.seq_len = load_seq_len<T>(p, u.request);
    u.first = first_visible_key<T>(p, u.seq_len);
    u.end = u.seq_len;
    u.tiles = unit_tiles(u.first, u.seq_len, kTile);
  };
  int row_blocks = 1, row_block = 0, split = 0;
  Share sh{};
  Unit unit0{};
  if constexpr (kBalanced) {
    if (!balanced_share<T>(p, reinterpret_cast<int*>(red), sh, fill)) return;
    unit0 = sh.first;
  } else {
    SplitCta c;
    if (!split_cta<T>(p, N, c)) return;
    unit0 = c.unit;
    row_blocks = c.row_blocks, row_block = c.row_block, split = c.split;
  }
  const int row0 = row_block * N;

  // ---- Loader (tile_loader.cuh): K and V tiles in token order ----
  TileLoader<T> loader(p, bad_item, tid);
  auto page_row_of = [&](int request) { return loader.page_row_of(request); };
  auto fetch_pages = [&](const TileCursor& c, int item) { loader.fetch_pages(c, item); };
  auto issue_tile = [&](const TileCursor& c, int stage) { loader.issue_tile(c, cs.k_stage(stage), cs.v_stage(stage)); };
  // The loader's cursor: the next tile to issue, whose page ids pages_next holds; `pend_item` is
  // its index in the ring (tile g of the CTA goes to stage g % kStages).
  TileCursor pend;
  if constexpr (kBalanced) {
    pend = first_tile(unit0, sh.b, sh.e, heads, p.batch, fill);
  } else {
    pend = TileCursor{unit0, 0, unit0.tiles, unit0.tiles <= 0};
  }
  int pend_item = 0;
  // Issues the pending tile (nothing past the CTA's last: an empty group keeps the count), moves
  // the cursor on and fetches the next one's page ids.
  auto issue_next = [&] {
    if (!pend.done) issue_tile(pend, pend_item % T::kStages);
    ptx::cp_async_commit();
    if constexpr (kBalanced) {
      next_tile(pend, sh.e, heads, p.batch, fill);
    } else {
      ++pend.i;
      pend.done = pend.i >= pend.hi;
    }
    ++pend_item;
    fetch_pages(pend, pend_item);
  };

  // ---- Per-thread accumulator coordinates ----
  // S^T element e of m64 half h: token 64 h + 16 w + l / 4 + 8 ((e >> 1) & 1), column (query row)
  // 8 (e / 4) + 2 (l % 4) + (e & 1); column index cc = 2 (e / 4) + (e & 1) of this thread's kCols.
  // O^T element e of d half m: d 64 m + 16 w + l / 4 + 8 ((e >> 1) & 1), same columns.
  auto col_row = [&](int cc) { return 8 * (cc >> 1) + 2 * (l & 3) + (cc & 1); };
  // One warpgroup up to 32 rows: V transposed by ldmatrix.trans + prmt + stmatrix (layout.cuh, as
  // the rows-on-M kernel), in place: V^T's token positions in rows_on_m_a_token order and its rows
  // in rows_on_m_d order, which P^T's stores and the epilogue follow. Warp w takes token blocks
  // 2 w, 2 w + 1 of the four d blocks; 8 ldmatrix, 32 prmt and 8 stmatrix per warp and tile. (At
  // 64 rows, a knob since the rows-on-M kernel took them, its 32 registers held across the
  // in-place barrier would spill.)
  constexpr bool kLdsmV = kWG == 1 && N <= 32;
  unsigned ldsm_off[kLdsmV ? 4 : 1], stsm_off[kLdsmV ? 2 : 1];
  if constexpr (kLdsmV) {
#pragma unroll
    for (int i = 0; i < 4; ++i) ldsm_off[i] = 4096u * w + rows_on_m_ldsm_offset(l, i);
#pragma unroll
    for (int i = 0; i < 2; ++i) stsm_off[i] = rows_on_m_stsm_offset(l, 2 * w + i);
  }
  // Two warpgroups: the 4 x 4 byte blocks (transpose_block; offsets: layout.cuh's
  // transpose_read/write_offset). Kept in registers up to 32 rows; at 64 rows recomputed per tile
  // (a few logic ops each), where the 16 registers would spill.
  constexpr bool kKeepOffsets = N <= 32 && !kLdsmV;
  // Warpgroup wg takes iterations wg * kIters .. of its warps' eight.
  unsigned v_read_r[kKeepOffsets ? kIters : 1], v_write_r[kKeepOffsets ? kIters : 1];
  auto v_read = [&](int i) { return transpose_read_offset(w, wg * kIters + i, l); };
  auto v_write = [&](int i) { return transpose_write_offset(w, wg * kIters + i, l); };
#pragma unroll
  for (int i = 0; i < (kKeepOffsets ? kIters : 1); ++i) v_read_r[i] = v_read(i), v_write_r[i] = v_write(i);
  // This thread's P^T bytes in a row. One warpgroup: its tokens 16 w + l / 4 (+ 8) of each half
  // sit at A positions 4 (l / 8) + (l / 4) % 2 (+ 2) of token block w (+ 4); lanes l and l ^ 4
  // swap one term word, and the even one stores the first half's four bytes, the odd one the
  // second's. Two warpgroups: four bytes per quad of the old order, two of them its half's (byte
  // 2 wg + e).
  const unsigned p_pos = kLdsmV ? 16 * (4 * ((l >> 2) & 1) + w) + 4 * (l >> 3) : 4 * (8 * w + (l >> 2)) + 2 * wg;
  const unsigned p_sel = ((l >> 2) & 1) ? 0x3726u : 0x5140u;

  // Overlapped QK (Cfg::kOverlapQk, a knob): the next tile's S^T is issued right after this
  // tile's maxima, so its wgmma chain runs under this tile's softmax and PV; every stage is
  // filled up front, and a stage is refilled at the end of the tile that used it.
  constexpr bool kOverlap = T::kOverlapQk;
  float s_next[kOverlap ? kHalves : 1][kOverlap ? kAcc : 1];  // the next tile's S^T, in flight

  // ---- Prologue: kStages - 1 tiles in flight (all kStages when overlapped) ----
  fetch_pages(pend, 0);
#pragma unroll
  for (int s = 0; s < T::kStages - (kOverlap ? 0 : 1); ++s) issue_next();

  // ---- Units: the CTA's one (split-KV) or its share's (balanced), each with its q, its tiles and
  // its epilogue; the ring runs on across units ----
  int item = 0;  // tiles computed so far: the ring's index
  Unit u = unit0;
  for (;;) {
    const int batch = u.request;
    const int kv_head = u.kv_head;
    const int seq_len = u.seq_len;
    const int* page_row = page_row_of(batch);
    const int tile_lo = kBalanced ? share_tile_lo(u.pos, u.tiles, sh.b) : 0;
    const int tile_hi = kBalanced ? share_tile_hi(u.pos, u.tiles, sh.e) : u.tiles;
    const float k_scale = p.k_scales ? p.k_scales[kv_head] : p.k_scale;
    const float v_scale = p.v_scales ? p.v_scales[kv_head] : p.v_scale;
    const float qk_scale = p.softmax_scale * k_scale;

    // ---- q: rows scaled by a power of two each into [128, 256), split into two e4m3 terms ----
    load_q_two_term<T, N>(p, batch, kv_head, row0, rows_total, base + kPlan.q_hi, base + kPlan.q_lo,
                          q_inv, [](int m) { return m; });
    __syncthreads();  // q_inv written
    // Logit scale of column cc (log2 units, the row's q scale undone): in registers up to 16 rows;
    // with 32 or 64 rows read from shared memory per tile, which keeps 64 rows free of spills.
    constexpr bool kScaleRegs = T::kCols <= 4;
    const float logit_scale = T::kSoftcap ? qk_scale : qk_scale * kLog2e;
    float row_scale_r[kScaleRegs ? T::kCols : 1];
#pragma unroll
    for (int cc = 0; cc < (kScaleRegs ? T::kCols : 1); ++cc) row_scale_r[cc] = logit_scale * q_inv[col_row(cc)];
    auto row_scale = [&](int cc) { return kScaleRegs ? row_scale_r[cc] : logit_scale * q_inv[col_row(cc)]; };
    float m_run[T::kCols], l_run[T::kCols];
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) m_run[cc] = kNegInf, l_run[cc] = 0.f;
    float o[kHalves][kAcc];  // O^T of d half wg * kHalves + m
#pragma unroll
    for (int m = 0; m < kHalves; ++m) {
#pragma unroll
      for (int e = 0; e < kAcc; ++e) o[m][e] = 0.f;
    }
    const int causal_start = seq_len - q_len;  // keys below are visible to every row (window aside)

    if constexpr (kOverlap) {
      if (tile_hi > tile_lo) {
        ptx::cp_async_wait<T::kStages - 1>();  // the unit's first tile
        fence_proxy_async_smem();
        __syncthreads();
        qk_chain<Mma>(s_next, desc, (item % T::kStages) * 2u * kStageBytes, kPlan, wg * kHalves);
      }
    }

    for (int i_tile = tile_lo; i_tile < tile_hi; ++i_tile, ++item) {
      if constexpr (!kOverlap) {
        ptx::cp_async_wait<T::kStages - 2>();
        fence_proxy_async_smem();  // this thread's landed chunks, to the wgmma (async proxy) readers
        __syncthreads();           // tile `item` landed for all; stage (item - 1) % kStages is free
        issue_next();              // tile item + kStages - 1
      }
      const int stage = item % T::kStages;
      const unsigned k_off = stage * 2 * kStageBytes;  // from the base
      const unsigned v_off = k_off + kStageBytes;
      const unsigned vs = base + v_off;
      const int tile_t0 = u.first + i_tile * kTile;

      // S^T = K (q_hi + q_lo)^T (2 halves x 4 k-steps of 32 dims x 2 terms) and V -> V^T in place.
      // The transpose runs while the tensor cores work, except at 64 rows, where the S^T registers
      // in flight and the transpose's 32 would not fit beside O^T without spilling.
      float s[kHalves][kAcc];  // S^T of token half wg * kHalves + h
      auto issue_qk = [&] { qk_chain<Mma>(s, desc, k_off, kPlan, wg * kHalves); };
      auto transpose_v = [&] {
        if constexpr (kLdsmV) {
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
          return;
        }
        unsigned vw[kIters][4];
  #pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const unsigned a = vs + (kKeepOffsets ? v_read_r[i] : v_read(i));
  #pragma unroll
          for (int j = 0; j < 4; ++j) vw[i][j] = ptx::lds32(a + 1024u * (j & 1) + 8192u * (j >> 1));
        }
        __syncthreads();
  #pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const unsigned a = vs + (kKeepOffsets ? v_write_r[i] : v_write(i));
          unsigned cols[4];
          transpose4x4(vw[i], cols);
  #pragma unroll
          for (int j = 0; j < 4; ++j) sts32((a ^ (16u * j)) + 128u * j, cols[j]);
        }
      };
      if constexpr (kOverlap) {
        transpose_v();  // this tile's S^T is in flight since the last tile (or the prologue)
        wgmma_wait<0>();
  #pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          fence_regs(s_next[h]);
  #pragma unroll
          for (int e = 0; e < kAcc; ++e) s[h][e] = s_next[h][e];
        }
      } else if constexpr (N < 64) {
        issue_qk();
        transpose_v();
      } else {
        transpose_v();
        issue_qk();
      }
      wgmma_wait<0>();
  #pragma unroll
      for (int h = 0; h < kHalves; ++h) fence_regs(s[h]);

      // ---- Scale, soft-cap, mask ----
      const bool bad_tile = T::kChecked && bad_item[item % (T::kStages + 1)] == item;
      const bool need_mask = tile_t0 + kTile > causal_start || tile_t0 + kTile > u.end ||
                             (T::kWindow && tile_t0 < seq_len - p.window) || bad_tile;
  #pragma unroll
      for (int h = 0; h < kHalves; ++h) {
  #pragma unroll
        for (int e = 0; e < kAcc; ++e) {
          const int cc = 2 * (e >> 2) + (e & 1);
          float x = s[h][e];
          if constexpr (T::kSoftcap) {
            x = p.softcap * tanhf(x * row_scale(cc) / p.softcap) * kLog2e;
          } else {
            x *= row_scale(cc);
          }
          if (need_mask) {
            const int t = tile_t0 + 64 * (wg * kHalves + h) + 16 * w + (l >> 2) + 8 * ((e >> 1) & 1);
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
          s[h][e] = x;
        }
      }

      // ---- Online softmax down the tokens: column maxima across lanes, then across the warps ----
      float mx[T::kCols];
  #pragma unroll
      for (int cc = 0; cc < T::kCols; ++cc) mx[cc] = kNegInf;
  #pragma unroll
      for (int h = 0; h < kHalves; ++h) {
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
        for (int cc = 0; cc < T::kCols; ++cc) red[gw * N + col_row(cc)] = mx[cc];
      }
      if constexpr (kOverlap) {
        if (i_tile + 1 < tile_hi) {
          ptx::cp_async_wait<T::kStages - 2>();  // tile item + 1 (the prologue committed kStages)
          fence_proxy_async_smem();
        }
      }
      __syncthreads();  // red complete (overlapped: tile item + 1 landed for all too)
      if constexpr (kOverlap) {
        if (i_tile + 1 < tile_hi) {
          qk_chain<Mma>(s_next, desc, ((item + 1) % T::kStages) * 2u * kStageBytes, kPlan, wg * kHalves);
        }
      }
      // Per query row (column cc): the new max, P = 2^(x - m + 8) (times 256: e4m3's range) as two
      // e4m3 terms stored as the B operand (query rows of token bytes in PV's token order,
      // quad_token: byte i of a term = tokens + 0, 8, 64, 72), the row's sum and O rescaled. One
      // column at a time keeps no per-column arrays live (64 rows stay free of spills).
  #pragma unroll
      for (int cc = 0; cc < T::kCols; ++cc) {
        const int r = col_row(cc);
        float m_tile = fmaxf(fmaxf(red[r], red[N + r]), fmaxf(red[2 * N + r], red[3 * N + r]));
        if constexpr (kWG == 2) {
          m_tile = fmaxf(m_tile, fmaxf(fmaxf(red[4 * N + r], red[5 * N + r]), fmaxf(red[6 * N + r], red[7 * N + r])));
        }
        const float m_new = fmaxf(m_run[cc], m_tile);
        // A row that has seen nothing keeps m = -inf; subtracting 0 keeps exp2 at 0, not NaN.
        const float m_use = m_new == kNegInf ? 0.f : m_new;
        const float alpha = ptx::ex2(m_run[cc] - m_use);
        m_run[cc] = m_new;
        const float shift = m_use - 8.f;
        const int e0 = 4 * (cc >> 1) + (cc & 1);  // elements e0 (token +0) and e0 + 2 (token +8)
        float pr[4] = {0.f, 0.f, 0.f, 0.f};
  #pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          pr[2 * h] = ptx::ex2(s[h][e0] - shift);
          pr[2 * h + 1] = ptx::ex2(s[h][e0 + 2] - shift);
        }
        l_run[cc] = l_run[cc] * alpha + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
        unsigned hi, lo;
        kv::split_e4m3_f32(pr[0], pr[1], pr[2], pr[3], hi, lo);
        if constexpr (kLdsmV) {
          const unsigned hi_pair = __shfl_xor_sync(0xffffffffu, hi, 4);
          const unsigned lo_pair = __shfl_xor_sync(0xffffffffu, lo, 4);
          sts32(base + kPlan.p_hi + swz128(r, p_pos), ptx::prmt(hi, hi_pair, p_sel));
          sts32(base + kPlan.p_lo + swz128(r, p_pos), ptx::prmt(lo, lo_pair, p_sel));
        } else if constexpr (kWG == 1) {
          sts32(base + kPlan.p_hi + swz128(r, p_pos), hi);
          sts32(base + kPlan.p_lo + swz128(r, p_pos), lo);
        } else {
          sts16(base + kPlan.p_hi + swz128(r, p_pos), hi & 0xFFFFu);
          sts16(base + kPlan.p_lo + swz128(r, p_pos), lo & 0xFFFFu);
        }
  #pragma unroll
        for (int m = 0; m < kHalves; ++m) o[m][e0] *= alpha, o[m][e0 + 2] *= alpha;
      }
      fence_proxy_async_smem();  // P and V^T, to the wgmma
      __syncthreads();

      // O^T += V^T (P_hi + P_lo)^T: 2 halves of d x 4 k-steps of 32 tokens x 2 terms, into a fresh
      // accumulator per tile that is added to O in fp32. Hopper's fp8 wgmma keeps only ~14 bits
      // when it accumulates (DeepSeek-V3 report, "FP8 GEMM accumulation precision"): carried over
      // a whole sequence in the tensor core, O drifted by 0.3 % relative RMS at 4096 tokens.
      // At 64 rows the two halves go one after the other (the temporaries of both would spill).
      constexpr int kHalvesInFlight = N < 64 ? kHalves : 1;
  #pragma unroll
      for (int m0 = 0; m0 < kHalves; m0 += kHalvesInFlight) {
        float ot[kHalvesInFlight][kAcc];
        wgmma_fence();
  #pragma unroll
        for (int mh = 0; mh < kHalvesInFlight; ++mh) {
  #pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const unsigned long long da = desc(v_off + 8192 * (wg * kHalves + m0 + mh) + 32 * kk);
            Mma::mma(ot[mh], da, desc(kPlan.p_hi + 32 * kk), kk > 0);
            Mma::mma(ot[mh], da, desc(kPlan.p_lo + 32 * kk), true);
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
  #pragma unroll
        for (int mh = 0; mh < kHalvesInFlight; ++mh) {
          fence_regs(ot[mh]);
  #pragma unroll
          for (int e = 0; e < kAcc; ++e) o[m0 + mh][e] += ot[mh][e];
        }
      }
      if constexpr (kOverlap) {
        __syncthreads();  // every warp's PV of this tile is done: its stage is free
        issue_next();     // tile item + kStages
      }
    }

    // ---- The unit's rows into the epilogue's merge area (one slice: kWarpsN = 1) ----
    // Split-KV: every stage is free once the ring is drained; the area starts at the base.
    // Balanced: the next units' tiles are in flight in kStages - 1 stages; the last computed
    // tile's stage, (item - 1) % kStages, is free until the next tile is issued (after the next
    // barrier at the top of a tile), and the area and the merge's staging fit in it.
    if constexpr (!kBalanced) ptx::cp_async_wait<0>();
#pragma unroll
    for (int cc = 0; cc < T::kCols; ++cc) {
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) l_run[cc] += __shfl_xor_sync(0xffffffffu, l_run[cc], m);
    }
    __syncthreads();  // the last tile's readers are done with its stage and red
    if (l < 4) {
#pragma unroll
      for (int cc = 0; cc < T::kCols; ++cc) red[gw * N + col_row(cc)] = l_run[cc];
    }
    unsigned char* merge = kBalanced ? smem + ((item + T::kStages - 1) % T::kStages) * 2 * kStageBytes : smem;
    const MergeArea<T> area(merge);
#pragma unroll
    for (int m = 0; m < kHalves; ++m) {
#pragma unroll
      for (int e = 0; e < kAcc; ++e) {
        const int n = 64 * (wg * kHalves + m) + 16 * w + (l >> 2) + 8 * ((e >> 1) & 1);  // V^T's row
        const int d = kLdsmV ? rows_on_m_d(n) : n;
        area.o[col_row(2 * (e >> 2) + (e & 1)) * kDim + d] = o[m][e];
      }
    }
    __syncthreads();
    if (gw == 0 && l < 4) {
#pragma unroll
      for (int cc = 0; cc < T::kCols; ++cc) {
        const int r = col_row(cc);
        area.ml[2 * r] = m_run[cc] - 8.f;  // P's scale, see above
        float sum = red[r] + red[N + r] + red[2 * N + r] + red[3 * N + r];
        if constexpr (kWG == 2) sum += red[4 * N + r] + red[5 * N + r] + red[6 * N + r] + red[7 * N + r];
        area.ml[2 * r + 1] = sum;
      }
    }
    __syncthreads();
    const CtaRows cta{batch, batch, kv_head, row_blocks, row_block, split, row0, rows_total, rows_total};
    if constexpr (kBalanced) {
      const UnitPieces up = unit_pieces(u.pos, u.tiles, sh.ctas, sh.total);
      // Staging room of the merge in the stage: 2 kRows chunk + kRows (kDim + 1) floats.
      constexpr int kChunk = (2 * kStageBytes / 4 - N * (kDim + 1)) / (2 * N);
      const BalancedPieces pieces{up.count, static_cast<int>(blockIdx.x) - up.first_cta,
                                  static_cast<long long>(batch) * heads + kv_head, up.first_cta, sh.ctas,
                                  u.pos, sh.total, kChunk};
      finish_cta<T>(p, merge, cta, v_scale, pieces);
      next_unit(u, heads, p.batch, fill);
      if (u.pos >= sh.e) break;
    } else {
      finish_cta<T>(p, smem, cta, v_scale);
      break;
    }
  }
}

}  // namespace deca::gqa::sm90
