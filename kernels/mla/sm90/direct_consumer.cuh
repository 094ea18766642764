// The direct kernel's consumers (direct.cuh): per block S^T = K Q^T from the ring slot's records
// widened in registers, the column softmax, P as two e4m3 terms per group, O^T += V^T P^T; per
// request the two warpgroups' states merged and the outputs written.
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/direct_model1.cuh"
#include "kernels/mla/sm90/direct_ring.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

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

// O^T's accumulator register k: its scale group (MODEL1: its m-block, 7 the RoPE's, unscaled).
template <bool kM1>
__device__ __forceinline__ constexpr int o_group(int k) {
  return kM1 ? k >> 3 : k >> 4;
}

// One consumer warpgroup (wg 0, 1) of the direct kernel: blocks it with it % 2 = wg, all NoPE
// groups and RoPE k steps, O^T of all 512 columns (group-major, direct_column; MODEL1:
// direct_m1_column), its running state merged with the other warpgroup's at the request's end
// (warpgroup 0 writes the outputs). MODEL1's S^T, RoPE P, P V and output stores: direct_model1.cuh.
template <class Cfg>
__device__ __forceinline__ void consumer_direct(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                                const DirectSmem<Cfg>& sm, int wg) {
  constexpr bool kM1 = kModel1<Cfg>;
  using Plan = DirectPlanT<kM1>;
  constexpr int kG = Plan::kGroups;  // NoPE groups
  constexpr int kGo = kM1 ? kG + 1 : kG;  // O^T's scale groups (MODEL1: and the RoPE block)
  constexpr int kR = 4;  // RoPE k steps
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const int i = lane >> 2, q = lane & 3;
  const int r0 = 16 * warp + i;  // S^T rows r0, r0 + 8: tokens; O^T rows: columns (direct_column)
  const int hA = 2 * q;
  const int heads[4] = {hA, hA + 1, hA + 8, hA + 9};
  // 1/sqrt(d_qk): 576, MODEL1 512.
  const float scale =
      p.softmax_scale != 0.f ? p.softmax_scale : (kM1 ? 0.044194173824159216f : 0.041666666666666664f);
  const float sl2 = scale * kLog2e;
  float* const xmax = sm.f32(Plan::kXMax) + wg * (2 * 16 * 4);
  float* const xscale = sm.f32(Plan::kXScale) + wg * (2 * Plan::kPChunks * 4);
  float* const xsum = sm.f32(Plan::kXSum) + wg * (16 * 4);
  const int bar_wg = kBarDirectWg + wg;
  // Byte offsets inside a slot: this thread's S^T fragment words (row r0; + 8 rows is + 8
  // records), its P V fragment word (column 4 (8 w + i) of a group, records 2 q + ...), its scales.
  const unsigned s_off = static_cast<unsigned>(r0 * kTokenBytes + 4 * q);
  const unsigned pv_off = static_cast<unsigned>(2 * q * kTokenBytes + 4 * (8 * warp + i));
  // P's stores: heads' rows, tokens r0 and r0 + 8 at kappa 16 w + 2 i and + 1 (one byte pair;
  // direct_token), hi / lo halves of the row.
  const int kappa = 16 * warp + 2 * i;

  int it = 0;
  int nreq = 0;
  int nq = 0;  // Qs loaded so far (the phase of kBarQLanded)
  float o[64];  // m-block mb (group mb / 2; MODEL1 mb) at o[8 mb ..], m64n16 accumulator layout
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of<Cfg>(kp, part, r);
    // Both warpgroups are past the previous request's reads of Q, the head scales, the sums and
    // the O^T exchange over Q's terms.
    if (nreq > 0) rendezvous(sm.bar(Plan::kBarRequest), (nreq - 1) & 1);
    if (pc.blk_begin < pc.blk_end) {
      load_q_direct(p, sm, r, tok, threadIdx.x, sl2);
      rendezvous(sm.bar(Plan::kBarQLanded), nq & 1);
      ++nq;
    }
    float sl2h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) sl2h[k] = sm.f32(Plan::kHeadScale)[heads[k]];
#pragma unroll
    for (int k = 0; k < 64; ++k) o[k] = 0.f;
    float m[4] = {kNegInf, kNegInf, kNegInf, kNegInf};
    float l[4] = {0.f, 0.f, 0.f, 0.f};
    int eg[kG];  // the groups' running scale exponents (every scale seen < 2^eg)
#pragma unroll
    for (int g = 0; g < kG; ++g) eg[g] = kExpFloor;
    const unsigned long long dq = smem_desc_sw128(sm.base + Plan::kQ, 16, 1024);
    const unsigned long long dqr = smem_desc_sw128(sm.base + Plan::kQRope, 16, 1024);
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      if ((it & 1) != wg) continue;  // the other warpgroup's block
      mbar_wait(sm.full(it), (it / kDirectRing) & 1);
      if constexpr (kNoConsume<Cfg>) {  // timing only: every slot released as soon as it is full
        mbar_arrive(sm.empty(it));
        continue;
      }
      const unsigned rec = sm.slot(it);
      // S^T's operands, accumulators and results, for both tokens here (their lifetimes the
      // block's: the 656-byte token's kernel keeps the machine code it had before MODEL1's).
      unsigned ar[kR][4];
      float scr[kG][2];  // group g's scales of tokens r0 and r0 + 8
      float acc[kG][8], racc[8];
      unsigned kf[2][8][4];  // [set][k16 step][fragment]
      float s[8];
      if constexpr (kM1) {
        direct_scores_model1<Cfg>(rec, s_off, r0, dq, dqr, ar, acc, racc, kf, s, scr);
      } else {
        // ---- S^T over this warpgroup's groups and RoPE steps ----
        // The keys' e4m3 words widened to f16 pairs (exact) for the f16 tensor cores, a group (8 k16
        // steps, 32 registers) at a time in two register sets: a set is rewritten once the group
        // that read it completed (wgmma.wait_group 1). The RoPE bf16 words go as they are.
#pragma unroll
        for (int ks = 0; ks < kR; ++ks) {
          load_a_rows(rec + s_off + static_cast<unsigned>(kDimNope + 16 + 32 * ks), ar[ks]);
        }
        // Group g's scales of tokens r0 and r0 + 8.
        {
          const unsigned at = rec + static_cast<unsigned>(r0 * kTokenBytes + kDimNope);
          const uint4 u0 = ptx::lds128(at), u1 = ptx::lds128(at + 8 * kTokenBytes);
          const unsigned w0[4] = {u0.x, u0.y, u0.z, u0.w}, w1[4] = {u1.x, u1.y, u1.z, u1.w};
#pragma unroll
          for (int g = 0; g < kG; ++g) scr[g][0] = __uint_as_float(w0[g]), scr[g][1] = __uint_as_float(w1[g]);
        }
        const auto widen = [&](int g, unsigned (&f)[8][4]) {
          widen_group<4>(rec + s_off + static_cast<unsigned>(128 * g), f);
        };
        if constexpr (kNoMma<Cfg>) {  // timing only: the products left out, their operands still loaded
          widen(0, kf[0]);
          scores_without_products<8>(kf[0], ar, acc, racc);
        } else {
          scores_products<kG, 8>(widen, dq, dqr, kf, ar, acc, racc);
        }
        scale_scores(racc, acc, scr, s);
      }
      const int* ids = sm.ids(it);
      if (ids[r0] < 0) s[0] = s[1] = s[4] = s[5] = kNegInf;
      if (ids[r0 + 8] < 0) s[2] = s[3] = s[6] = s[7] = kNegInf;
      // ---- the column softmax (per head scale) and the groups' scale maxima ----
      float bm[4] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3]), fmaxf(s[4], s[6]), fmaxf(s[5], s[7])};
      float gm[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) gm[g] = fmaxf(scr[g][0], scr[g][1]);
#pragma unroll
      for (int x = 4; x < 32; x *= 2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) bm[k] = fmaxf(bm[k], __shfl_xor_sync(0xffffffffu, bm[k], x));
#pragma unroll
        for (int g = 0; g < kG; ++g) gm[g] = fmaxf(gm[g], __shfl_xor_sync(0xffffffffu, gm[g], x));
      }
      // One buffer: the P barrier lies between a block's reads and the warpgroup's next block's writes.
      float* const xm = xmax;
      float* const xs = xscale;
      if (lane < 4) {
#pragma unroll
        for (int k = 0; k < 4; ++k) xm[heads[k] * 4 + warp] = bm[k];
      }
      if (lane == 0) {
#pragma unroll
        for (int g = 0; g < kG; ++g) xs[4 * g + warp] = gm[g];
      }
      named_bar_sync(bar_wg, 128);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(xm + heads[k] * 4);
        bm[k] = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      }
      float rho[kG], gmul[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float4 v = *reinterpret_cast<const float4*>(xs + 4 * g);
        const int e = exponent_above(fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        const int en = e > eg[g] ? e : eg[g];
        rho[g] = en - eg[g] > 126 ? 0.f : pow2f(eg[g] - en);
        eg[g] = en;
        gmul[g] = pow2f(8 - en);
      }
      float alpha[4], ref[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float mn = fmaxf(m[k], bm[k] * sl2h[k]);
        ref[k] = row_ref(mn);
        alpha[k] = ptx::ex2(m[k] - ref[k]);
        m[k] = mn;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int h = (k & 1) + 2 * (k >> 2);
        s[k] = ptx::ex2(fmaf(s[k], sl2h[h], -ref[h]));
      }
      l[0] = l[0] * alpha[0] + (s[0] + s[2]);
      l[1] = l[1] * alpha[1] + (s[1] + s[3]);
      l[2] = l[2] * alpha[2] + (s[4] + s[6]);
      l[3] = l[3] * alpha[3] + (s[5] + s[7]);
      // ---- P_g = P x scale_g x 2^(8 - eg) as e4m3 hi + lo, transposed into the slot ----
      // (This warpgroup's slots of this parity were last read by its previous block's P V, waited for.)
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const unsigned pb = sm.p(it, g);
        const float f0 = scr[g][0] * gmul[g], f1 = scr[g][1] * gmul[g];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {  // heads hA + 8 nb, + 1: s[4 nb ..]
          unsigned hi, lo;
          kv::split_e4m3_f16(s[4 * nb] * f0, s[4 * nb + 2] * f1, s[4 * nb + 1] * f0, s[4 * nb + 3] * f1, hi, lo);
          const int h = hA + 8 * nb;
          sts16(pb + swz(h, kappa >> 4) + (kappa & 15), hi);
          sts16(pb + swz(h + 1, kappa >> 4) + (kappa & 15), hi >> 16);
          sts16(pb + swz(h, 4 + (kappa >> 4)) + (kappa & 15), lo);
          sts16(pb + swz(h + 1, 4 + (kappa >> 4)) + (kappa & 15), lo >> 16);
        }
      }
      if constexpr (kM1) store_p_rope_model1(sm.p(it, kG), s, hA, r0);  // the RoPE block's P, unscaled
      fence_proxy_async_smem();
      named_bar_sync(bar_wg, 128);
      // ---- O^T *= alpha x rho, += V^T P^T ----
      {
        bool ones = alpha[0] == 1.f && alpha[1] == 1.f && alpha[2] == 1.f && alpha[3] == 1.f;
#pragma unroll
        for (int g = 0; g < kG; ++g) ones = ones && rho[g] == 1.f;
        if (!__all_sync(0xffffffffu, ones)) {
#pragma unroll
          for (int k = 0; k < 64; ++k) {
            const int h = (k & 1) + 2 * ((k >> 2) & 1);
            const int gk = o_group<kM1>(k);
            o[k] *= gk < kG ? alpha[h] * rho[gk] : alpha[h];
          }
        }
      }
      if constexpr (kM1) {
        direct_pv_model1<Cfg>(rec, sm.p(it, 0), sm.empty(it), o, warp, i, q);
      } else {
        unsigned v[kG][2][2][4];  // [group][k step][m-block of the pair][fragment]
#pragma unroll
        for (int g = 0; g < kG; ++g) {
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              unsigned w[4], tr[4];
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                const int tk = 32 * ks + 16 * e + 8 * (j & 1) + (j >> 1);  // + 2 q in pv_off
                w[j] = ptx::lds32(rec + pv_off + static_cast<unsigned>(tk * kTokenBytes + 128 * g));
              }
              transpose4x4(w, tr);
              v[g][ks][0][2 * e] = tr[0];
              v[g][ks][0][2 * e + 1] = tr[1];
              v[g][ks][1][2 * e] = tr[2];
              v[g][ks][1][2 * e + 1] = tr[3];
            }
          }
        }
        // Every read of the slot is done (the loads above completed into registers): each thread
        // releases its own reads, so that racecheck (which follows a release per thread) sees them
        // ordered before the producer's next copies into the slot.
        mbar_arrive(sm.empty(it));
        if constexpr (kNoMma<Cfg>) {
#pragma unroll
          for (int k = 0; k < 8 * 2 * kG; ++k) {
            o[k] += __uint_as_float(v[k >> 4][(k >> 3) & 1][(k >> 2) & 1][k & 3] & 0x3F000000u);
          }
          continue;
        }
        wgmma_fence();
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const unsigned long long dp = smem_desc_sw128(sm.p(it, g), 16, 1024);
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              float* const om = o + 8 * (2 * g + h);
              wgmma_m64n16k32_e4m3_rs(om, v[g][ks][h], desc_advance(dp, 32 * ks), true);
              wgmma_m64n16k32_e4m3_rs(om, v[g][ks][h], desc_advance(dp, 64 + 32 * ks), true);
            }
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
      }
    }

    // ---- the request's sums, factors, outputs ----
    head_sums(l, xsum, heads, warp, lane, bar_wg);
    // O^T in true units: x 2^(eg - 8) per group (rows), then per head.
    float gsc[kGo];
#pragma unroll
    for (int g = 0; g < kGo; ++g) gsc[g] = g < kG ? pow2f(eg[g] - 8) : 1.f;
    // Both warpgroups' states to shared memory; each head's maximum M over both, each side's
    // weight 2^(m_w - M) (0 for a side that saw no valid key), the sum over both.
    float* const xst = sm.f32(Plan::kXState);
    if (warp == 0 && lane < 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        xst[wg * 32 + heads[k]] = m[k];
        xst[wg * 32 + 16 + heads[k]] = l[k];
      }
    }
    rendezvous(sm.bar(Plan::kBarStates), nreq & 1);
    float wmine[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float mo = xst[(1 - wg) * 32 + heads[k]], lo = xst[(1 - wg) * 32 + 16 + heads[k]];
      const float mm = fmaxf(m[k], mo);
      wmine[k] = m[k] == kNegInf ? 0.f : ptx::ex2(m[k] - mm);
      const float wother = mo == kNegInf ? 0.f : ptx::ex2(mo - mm);
      // Warpgroup 0's term first in both sums.
      l[k] = wg == 0 ? l[k] * wmine[k] + lo * wother : lo * wother + l[k] * wmine[k];
      m[k] = mm;
    }
    float* const ox = sm.f32(Plan::kOX);
    if (wg == 1) {
#pragma unroll
      for (int k = 0; k < 64; ++k) {
        const int h = (k & 1) + 2 * ((k >> 2) & 1);
        ox[k * 128 + t] = o[k] * wmine[h] * gsc[o_group<kM1>(k)];
      }
    }
    rendezvous(sm.bar(Plan::kBarOX), nreq & 1);
    if (wg == 1) continue;  // warpgroup 0 writes the request's outputs
#pragma unroll
    for (int k = 0; k < 64; ++k) {
      const int h = (k & 1) + 2 * ((k >> 2) & 1);
      o[k] = fmaf(o[k] * wmine[h], gsc[o_group<kM1>(k)], ox[k * 128 + t]);
    }
#pragma unroll
    for (int g = 0; g < kGo; ++g) gsc[g] = 1.f;
    float f[4], lse[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float fi[2], li[2];
      output_factors(p, pc, 0, heads[k], l[k], 0.f, m[k], kNegInf, fi, li);
      f[k] = fi[0];
      lse[k] = li[0];
    }
    if constexpr (kM1) {
      write_outputs_model1(kp, pc, r, tok, o, f, heads, r0);
    } else {
      // The thread's columns: 4 adjacent ones per group at 128 G + 4 (8 w + i), G = g.
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const int col = 128 * g + 4 * (8 * warp + i);
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // head heads[k]: accumulator registers kr, kr + 2 of m-blocks 2 g, 2 g + 1
          const int head = heads[k];
          if (head >= p.num_heads) continue;
          const int kr = (k & 1) + 4 * (k >> 1);
          const float fk = f[k] * gsc[g];
          const float v0 = o[16 * g + kr] * fk, v1 = o[16 * g + kr + 2] * fk;
          const float v2 = o[16 * g + 8 + kr] * fk, v3 = o[16 * g + 8 + kr + 2] * fk;
          if (pc.split) {
            float* dst = kp.run.partial_o +
                         ((static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head) * kDimV + col;
            *reinterpret_cast<float4*>(dst) = make_float4(v0, v1, v2, v3);
          } else {
            unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch +
                                  tok * p.out_stride_token + head * p.out_stride_head + col;
            *reinterpret_cast<uint2*>(dst) = make_uint2(f32x2_to_bf16x2(v0, v1), f32x2_to_bf16x2(v2, v3));
          }
        }
      }
    }
    if (wg == 0 && warp == 0 && lane < 4) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float pair[2] = {lse[k], lse[k + 2]};  // heads hA + k and hA + k + 8
        store_lse(kp, pc, r, tok, 0, heads[k], pair);
      }
    }
  }
}

}  // namespace deca::mla::sm90
