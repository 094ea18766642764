// The consumers of the sm90a MLA sparse decode kernel at 16 heads or fewer (Cfg::kNarrow = 1),
// with the heads on N = 16 throughout: consumer 0 computes S^T = K Q^T (the block's 64 tokens on
// M), the online softmax down the columns and P stored transposed into the P slot; both then
// compute O^T = V^T P^T for their 256 of the 512 columns (A = the tile read MN-major: four
// 64-column m-blocks, B = P^T), 32 accumulators each instead of 64 padded rows' 128. The
// pipeline's hand-overs (p_ready / p_free, out_ready / out_free, the factors in row_scale and
// out_scale indexed by head) are the wide consumers'.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/knobs.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/stamps.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// The column softmax's exchange area: the Q tile's chunk 0 rows 16..63, which 16 heads leave
// unused (load_q writes rows 0..15, the wgmma reads no other as N = 16, the staged records of
// Cfg::kStage begin at chunk 1). Block maxima per head and warp (two buffers, by block parity)
// and a request's sums per head and warp.
constexpr int kNarrowHeads = 16;
constexpr unsigned kNarrowMax = kStageRows * 128;                      // float[2][16 heads][4 warps]
constexpr unsigned kNarrowSum = kNarrowMax + 2 * kNarrowHeads * 4 * 4;  // float[16][4]
static_assert(kNarrowSum + kNarrowHeads * 4 * 4 <= kChunkBytes, "in chunk 0's free rows");

// The transposed P's lane address for stmatrix .trans: the warp's 16 tokens x 16 heads are four
// 8 x 8 matrices m = (tokens 8 (m % 2) .., heads 8 (m / 2) ..) of the accumulator, each stored as
// 8 rows (heads) of 8 tokens (16 bytes at unit 2 w + m % 2 of the head's 128-byte row); lane l
// gives row l % 8 of matrix l / 8.
DECA_HD constexpr unsigned narrow_p_offset(int warp, int lane) {
  return swz(8 * (lane >> 4) + (lane & 7), 2 * warp + ((lane >> 3) & 1));
}

// O^T[col0 .. col0 + 255, heads] += V^T P^T, issued and committed: m-block mb is the tile's
// chunk col0 / 64 + mb read MN-major (64 columns on M; k step kk = tokens 16 kk .., two 8-row
// groups 1024 B apart, at byte 2048 kk), B = P^T (the P slot's 16 head rows, K-major; k step kk at
// byte 32 kk). o[8 mb ..] is m-block mb's m64n16 accumulator.
__device__ __forceinline__ void issue_pv_narrow(float (&o)[32], unsigned tile, int col0, unsigned p_slot) {
  wgmma_fence();
  const unsigned long long dp = smem_desc_sw128(p_slot, 16, 1024);
#pragma unroll
  for (int mb = 0; mb < 4; ++mb) {
    const unsigned long long dv = smem_desc_sw128(tile + (col0 / 64 + mb) * kChunkBytes, kChunkBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_m64n16k16_ss<0, 1>(o + 8 * mb, desc_advance(dv, 2048 * kk), desc_advance(dp, 32 * kk), true);
    }
  }
  wgmma_commit();
}

// An m64n16 accumulator register k's head among the thread's four (hA, hA + 1, hA + 8, hA + 9):
// columns 2 (l % 4) + k % 2 of n8 block (k % 8) / 4; rows r0, r0 + 8 alternate in pairs.
__device__ __forceinline__ constexpr int narrow_head_of(int k) { return (k & 1) + 2 * ((k >> 2) & 1); }

// O^T *= the factor of each head (column), unless every factor of the warp's is 1.
__device__ __forceinline__ void rescale_narrow(float (&o)[32], const float (&a)[4]) {
  if (__all_sync(0xffffffffu, a[0] == 1.f && a[1] == 1.f && a[2] == 1.f && a[3] == 1.f)) return;
#pragma unroll
  for (int k = 0; k < 32; ++k) o[k] *= a[narrow_head_of(k)];
}

// Writes this warpgroup's O^T (columns col0 + 64 mb + r0 and + 8 of heads hA.. for each m-block)
// scaled per head, for real heads: lanes l and l ^ 4 hold adjacent columns of the same head, so
// the even one writes both (4-byte bf16 pairs, 8-byte fp32 pairs for a split piece's partial).
__device__ __forceinline__ void store_o_narrow(const DecodeKernelParams& kp, const Piece& pc, int r, int tok,
                                               int r0, int hA, int col0, const float (&o)[32], const float (&f)[4]) {
  const MlaSparseParams& p = kp.p;
  const bool even = ((r0 & 1) == 0);
#pragma unroll
  for (int k = 0; k < 32; ++k) {
    const int i = narrow_head_of(k);
    const float v = o[k] * f[i];
    const float next = __shfl_xor_sync(0xffffffffu, v, 4);
    const int head = hA + (k & 1) + 8 * ((k >> 2) & 1);
    const int col = col0 + 64 * (k >> 3) + r0 + 8 * ((k >> 1) & 1);
    if (!even || head >= p.num_heads) continue;
    if (pc.split) {
      float* dst = kp.run.partial_o + ((static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head) * kDimV + col;
      *reinterpret_cast<float2*>(dst) = make_float2(v, next);
    } else {
      unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch + tok * p.out_stride_token +
                            head * p.out_stride_head + col;
      *reinterpret_cast<unsigned*>(dst) = f32x2_to_bf16x2(v, next);
    }
  }
}

// A request's sum per head for the thread's four heads (columns hA, hA + 1, hA + 8, hA + 9) from
// the per-thread shares `l`: over the eight lanes sharing each column, then over the warpgroup's
// four warps through `xsum` (float[16 heads][4 warps]) and one barrier `bar` of its 128 threads.
__device__ __forceinline__ void head_sums(float (&l)[4], float* xsum, const int (&heads)[4], int warp, int lane,
                                          int bar) {
#pragma unroll
  for (int x = 4; x < 32; x *= 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) l[i] += __shfl_xor_sync(0xffffffffu, l[i], x);
  }
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) xsum[heads[i] * 4 + warp] = l[i];
  }
  named_bar_sync(bar, 128);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = *reinterpret_cast<const float4*>(xsum + heads[i] * 4);
    l[i] = (v.x + v.y) + (v.z + v.w);
  }
}

template <class Cfg>
__device__ __forceinline__ void consumer0_narrow(const DecodeKernelParams& kp, const SparsePart& part,
                                                 int tok, int head0, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  constexpr int kRescale = RescaleOf<Cfg>::value;
  static_assert(kCl == 1, "Cfg::kNarrow: one head block");
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x;
  const int warp = t >> 5, lane = t & 31;
  // Accumulator rows r0, r0 + 8: tokens of the block in S^T, output columns (+ 64 per m-block)
  // in O^T; columns: heads hA, hA + 1, hA + 8, hA + 9 in both.
  const int r0 = warp * 16 + (lane >> 2);
  const int c = lane & 3;
  const int hA = 2 * c;
  const int heads[4] = {hA, hA + 1, hA + 8, hA + 9};
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale : 0.041666666666666664f;  // 1/sqrt(576)
  const float sl2 = scale * kLog2e;
  float* const xmax = reinterpret_cast<float*>(sm.ptr + SmemPlan::kQ + kNarrowMax);
  float* const xsum = reinterpret_cast<float*>(sm.ptr + SmemPlan::kQ + kNarrowSum);
  const unsigned p_at = sm.p() + narrow_p_offset(warp, lane);

  Stamps<kStamped<Cfg>> st;
  float o[32];  // O^T of columns 0..255 (narrow.cuh's issue_pv_narrow)
  int it = 0;
  int nreq = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of(kp, part, r);
    if (nreq > 0) {
      // Consumer 1 read the previous request's output factors (out_free); every warp of this one
      // is past its reads of the Q tile's exchange area.
      named_bar_sync(kBarQFree, 128);
      mbar_wait(sm.out_free(), (nreq - 1) & 1);
    }
    if (pc.blk_begin < pc.blk_end) load_q<kStageRows>(p, sm, r, tok, head0, t);
    if (t == 0 && nreq == 0) timeline_mark<Cfg>(kEventQ);
    if (r < part.end_req) prefetch_q(p, r + 1, tok, head0, t);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.f;
    float m[4] = {kNegInf, kNegInf, kNegInf, kNegInf};
    float l[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's share of each head's sum (its tokens)
    // B = Q's 16 rows (K-major, N = 16: two 8-row groups 1024 B apart).
    const unsigned long long dq = smem_desc_sw128(sm.q(), 16, 1024);
    // S^T = K Q^T of the tile at `stage`, issued and committed: A = the tile (K-major, rows =
    // tokens), B = Q; k step kk as issue_qk's.
    float s[8];
    const auto issue_s = [&](int stage) {
      if constexpr (!kNoMma<Cfg>) {
        wgmma_fence();
        const unsigned long long dk = smem_desc_sw128(sm.k(stage), 16, 1024);
#pragma unroll
        for (int kk = 0; kk < kDimQK / 16; ++kk) {
          const unsigned off = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
          wgmma_m64n16k16_ss<0>(s, desc_advance(dk, off), desc_advance(dq, off), kk > 0);
        }
        wgmma_commit();
      }
    };
    // (The next block's S^T issued behind this block's P V, as Cfg::kPHand 3 does for the wide
    // consumer, made ptxas serialize every wgmma here at 192 registers: C7512.)
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      const unsigned tile = sm.k(stage);
      st.start();
      wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
      issue_s(stage);
      if (t == 0 && it == 0) timeline_mark<Cfg>(kEventFirstTile);
      st.lap(0);
      if constexpr (kNoMma<Cfg>) {
#pragma unroll
        for (int i = 0; i < 8; ++i) s[i] = 0.f;
      } else {
        wgmma_wait<0>();
        fence_regs(s);
      }
      st.lap(1);
      // Accumulator rows r0 (s[0, 1, 4, 5]) and r0 + 8 (s[2, 3, 6, 7]) are tokens; columns
      // hA, hA + 1 (n8 block 0) and hA + 8, hA + 9 (block 1) heads.
      const int* ids = sm.ids(it);
      if (ids[r0] < 0) s[0] = s[1] = s[4] = s[5] = kNegInf;
      if (ids[r0 + 8] < 0) s[2] = s[3] = s[6] = s[7] = kNegInf;
      float bm[4] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3]), fmaxf(s[4], s[6]), fmaxf(s[5], s[7])};
#pragma unroll
      for (int x = 4; x < 32; x *= 2) {
#pragma unroll
        for (int i = 0; i < 4; ++i) bm[i] = fmaxf(bm[i], __shfl_xor_sync(0xffffffffu, bm[i], x));
      }
      // The four warps' maxima (buffer it % 2: a warp writes block it + 2's only after the
      // exchange of block it + 1, which every warp reaches after its reads here).
      float* const xm = xmax + (it & 1) * (kNarrowHeads * 4);
      if (lane < 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) xm[heads[i] * 4 + warp] = bm[i];
      }
      named_bar_sync(kBarNarrow, 128);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(xm + heads[i] * 4);
        bm[i] = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      }
      constexpr float kSlack = kRescale == kRescaleLazy ? 8.f : 0.f;
      float ref[4], alpha[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float mn = bm[i] * sl2 > m[i] + kSlack ? fmaxf(m[i], bm[i] * sl2) : m[i];
        ref[i] = row_ref(mn);
        alpha[i] = ptx::ex2(m[i] - ref[i]);
        m[i] = mn;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int i = (k & 1) + 2 * (k >> 2);  // s[k]'s head: hA + (k % 2) + 8 (k / 4)
        s[k] = ptx::ex2(fmaf(s[k], sl2, -ref[i]));
      }
      l[0] = l[0] * alpha[0] + (s[0] + s[2]);
      l[1] = l[1] * alpha[1] + (s[1] + s[3]);
      l[2] = l[2] * alpha[2] + (s[4] + s[6]);
      l[3] = l[3] * alpha[3] + (s[5] + s[7]);
      const unsigned pt[4] = {f32x2_to_bf16x2(s[0], s[1]), f32x2_to_bf16x2(s[2], s[3]),
                              f32x2_to_bf16x2(s[4], s[5]), f32x2_to_bf16x2(s[6], s[7])};
      st.lap(2);
      // P (rows = heads, K-major) and the heads' factors to both consumers' P V; consumer 1 may
      // still read block it - 1's (phase it - 1 of p_free).
      if (it > 0) mbar_wait(sm.p_free(), (it - 1) & 1);
      stmatrix_x4_trans(p_at, pt);
      if (warp == 0 && lane < 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) sm.row_scale()[heads[i]] = alpha[i];
      }
      fence_proxy_async_smem();
      mbar_arrive(sm.p_ready());
      named_bar_sync(kBarNarrow, 128);  // every warp's P rows and the factors, for this P V
      st.lap(3);
      rescale_narrow(o, alpha);
      if constexpr (!kNoMma<Cfg>) {
        issue_pv_narrow(o, tile, 0, sm.p());
        wgmma_wait<0>();
        fence_regs(o);
      }
      if (lane == 0) release_tile<Cfg, kCl>(sm, stage);
      st.lap(4);
    }

    if (t == 0) timeline_mark<Cfg>(kEventLastRelease);
    head_sums(l, xsum, heads, warp, lane, kBarNarrow);
    // Every thread's four heads: the output factor and the LSE (output_factors' rules), the
    // factors to consumer 1 (once per head), the LSE (once per head).
    float f[4], lse[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float fi[2], li[2];
      output_factors(p, pc, head0, heads[i], l[i], 0.f, m[i], kNegInf, fi, li);
      f[i] = fi[0];
      lse[i] = li[0];
    }
    if (warp == 0 && lane < 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sm.out_scale()[heads[i]] = f[i];
    }
    mbar_arrive(sm.out_ready());
    store_o_narrow(kp, pc, r, tok, r0, hA, 0, o, f);
    if (warp == 0 && lane < 4) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float pair[2] = {lse[i], lse[i + 2]};  // heads hA + i and hA + i + 8
        store_lse(kp, pc, r, tok, head0, heads[i], pair);
      }
    }
    if (t == 0) timeline_mark<Cfg>(kEventOut0);
  }
  // Matches WG1's arrival after the partition's last block.
  if (it > 0) mbar_wait(sm.p_free(), (it - 1) & 1);
  st.report(it);
}

// Consumer 1 with the heads on N: per block, the heads' factors and P from consumer 0, O^T of
// columns 256..511 rescaled and += V^T P^T; per request, the output factors, then its stores.
template <class Cfg>
__device__ __forceinline__ void consumer1_narrow(const DecodeKernelParams& kp, const SparsePart& part,
                                                 int tok, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  const int t = threadIdx.x - 128;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const int hA = 2 * (lane & 3);
  const int heads[4] = {hA, hA + 1, hA + 8, hA + 9};
  // Phases (kStamp): tile wait, P wait, rescale and P V issued, P V waited, released.
  Stamps<kStamped<Cfg>> st;
  float o[32];
  int it = 0;
  int nreq = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of(kp, part, r);
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = 0.f;
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      const unsigned tile = sm.k(stage);
      st.start();
      wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
      st.lap(0);
      mbar_wait(sm.p_ready(), it & 1);
      st.lap(1);
      const float a[4] = {sm.row_scale()[heads[0]], sm.row_scale()[heads[1]], sm.row_scale()[heads[2]],
                          sm.row_scale()[heads[3]]};
      rescale_narrow(o, a);
      if constexpr (!kNoMma<Cfg>) {
        issue_pv_narrow(o, tile, 256, sm.p());
        st.lap(2);
        wgmma_wait<0>();
        fence_regs(o);
      }
      st.lap(3);
      mbar_arrive(sm.p_free());
      if (lane == 0) release_tile<Cfg, kCl>(sm, stage);
      st.lap(4);
    }
    mbar_wait(sm.out_ready(), nreq & 1);
    const float f[4] = {sm.out_scale()[heads[0]], sm.out_scale()[heads[1]], sm.out_scale()[heads[2]],
                        sm.out_scale()[heads[3]]};
    mbar_arrive(sm.out_free());
    store_o_narrow(kp, pc, r, tok, r0, hA, 256, o, f);
    if (t == 0) timeline_mark<Cfg>(kEventOut1);
  }
  st.report(it);
}

}  // namespace deca::mla::sm90
