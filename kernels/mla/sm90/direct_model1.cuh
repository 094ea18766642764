// MODEL1's token (kMlaKvModel1: 448 e4m3 values in seven 64-value groups with ue8m0 scales, 64
// bf16 RoPE values; V is the whole 512-dim row) in the direct kernel's consumers
// (direct_consumer.cuh), which run the same ring, walk, softmax and request end for both tokens
// and call these for what differs. A ring record (direct_ring.cuh producer_copies) is the token's
// 576-byte row at bytes 0..575 and its 8 scale bytes at 576, in V3.2's 656-byte stride, so that
// every fragment load keeps the stride's bank spread (656 B = 4 banks a record).
//
//   S^T = K Q^T: as for V3.2, the e4m3 words widened to f16 pairs as A, one accumulator per group
//     (4 k16 steps), each token's group scale (an exact power of two) multiplied after the
//     products; the RoPE k steps from the record's bf16 bytes at 448.
//   O^T = V^T P^T: m-block g < 7 is group g's 64 columns, m-block 7 the 64 RoPE columns (row m
//     of m-block mb: column direct_m1_column(mb, m), layout.cuh). An m-block shares one B, so it
//     must hold one group: a thread's two rows of it are two adjacent columns, loaded as 16-bit
//     halves (ld.shared.u16, 4 tokens to 2 registers by prmt) from direct_token's records. The
//     RoPE block runs on the bf16 tensor cores, A = the RoPE values as stored (a thread's two
//     columns one word a token), B = P in bf16 in its own chunk and k order (direct_m1_rope_token).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/model1.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/direct_ring.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

constexpr int kM1Groups = kModel1NopeDims / 64;  // 7
constexpr int kM1ScaleByte = kModel1RowBytes;    // the scales' place in a ring record
static_assert(kM1ScaleByte + kModel1ScaleBytes <= kTokenBytes, "MODEL1's record in V3.2's stride");

// S^T of one block's 64 tokens (row r0 = 16 w + i of the thread's fragment: s_off = r0 x 656 +
// 4 q) against the request's Q (descriptors dq: 7 chunks of f16 NoPE, dqr: the bf16 RoPE), each
// token's group scales applied after the products: s[8] in the m64n16 accumulator order (rows
// r0: k = 0, 1, 4, 5; r0 + 8: k = 2, 3, 6, 7), scr[g][0 / 1] the scales of tokens r0 / r0 + 8.
// The operand and accumulator arrays are the caller's (ar: the RoPE's A; acc, racc; kf: two
// sets of a group's widened A, steps 0..3 of each), declared for both tokens in its block.
template <class Cfg>
__device__ __forceinline__ void direct_scores_model1(unsigned rec, unsigned s_off, int r0, unsigned long long dq,
                                                     unsigned long long dqr, unsigned (&ar)[4][4],
                                                     float (&acc)[kM1Groups][8], float (&racc)[8],
                                                     unsigned (&kf)[2][8][4], float (&s)[8],
                                                     float (&scr)[kM1Groups][2]) {
  constexpr int kG = kM1Groups;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    load_a_rows(rec + s_off + static_cast<unsigned>(kModel1NopeDims + 32 * ks), ar[ks]);
  }
  const auto widen = [&](int g, unsigned (&f)[8][4]) {  // steps 0..3: one group (two fp8 chunks of 32 bytes)
    widen_group<2>(rec + s_off + static_cast<unsigned>(64 * g), f);
  };
  if constexpr (kNoMma<Cfg>) {  // timing only: the products left out, their operands still loaded
    widen(0, kf[0]);
    scores_without_products<4>(kf[0], ar, acc, racc);
  } else {  // a group's 16 registers at a time
    scores_products<kG, 4>(widen, dq, dqr, kf, ar, acc, racc);
  }
  // The scales of tokens r0 and r0 + 8 (byte g: group g's), loaded after the products so that
  // their registers are not held across them.
  {
    const unsigned at = rec + static_cast<unsigned>(r0 * kTokenBytes + kM1ScaleByte);
    const uint2 b0 = ptx::lds64(at), b1 = ptx::lds64(at + 8 * kTokenBytes);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      scr[g][0] = e8m0_to_float(((g < 4 ? b0.x : b0.y) >> (8 * (g & 3))) & 0xFFu);
      scr[g][1] = e8m0_to_float(((g < 4 ? b1.x : b1.y) >> (8 * (g & 3))) & 0xFFu);
    }
  }
  scale_scores(racc, acc, scr, s);
}

// The RoPE block's P (this thread's tokens r0, r0 + 8 of heads hA, hA + 1, hA + 8, hA + 9: s[8]
// in the accumulator order) as bf16 into chunk `pr`: one word a head, at k positions
// direct_m1_rope_kappa(r0) and + 1.
__device__ __forceinline__ void store_p_rope_model1(unsigned pr, const float (&s)[8], int hA, int r0) {
  const int kappa = direct_m1_rope_kappa(r0);
  const unsigned off = static_cast<unsigned>(2 * (kappa & 7));
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
    const int h = hA + 8 * nb;
    sts32(pr + swz(h, kappa >> 3) + off, f32x2_to_bf16x2(s[4 * nb], s[4 * nb + 2]));
    sts32(pr + swz(h + 1, kappa >> 3) + off, f32x2_to_bf16x2(s[4 * nb + 1], s[4 * nb + 3]));
  }
}

// O^T += V^T P^T of one block: the A fragments of all eight m-blocks loaded from the slot `rec`
// (then the slot released: `empty`), the products on P's chunks p0 (group g at p0 + 2048 g, the
// RoPE's at p0 + 2048 x 7). Warp w, lane (i, q).
template <class Cfg>
__device__ __forceinline__ void direct_pv_model1(unsigned rec, unsigned p0, mbar_t* empty, float (&o)[64], int warp,
                                                 int i, int q) {
  constexpr int kG = kM1Groups;
  unsigned v[kG][2][4];  // [group][k32 step][fragment]
  const unsigned pv_off = static_cast<unsigned>(2 * q * kTokenBytes + 2 * (8 * warp + i));
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        unsigned hw[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int tk = 32 * ks + 16 * e + 8 * (j & 1) + (j >> 1);  // + 2 q in pv_off: direct_token
          hw[j] = ptx::lds16(rec + pv_off + static_cast<unsigned>(tk * kTokenBytes + 64 * g));
        }
        // Byte 0 of each token's pair is row r0's column, byte 1 row r0 + 8's.
        const unsigned x = ptx::prmt(hw[0], hw[1], 0x5140u), y = ptx::prmt(hw[2], hw[3], 0x5140u);
        v[g][ks][2 * e] = ptx::prmt(x, y, 0x5410u);
        v[g][ks][2 * e + 1] = ptx::prmt(x, y, 0x7632u);
      }
    }
  }
  unsigned vr[4][4];  // the RoPE block: [k16 step][fragment]
  const unsigned rv_off = static_cast<unsigned>(kModel1NopeDims + 4 * (8 * warp + i));
#pragma unroll
  for (int st = 0; st < 4; ++st) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // k 2 q, + 1 (hh 0) and 8 + 2 q, + 1 (hh 1)
      const int t0 = direct_m1_rope_token(16 * st + 8 * hh + 2 * q);
      const unsigned w0 = ptx::lds32(rec + rv_off + static_cast<unsigned>(t0 * kTokenBytes));
      const unsigned w1 = ptx::lds32(rec + rv_off + static_cast<unsigned>((t0 + 8) * kTokenBytes));
      vr[st][2 * hh] = ptx::prmt(w0, w1, 0x5410u);
      vr[st][2 * hh + 1] = ptx::prmt(w0, w1, 0x7632u);
    }
  }
  // Every read of the slot is done: each thread releases its own reads (direct_consumer.cuh).
  mbar_arrive(empty);
  if constexpr (kNoMma<Cfg>) {
#pragma unroll
    for (int k = 0; k < 56; ++k) o[k] += __uint_as_float(v[k >> 3][(k >> 2) & 1][k & 3] & 0x3F000000u);
#pragma unroll
    for (int k = 56; k < 64; ++k) o[k] += __uint_as_float(vr[k & 3][(k >> 2) & 1] & 0x3F000000u);
    return;
  }
  wgmma_fence();
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const unsigned long long dp = smem_desc_sw128(p0 + static_cast<unsigned>(2048 * g), 16, 1024);
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      wgmma_m64n16k32_e4m3_rs(o + 8 * g, v[g][ks], desc_advance(dp, 32 * ks), true);
      wgmma_m64n16k32_e4m3_rs(o + 8 * g, v[g][ks], desc_advance(dp, 64 + 32 * ks), true);
    }
  }
  const unsigned long long dr = smem_desc_sw128(p0 + 2048u * kG, 16, 1024);
#pragma unroll
  for (int st = 0; st < 4; ++st) {
    wgmma_m64n16k16_rs(o + 8 * kG, vr[st], desc_advance(dr, static_cast<unsigned>(32 * st)), true);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(o);
}

// The request's outputs from warpgroup 0's merged O^T in true units: head heads[k]'s columns
// direct_m1_column(mb, r0) and + 1 of every m-block, times f[k]; partial rows (split) or bf16.
__device__ __forceinline__ void write_outputs_model1(const DecodeKernelParams& kp, const Piece& pc, int r, int tok,
                                                     const float (&o)[64], const float (&f)[4], const int (&heads)[4],
                                                     int r0) {
  const MlaSparseParams& p = kp.p;
#pragma unroll
  for (int mb = 0; mb < 8; ++mb) {
    const int col = direct_m1_column(mb, r0);
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // head heads[k]: accumulator registers kr (row r0), kr + 2 (r0 + 8)
      const int head = heads[k];
      if (head >= p.num_heads) continue;
      const int kr = (k & 1) + 4 * (k >> 1);
      const float v0 = o[8 * mb + kr] * f[k], v1 = o[8 * mb + kr + 2] * f[k];
      if (pc.split) {
        float* dst =
            kp.run.partial_o + ((static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head) * kDimV + col;
        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
      } else {
        unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch + tok * p.out_stride_token +
                              head * p.out_stride_head + col;
        *reinterpret_cast<unsigned*>(dst) = f32x2_to_bf16x2(v0, v1);
      }
    }
  }
}

}  // namespace deca::mla::sm90
