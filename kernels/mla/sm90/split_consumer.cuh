// The split consumers of the sm90a MLA wide kernel (config.cuh kSplit; dense plans only): decode.cuh
// runs split_consumer on both consumer warpgroups in place of consumers.cuh's consumer0 / consumer1.
//
// Warpgroup w (0, 1) computes S = Q K^T for tokens 32 w .. 32 w + 31 of a block (m64n32, A = Q,
// B = those 32 rows of the K tile), masks them, and the two exchange their rows' maxima; both then
// move the running maxima the same way (the same bits: fmaxf of the same two values), form P for
// their 32 tokens, publish that half of P in the P slot and take the other's; each runs P V over
// all 64 tokens for its half of O (columns 256 w .. 256 w + 255, V chunks 4 w .. 4 w + 3). The row
// sums are kept per warpgroup and added in the epilogue (one more exchange).
//
// Blocks go in pairs (a, b) of a request piece, so that the tensor cores have work during each
// softmax on the two-tile ring (docs/perf-notes-mla.md, "Dense consumers that split the tokens",
// has the event model): S(a) and S(b) issued back to back, the softmax of a under S(b), P V(a)
// issued, the softmax of b under P V(a); then P V(a) waited for and tile a released (refilled
// under P V(b)), P V(b) issued; the next pair's S(a') issued, P V(b) waited for and tile b
// released (refilled under S(a')). A piece of an odd number of blocks ends with a lone a, whose
// S(b) slot reads tile a again (discarded), so that the wgmma groups and waits are the same on
// every path.
//
// Hand-overs between the two warpgroups, all mbarriers (on the default consumers' slots, which
// this kernel does not otherwise use):
//   round(w) (p_ready for 0, p_free for 1; 128 arrivals): w reached exchange round k of the two's
//     common sequence (phase k): per block its rows' maxima of S, per request its rows' sums, in
//     its row slot (row_scale for 0, out_scale for 1). A warpgroup writes its slot for round k + 1
//     only after it waited for the other's P half of a block that follows round k, or for the
//     q barrier, both of which the other arrives at after reading round k's values; and it
//     completes round k + 1 of its barrier only after all of the other's threads passed their
//     wait of round k (the same arrivals), so a wait never sees its barrier two phases on.
//   p(w) (out_ready for 0, out_free for 1; 128 arrivals): w's P half of block `it` is in the P
//     slot (phase it). w writes its half of block it + 1 only after the exchange round of block
//     it + 1 (the rounds also count the requests' ends, so its number is not it + 1), which the
//     other reaches after loading w's half of block it into registers (ldmatrix: generic loads of
//     generic stores, no proxy fence).
//   q (q_loaded, 256 arrivals: both warpgroups), twice per request: the previous request's staged
//     outputs were read back from the Q tile (phase 2 n), then this request's two Q halves landed
//     and were fenced for the async proxy (2 n + 1).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// S for this warpgroup's 32 tokens (rows 32 w .. of the tile: `tile` already offset), issued and
// committed: 36 k steps as issue_qk's, N = 32.
__device__ __forceinline__ void issue_qk_half(float (&s)[16], unsigned long long dq, unsigned tile) {
  const unsigned long long dk = smem_desc_sw128(tile, 16, 1024);
#pragma unroll 1
  for (int ch = 0; ch < kDimQK / 64; ++ch) {
    wgmma_fence();
    const unsigned long long q = desc_advance(dq, ch * kChunkBytes);
    const unsigned long long k = desc_advance(dk, ch * kChunkBytes);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wgmma_m64n32k16_ss<0>(s, desc_advance(q, 32 * j), desc_advance(k, 32 * j), ch > 0 || j > 0);
    }
  }
  wgmma_commit();
}

// O (this warpgroup's 256 columns: V chunks at `v`, v + kChunkBytes, ...) += P V over the block's
// 64 tokens, issued and committed: k steps 2 w, 2 w + 1 with this warpgroup's P half (`mine`),
// 2 (1 - w), + 1 with the other's (`theirs`); each as issue_pv_left's two N = 128 halves.
// Ties P's registers to the asm sequence (as fence_regs does accumulators), so that the
// instructions defining them stay ahead of wgmma.fence (ptxas injects its own fence otherwise).
__device__ __forceinline__ void fence_p(unsigned (&pa)[2][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) asm volatile("" : "+r"(pa[i / 4][i % 4])::"memory");
}

template <int kWg>
__device__ __forceinline__ void issue_pv_split(float (&o)[128], unsigned (&mine)[2][4], unsigned (&theirs)[2][4],
                                               unsigned v) {
  fence_regs(o);
  fence_p(mine);
  fence_p(theirs);
  const auto step = [&](const unsigned(&a)[4], int kk) {
    const unsigned at = v + 2048u * static_cast<unsigned>(kk);
    wgmma_m64n128k16_rs<1>(o, a, smem_desc_sw128(at, kChunkBytes, 1024), true);
    wgmma_m64n128k16_rs<1>(o + 64, a, smem_desc_sw128(at + 2 * kChunkBytes, kChunkBytes, 1024), true);
  };
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 2; ++j) step(mine[j], 2 * kWg + j);
#pragma unroll
  for (int j = 0; j < 2; ++j) step(theirs[j], 2 * (kWg ^ 1) + j);
  wgmma_commit();
}

// A request piece's end for warpgroup kWg: the row sums of both halves (h + x == x + h: both get
// the same bits), the output factors and LSE, its half of the outputs (warpgroup 0 the LSE). r0
// is read again from %tid.x (volatile: not kept live across the blocks, where ptxas spilled it
// in a cluster).
template <int kWg, class Exchange>
__device__ __forceinline__ void split_outputs(const DecodeKernelParams& kp, const Piece& pc, const Smem& sm, int r,
                                              int tok, int head0, const float (&o)[128], float h0, float h1,
                                              float m0, float m1, Exchange&& exchange) {
  const MlaSparseParams& p = kp.p;
  float x0 = h0, x1 = h1;
  exchange(x0, x1);
  unsigned tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  const int warp = static_cast<int>((tid & 127u) >> 5), lane = static_cast<int>(tid & 31u);
  const int r0 = warp * 16 + (lane >> 2);
  float f[2], lse[2];
  output_factors(p, pc, head0, r0, h0 + x0, h1 + x1, m0, m1, f, lse);
  if (!pc.split && out_rows_aligned(p)) {
    store_o_staged(p, sm, r, tok, head0, warp, lane, 256 * kWg, o, f[0], f[1]);
  } else {
    store_o(kp, pc, r, tok, head0, r0, lane & 3, 256 * kWg, o, f[0], f[1]);
  }
  if (kWg == 0 && (lane & 3) == 0) store_lse(kp, pc, r, tok, head0, r0, lse);
}

// Consumer warpgroup kWg (0 or 1) of the split consumers: per request its half of Q, per pair of
// blocks as above, per request its half of the outputs (warpgroup 0 the LSE). The warpgroup is a
// template argument so that its tile offsets are immediates (with a run-time one the descriptors
// left the uniform registers and ptxas spilled them).
template <class Cfg, int kWg>
__device__ __forceinline__ void split_consumer(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                               int head0, const Smem& sm) {
  constexpr int wg = kWg;
  static_assert(kDense<Cfg> && !kModel1<Cfg>, "the split consumers: dense plans");
  static_assert(!kNoMma<Cfg>, "the split consumers have no no-wgmma ablation");
  constexpr int kCl = ClusterOf<Cfg>::value;
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const int c = lane & 3;
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale : 0.041666666666666664f;  // 1/sqrt(576)
  const float sl2 = scale * kLog2e;
  const unsigned p_at = p_lane_addr(sm.p(), warp, lane);
  // Each pair of slots is adjacent in the plan (p_ready / p_free, out_ready / out_free, row_scale /
  // out_scale): warpgroup w's is the first + w, so every address is sm.ptr plus an immediate.
  static_assert(SmemPlan::kBarPFree == SmemPlan::kBarPReady + 8 && SmemPlan::kBarOutFree == SmemPlan::kBarOutReady + 8 &&
                    SmemPlan::kOutScale == SmemPlan::kRowScale + 64 * 4,
                "the split consumers' slots are pairs");
  mbar_t* const round_mine = sm.p_ready() + kWg;
  mbar_t* const round_theirs = sm.p_ready() + (kWg ^ 1);
  mbar_t* const p_mine = sm.out_ready() + kWg;
  mbar_t* const p_theirs = sm.out_ready() + (kWg ^ 1);
  // This thread's row r0 in the row slots, as a shared-window address (one register, not two
  // generic pointers: ptxas spilled a register in a cluster otherwise).
  const unsigned rows_at = sm.base + SmemPlan::kRowScale + 4u * static_cast<unsigned>(warp * 16 + (lane >> 2));
  constexpr unsigned kMine = 256u * kWg, kTheirs = 256u * (kWg ^ 1);
  constexpr unsigned k_rows = static_cast<unsigned>(kWg) * (32 * 128);       // this warpgroup's tokens
  constexpr unsigned v_cols = static_cast<unsigned>(kWg) * (4 * kChunkBytes);  // its 256 columns of V

  unsigned rounds = 0;  // exchange rounds so far: the round barriers' phase
  unsigned qphase = 0;  // q barrier phases so far
  const auto rendezvous_q = [&] {
    mbar_arrive(sm.q_loaded());
    mbar_wait(sm.q_loaded(), qphase & 1);
    ++qphase;
  };
  // One exchange round: this thread's rows' values out (lane 0 of the quad holds the row's), the
  // other warpgroup's back in v0, v1.
  const auto exchange = [&](float& v0, float& v1) {
    if (c == 0) {
      sts32(rows_at + kMine, __float_as_uint(v0));
      sts32(rows_at + kMine + 32u, __float_as_uint(v1));
    }
    mbar_arrive(round_mine);
    mbar_wait(round_theirs, rounds & 1);
    ++rounds;
    v0 = __uint_as_float(ptx::lds32(rows_at + kTheirs));
    v1 = __uint_as_float(ptx::lds32(rows_at + kTheirs + 32u));
  };

  float o[128];
  float sa[16], sb[16];
  float m0, m1, l0, l1;
  // Half a block's softmax (block `it`, S waited for): the mask, the maxima exchanged, P formed and
  // this warpgroup's half published (k steps 2 w, 2 w + 1 of the P slot). Returns O's factors.
  const auto softmax_half = [&](float (&s)[16], int it, unsigned (&mine)[2][4]) {
    mask_invalid<4>(s, sm.ids(it) + 32 * wg, c);
    const RowFactors mx = block_max<4>(s);
    float ox0 = mx.a0, ox1 = mx.a1;
    exchange(ox0, ox1);
    const RowFactors a = softmax_rows<4>(s, fmaxf(mx.a0, ox0), fmaxf(mx.a1, ox1), sl2, m0, m1, l0, l1, mine);
    stmatrix_x4(p_at ^ (64u * static_cast<unsigned>(wg)), mine[0]);
    stmatrix_x4(p_at ^ (64u * static_cast<unsigned>(wg) + 32u), mine[1]);
    mbar_arrive(p_mine);
    return a;
  };
  // The other warpgroup's P half of block `it` into registers (its k steps 2 (1 - w), + 1).
  const auto take_theirs = [&](int it, unsigned (&theirs)[2][4]) {
    mbar_wait(p_theirs, it & 1);
    const unsigned at = p_at ^ (64u * static_cast<unsigned>(wg ^ 1));
    ptx::ldmatrix_x4(at, theirs[0][0], theirs[0][1], theirs[0][2], theirs[0][3]);
    ptx::ldmatrix_x4(at ^ 32u, theirs[1][0], theirs[1][1], theirs[1][2], theirs[1][3]);
  };

  int it = 0;  // the partition's block index: the tiles' stage and parity, the id slot, P's phase
  for (int r = part.begin_req; r <= part.end_req; ++r) {
    const Piece pc = piece_of<Cfg>(kp, part, r);
    rendezvous_q();  // both warpgroups' staged outputs of the previous request are read back
    if (pc.blk_begin < pc.blk_end) load_q<Cfg, 2>(p, sm, r, tok, head0, t, wg);
    rendezvous_q();  // both halves of Q landed
    if (wg == 0 && r < part.end_req) prefetch_q<Cfg>(p, r + 1, tok, head0, t);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    m0 = kNegInf;
    m1 = kNegInf;
    l0 = 0.f;
    l1 = 0.f;
    const unsigned long long dq = smem_desc_sw128(sm.q(), 16, 1024);
    for (int blk = pc.blk_begin; blk < pc.blk_end; blk += 2) {
      const bool has_b = blk + 1 < pc.blk_end;
      const int stage_a = it & 1, stage_b = stage_a ^ 1;
      wait_tile<Cfg, kCl>(sm, stage_a, (it >> 1) & 1);
      issue_qk_half(sa, dq, sm.k(stage_a) + k_rows);
      // A lone a computes its S a second time into sb (discarded): an S(b) issued on one path
      // only leaves sb's registers defined by other instructions on the other, and ptxas then
      // serializes every wgmma (C7515). Tile a is full and held, so the reads race with nothing.
      if (has_b) wait_tile<Cfg, kCl>(sm, stage_b, ((it + 1) >> 1) & 1);
      issue_qk_half(sb, dq, sm.k(has_b ? stage_b : stage_a) + k_rows);
      wgmma_wait<1>();  // S(a); S(b) runs on under a's softmax
      fence_regs(sa);
      unsigned pa[2][4], pa_theirs[2][4];
      const RowFactors fa = softmax_half(sa, it, pa);
      // O is rescaled with no wgmma in flight (an FMUL on O while S(b) runs made ptxas serialize
      // every wgmma, C7514); S(b) is done by now or close, and P V(a) queues right behind it.
      wgmma_wait<0>();  // S(b) (or a's again)
      fence_regs(sb);
      fence_regs(o);
      rescale(o, fa.a0, fa.a1);
      take_theirs(it, pa_theirs);
      issue_pv_split<kWg>(o, pa, pa_theirs, sm.k(stage_a) + v_cols);
      // A lone a runs P V(b) with P = 0 on its own tile (adds zeros: its rows are finite tokens or
      // zero rows), released only after it: the same groups on every path, as for S(b).
      unsigned pb[2][4], pb_theirs[2][4];
      RowFactors fb{1.f, 1.f};
      if (has_b) fb = softmax_half(sb, it + 1, pb);
      wgmma_wait<0>();  // P V(a): tile a is free, O may be rescaled
      fence_regs(o);
      if (has_b) {
        if (lane == 0) release_tile<kCl>(sm, stage_a);
        rescale(o, fb.a0, fb.a1);
        take_theirs(it + 1, pb_theirs);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) pb[i / 4][i % 4] = pb_theirs[i / 4][i % 4] = 0u;
      }
      const int stage_last = has_b ? stage_b : stage_a;
      issue_pv_split<kWg>(o, pb, pb_theirs, sm.k(stage_last) + v_cols);
      // Waited for here, not under the next pair's S(a): a wgmma in flight across the loop's back
      // edge leaves O's loop copies inside its stage, and ptxas serializes every wgmma (C7515).
      // The tensor cores lose the next S(a)'s issue latency once a pair.
      wgmma_wait<0>();
      fence_regs(o);
      if (lane == 0) release_tile<kCl>(sm, stage_last);
      it += has_b ? 2 : 1;
    }

    split_outputs<kWg>(kp, pc, sm, r, tok, head0, o, quad_sum(l0), quad_sum(l1), m0, m1, exchange);
  }
}

}  // namespace deca::mla::sm90
