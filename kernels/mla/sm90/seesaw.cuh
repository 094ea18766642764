// The consumers of the sm90a MLA sparse decode kernel in seesaw order (Cfg::kSeesaw = 1,
// knobs.cuh): the two consumer warpgroups take the partition's blocks in turn (block `it` is
// warpgroup it % 2's), and each holds one half of O's columns (warpgroup w: 256 w .. + 255).
//
// For its own block k a warpgroup runs S = Q K^T, the mask and the online softmax against the
// running maxima that block k - 1 left, then publishes P (bf16, the one P slot), the new maxima
// (row_scale) and arrives on p_ready (phase k); it then runs P V on its half of O with P from
// registers. For the other's block j it waits for that phase, derives the block's row factors
// from the maxima exactly as their owner did (so both halves of O and the sums see the same
// factors, bit for bit), and runs P V on its half with P from the slot (shared memory).
//
// The order inside a warpgroup's own step (block k, the other's k - 1 not yet taken):
//   own P V of k - 2 waited, its tile released (tile k is the same stage: wait for it after);
//   S(k) issued;  the other's block k - 1 taken: its P V issued behind S(k);
//   S(k) waited;  softmax(k), under the tensor cores' P V(k - 1) and the other's S(k + 1);
//   P V(k - 1) waited (the slot is free again, tile k - 1 released);  P(k) published;
//   own P V(k) issued.
// So one warpgroup's QK^T runs while the other computes its softmax: with a single warpgroup
// on S and the softmax the tensor cores idle during every softmax and hand-over.
//
// The P slot has one writer at a time: P(k) is written by k's owner only after its own P V of
// block k - 1 (the slot's previous content, the other's) completed, and the other reads it
// before it writes P(k + 1). Running sums: each warpgroup adds its own blocks' (this thread's
// columns) and scales them by every block's factor, as its O; the request's epilogue adds the
// two (consumer 1's through out_scale, out_ready), and consumer 0 returns the output factors
// (out_free). Consumer 0 loads each request's Q once both warpgroups are past their last S of
// the previous one (consumer 1's out_ready arrival) and signals q_loaded.
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
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// O[:, cols] += P V for this warpgroup's 256 columns (V chunks at `vtile`), P from registers
// (kOwn) or from the P slot; issued, not committed (the caller's group). 512 threads: the N = 128
// halves (sm90_ptx.cuh says why).
template <bool kOwn>
__device__ __forceinline__ void seesaw_pv(float (&o)[128], const unsigned (&pa)[4][4], unsigned vtile,
                                          unsigned p_slot) {
  wgmma_fence();
  const unsigned long long dv = smem_desc_sw128(vtile, kChunkBytes, 1024);
  [[maybe_unused]] const unsigned long long dp = smem_desc_sw128(p_slot, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (kOwn) {
      wgmma_m64n128k16_rs<1>(o, pa[kk], desc_advance(dv, 2048 * kk), true);
      wgmma_m64n128k16_rs<1>(o + 64, pa[kk], desc_advance(dv, 2 * kChunkBytes + 2048 * kk), true);
    } else {
      wgmma_m64n128k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
      wgmma_m64n128k16_ss<1>(o + 64, desc_advance(dp, 32 * kk), desc_advance(dv, 2 * kChunkBytes + 2048 * kk),
                             true);
    }
  }
}

template <class Cfg, int kW>
__device__ __forceinline__ void consumer_seesaw(const DecodeKernelParams& kp, const SparsePart& part,
                                                int tok, int head0, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  constexpr int kRescale = RescaleOf<Cfg>::value;
  static_assert(ProducersOf<Cfg>::value == 2, "the seesaw's 200 registers each: two producers at 56");
  // Cfg::kSeesaw 2: the other's block taken before waiting for this block's tile (1: after S is
  // issued, so that S runs under the other's softmax when the tile is already full).
  constexpr bool kTakeFirst = SeesawOf<Cfg>::value == 2;
  const MlaSparseParams& p = kp.p;
  const int t = static_cast<int>(threadIdx.x) - 128 * kW;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const int c = lane & 3;
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale : 0.041666666666666664f;  // 1/sqrt(576)
  const float sl2 = scale * kLog2e;
  const unsigned vcols = static_cast<unsigned>(kW * 4 * kChunkBytes);  // this half's V chunks

  // Phases per own block (kStamp): own P V waited, the other's block taken (its P's wait), the
  // tile waited, S (and the other's P V) waited, softmax, published and own P V issued.
  Stamps<kStamped<Cfg>> st;
  float o[128];
  float s[32];
  unsigned pa[4][4];
  int it = 0;
  int nreq = 0;
  int owned = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of(kp, part, r);
    if constexpr (kW == 0) {
      if (pc.blk_begin < pc.blk_end) load_q(p, sm, r, tok, head0, t);
      if (r < part.end_req) prefetch_q(p, r + 1, tok, head0, t);
      mbar_arrive(sm.q_loaded());
    } else {
      mbar_wait(sm.q_loaded(), nreq & 1);
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
    const unsigned long long dq = smem_desc_sw128(sm.q(), 16, 1024);
    bool own_pending = false;  // own P V issued, not waited for (its tile not yet released)
    int own_stage = 0;
    bool other_pending = false;  // the other's block `other_it` not yet taken
    int other_it = 0;

    // Own P V done, its tile released. The waits are unconditional (wait_group returns at once
    // when nothing is pending): behind a condition ptxas cannot tell the accumulators free and
    // serializes every wgmma (C7517 / C7511).
    const auto finish_own = [&] {
      if constexpr (!kNoMma<Cfg>) {
        wgmma_wait<0>();
        fence_regs(o);
      }
      if (own_pending && lane == 0) release_tile<Cfg, kCl>(sm, own_stage);
      own_pending = false;
    };
    // The other's block j: its maxima, the factors they imply (as its owner computed them), this
    // half of O and the sums rescaled, P V from the slot issued (not committed). No wgmma may be
    // accumulating into O here.
    const auto take_other = [&](int j) {
      mbar_wait(sm.p_ready(), j & 1);
      const float mn0 = sm.row_scale()[r0];
      const float mn1 = sm.row_scale()[r0 + 8];
      const float a0 = ptx::ex2(m0 - row_ref(mn0));
      const float a1 = ptx::ex2(m1 - row_ref(mn1));
      m0 = mn0;
      m1 = mn1;
      l0 *= a0;
      l1 *= a1;
      rescale<kRescale>(o, a0, a1);
      if constexpr (!kNoMma<Cfg>) seesaw_pv<false>(o, pa, sm.k(j & 1) + vcols, sm.p());
    };

    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      if ((it & 1) != kW) {
        other_pending = true;
        other_it = it;
        continue;
      }
      const int stage = it & 1;
      const unsigned tile = sm.k(stage);
      ++owned;
      st.start();
      finish_own();  // block it - 2: the same stage as this one
      st.lap(0);
      const bool took = other_pending;
      other_pending = false;
      if constexpr (kTakeFirst) {
        // The other's block first (its P V, or an empty group), then S: its tile is released as
        // soon as its P V completed, even while this block's tile is still being filled.
        if (took) take_other(other_it);
        if constexpr (!kNoMma<Cfg>) wgmma_commit();
        st.lap(1);
        wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
        st.lap(2);
        if constexpr (!kNoMma<Cfg>) {
          issue_qk(s, dq, tile);
          wgmma_wait<1>();
          fence_regs(o);
        }
        if (took && lane == 0) release_tile<Cfg, kCl>(sm, stage ^ 1);
        if constexpr (!kNoMma<Cfg>) {
          wgmma_wait<0>();
          fence_regs(s);
        }
      } else {
        wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
        st.lap(2);
        if constexpr (!kNoMma<Cfg>) issue_qk(s, dq, tile);
        if (took) take_other(other_it);
        st.lap(1);
        if constexpr (!kNoMma<Cfg>) {
          // The other's P V (or an empty group) too: the tile of the other's block is released
          // now, not after this block's softmax, since the producers refill it meanwhile (with
          // two stages that tile's hold time paces the ring).
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(s);
          fence_regs(o);
        }
        if (took && lane == 0) release_tile<Cfg, kCl>(sm, stage ^ 1);
      }
      if constexpr (kNoMma<Cfg>) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
      }
      st.lap(3);
      const auto [a0, a1] = online_softmax<kRescale>(s, sm.ids(it), c, sl2, m0, m1, l0, l1, pa);
      st.lap(4);
      // Publish: P (one K-major swizzled 64 x 64 chunk, element (row, col) at unit col / 8) and
      // the new maxima; the other's P V reads the slot through the async proxy.
      {
        store_p(p_lane_addr(sm.p(), warp, lane), pa);
        if (c == 0) {
          sm.row_scale()[r0] = m0;
          sm.row_scale()[r0 + 8] = m1;
        }
        fence_proxy_async_smem();
        mbar_arrive(sm.p_ready());
      }
      rescale<kRescale>(o, a0, a1);
      if constexpr (!kNoMma<Cfg>) {
        seesaw_pv<true>(o, pa, tile + vcols, sm.p());
        wgmma_commit();
      }
      own_pending = true;
      own_stage = stage;
      st.lap(5);
    }
    // The request's last block, when it is the other's.
    if (other_pending) {
      finish_own();
      take_other(other_it);
      if constexpr (!kNoMma<Cfg>) {
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
      }
      if (lane == 0) release_tile<Cfg, kCl>(sm, other_it & 1);
    }
    finish_own();

    // Epilogue: the row sums of both warpgroups, the output factor (1 / l, with the sink for a
    // final output) and the LSE.
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    float* out_scale = sm.out_scale();
    if constexpr (kW == 1) {
      // Consumer 0 read this slot's previous content (its factors for the previous request were
      // read by this warpgroup before it got here).
      if (c == 0) {
        out_scale[r0] = l0;
        out_scale[r0 + 8] = l1;
      }
      mbar_arrive(sm.out_ready());
      mbar_wait(sm.out_free(), nreq & 1);
      store_o(kp, pc, r, tok, head0, r0, c, 256, o, out_scale[r0], out_scale[r0 + 8]);
    } else {
      mbar_wait(sm.out_ready(), nreq & 1);
      l0 += out_scale[r0];
      l1 += out_scale[r0 + 8];
      float f[2], lse[2];
      output_factors(p, pc, head0, r0, l0, l1, m0, m1, f, lse);
      // Every thread of the quad has read the sums before lane c == 0 overwrites them.
      __syncwarp();
      if (c == 0) {
        out_scale[r0] = f[0];
        out_scale[r0 + 8] = f[1];
      }
      mbar_arrive(sm.out_free());
      store_o(kp, pc, r, tok, head0, r0, c, 0, o, f[0], f[1]);
      if (c == 0) store_lse(kp, pc, r, tok, head0, r0, lse);
    }
  }
  st.report(owned);
}

}  // namespace deca::mla::sm90
