// The consumer warpgroups of the sm90a MLA sparse decode wide kernel (decode.cuh): S = Q K^T on
// wgmma, the online softmax, P V split between the two, and the outputs; and the softmax pieces
// the direct kernel shares (row_ref, output_factors, store_lse).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/lse.cuh"
#include "kernels/mla/model1.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = __builtin_bit_cast(float, 0xff800000u);

// O *= the rescale factor of its row: a warp's m64n256 accumulator holds rows r0 (a0) and
// r0 + 8 (a1) in alternating pairs.
__device__ __forceinline__ void scale_rows(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= a0;
    o[4 * i + 1] *= a0;
    o[4 * i + 2] *= a1;
    o[4 * i + 3] *= a1;
  }
}
// scale_rows, left out when every factor of the warp's 16 rows is 1 (the lazy maxima of
// online_softmax make that the common case after the first blocks). The rows of a warp are the
// same in both consumers, so both skip the same blocks.
__device__ __forceinline__ void rescale(float (&o)[128], float a0, float a1) {
  if (!__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) scale_rows(o, a0, a1);
}

// A row's reference for the exponentials from its running maximum: 0 while no valid key was
// seen (-inf), which keeps -inf - -inf = NaN out and still gives exp2(-inf) = 0 for the masked
// entries and the (empty) old state.
__device__ __forceinline__ float row_ref(float m) { return m == kNegInf ? 0.f : m; }

// The sum over the four lanes of a quad (the columns of a row the accumulator layout spreads).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// A value of each of this thread's rows r0 (a0) and r0 + 8 (a1): O's rescale factors, or a
// block's row maxima (block_max).
struct RowFactors {
  float a0, a1;
};
// The pieces of a block's online softmax over kN8 n8 blocks of tokens (8: the whole block on one
// warpgroup), for this thread's rows r0 and r0 + 8 (accumulator layout below; c = lane % 4).
// S of invalid ids (-1, past topk_length, outside the pool) set to -inf before the max.
template <int kN8>
__device__ __forceinline__ void mask_invalid(float (&s)[4 * kN8], const int* ids, int c) {
#pragma unroll
  for (int i = 0; i < kN8; ++i) {
    const int2 v = *reinterpret_cast<const int2*>(ids + 8 * i + 2 * c);
    if (v.x < 0) s[4 * i] = s[4 * i + 2] = kNegInf;
    if (v.y < 0) s[4 * i + 1] = s[4 * i + 3] = kNegInf;
  }
}
// The rows' maxima of S over the tokens (the quad's lanes hold the columns), unscaled.
template <int kN8>
__device__ __forceinline__ RowFactors block_max(const float (&s)[4 * kN8]) {
  float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
  for (int i = 0; i < kN8; ++i) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  return RowFactors{mx0, mx1};
}
// From the block's maxima mx0, mx1 (unscaled): the running maxima m0, m1 moved, S -> P =
// exp2(S sl2 - ref) in place, the sums l0, l1 rescaled and increased, P packed as the A fragments
// of P V (k step kk: tokens 16 kk .., n8 blocks 2 kk and 2 kk + 1). Returns the rows' factors for
// O. The maxima are lazy: a row keeps its running maximum until a block's exceeds it by more than
// 8 (log2 units), so P <= 2^8 and O's rescale (128 FMUL per thread in each consumer) is rare
// after the first blocks; the sums and O carry the same reference, so the output is the same up
// to f32 rounding.
template <int kN8>
__device__ __forceinline__ RowFactors softmax_rows(float (&s)[4 * kN8], float mx0, float mx1, float sl2, float& m0,
                                                   float& m1, float& l0, float& l1, unsigned (&pa)[kN8 / 2][4]) {
  constexpr float kSlack = 8.f;
  const float mn0 = mx0 * sl2 > m0 + kSlack ? fmaxf(m0, mx0 * sl2) : m0;
  const float mn1 = mx1 * sl2 > m1 + kSlack ? fmaxf(m1, mx1 * sl2) : m1;
  const float ref0 = row_ref(mn0);
  const float ref1 = row_ref(mn1);
  const RowFactors a{ptx::ex2(m0 - ref0), ptx::ex2(m1 - ref1)};
  m0 = mn0;
  m1 = mn1;
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int i = 0; i < kN8; ++i) {
    s[4 * i] = ptx::ex2(fmaf(s[4 * i], sl2, -ref0));
    s[4 * i + 1] = ptx::ex2(fmaf(s[4 * i + 1], sl2, -ref0));
    s[4 * i + 2] = ptx::ex2(fmaf(s[4 * i + 2], sl2, -ref1));
    s[4 * i + 3] = ptx::ex2(fmaf(s[4 * i + 3], sl2, -ref1));
    sum0 += s[4 * i] + s[4 * i + 1];
    sum1 += s[4 * i + 2] + s[4 * i + 3];
  }
  l0 = l0 * a.a0 + sum0;
  l1 = l1 * a.a1 + sum1;
#pragma unroll
  for (int kk = 0; kk < kN8 / 2; ++kk) {
    pa[kk][0] = f32x2_to_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = f32x2_to_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = f32x2_to_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = f32x2_to_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
  return a;
}
// One block's online softmax on one warpgroup (64 tokens).
__device__ __forceinline__ RowFactors online_softmax(float (&s)[32], const int* ids, int c, float sl2, float& m0,
                                                     float& m1, float& l0, float& l1, unsigned (&pa)[4][4]) {
  mask_invalid<8>(s, ids, c);
  const RowFactors mx = block_max<8>(s);
  return softmax_rows<8>(s, mx.a0, mx.a1, sl2, m0, m1, l0, l1, pa);
}

// A request's output factors and LSE for rows r0 and r0 + 8 from their full sums l and maxima m:
// 1 / l (with the sink for a final output) and (m + log2 l) ln 2; a row with no valid key gets
// zeros and LSE -inf (docs/semantics.md), sink or not.
__device__ __forceinline__ void output_factors(const MlaSparseParams& p, const Piece& pc, int head0, int r0,
                                               float l0, float l1, float m0, float m1, float (&f)[2],
                                               float (&lse)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = half == 0 ? l0 : l1;
    const float m = half == 0 ? m0 : m1;
    const int head = head0 + r0 + 8 * half;
    if (l == 0.f) {
      f[half] = 0.f;
      lse[half] = kNegInf;
    } else {
      lse[half] = (m + ptx::lg2(l)) * kLn2;
      float denom = l;
      if (!pc.split && p.attn_sink != nullptr && head < p.num_heads) {
        denom += ptx::ex2(p.attn_sink[head] * kLog2e - m);
      }
      f[half] = 1.f / denom;
    }
  }
}

// The LSE of rows r0 and r0 + 8 that are real heads: the piece's partial LSE, or the final one.
__device__ __forceinline__ void store_lse(const DecodeKernelParams& kp, const Piece& pc, int r, int tok, int head0,
                                          int r0, const float (&lse)[2]) {
  const MlaSparseParams& p = kp.p;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int head = head0 + r0 + 8 * half;
    if (head >= p.num_heads) continue;
    if (pc.split) {
      kp.run.partial_lse[(static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head] = lse[half];
    } else if (p.lse != nullptr) {
      p.lse[r * p.lse_stride_batch + tok * p.lse_stride_token + head * p.lse_stride_head] =
          final_lse(lse[half]);
    }
  }
}

// P's A fragments (pa[kk]: rows r0 and r0 + 8, columns 16 kk + 2c, + 1 and 16 kk + 8 + 2c, + 1)
// to and from the P slot (one K-major swizzled 64 x 64 chunk, element (row, col) at unit col / 8):
// the four registers of a k step are the four 8 x 8 matrices of one stmatrix / ldmatrix x4 whose
// lane l gives row 16 w + l % 8 + 8 ((l / 8) % 2) at unit 2 kk + l / 16. The slot is 1024-aligned,
// so k step kk's address is k step 0's xor 32 kk (the swizzle permutes units within a row). One
// instruction per k step instead of four 4-byte stores (loads), each still a whole row per matrix.
__device__ __forceinline__ unsigned p_lane_addr(unsigned p_slot, int warp, int lane) {
  return p_slot + swz(16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4);
}
__device__ __forceinline__ void store_p(unsigned at, const unsigned (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) stmatrix_x4(at ^ (32u * kk), pa[kk]);
}
__device__ __forceinline__ void load_p(unsigned at, unsigned (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) ptx::ldmatrix_x4(at ^ (32u * kk), pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
}

// ---- Consumers ------------------------------------------------------------------------------------
// Accumulator fragment of wgmma m64nN (PTX ISA "wgmma .m64nNk16 register fragment layout for
// accumulator D"): thread (warp w, lane l) holds rows r0 = 16 w + l / 4 and r0 + 8; for each n8
// block i, d[4i + 0, 1] = row r0, columns 8i + 2 (l % 4) + {0, 1}; d[4i + 2, 3] = row r0 + 8.

// Writes this warpgroup's half of O (columns col0 .. col0 + 255) scaled per row, for rows that
// are real heads.
__device__ __forceinline__ void store_o(const DecodeKernelParams& kp, const Piece& pc, int r,
                                        int tok, int head0, int r0, int c, int col0,
                                        const float (&o)[128], float f0, float f1) {
  const MlaSparseParams& p = kp.p;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int head = head0 + r0 + 8 * half;
    if (head >= p.num_heads) continue;
    const float f = half == 0 ? f0 : f1;
    if (pc.split) {
      float* dst = kp.run.partial_o +
                   ((static_cast<long long>(pc.slot) * p.q_len + tok) * p.num_heads + head) * kDimV +
                   col0 + 2 * c;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        *reinterpret_cast<float2*>(dst + 8 * i) =
            make_float2(o[4 * i + 2 * half] * f, o[4 * i + 2 * half + 1] * f);
      }
    } else {
      unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch +
                            tok * p.out_stride_token + head * p.out_stride_head + col0 + 2 * c;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        *reinterpret_cast<unsigned*>(dst + 8 * i) =
            f32x2_to_bf16x2(o[4 * i + 2 * half] * f, o[4 * i + 2 * half + 1] * f);
      }
    }
  }
}

// Whether a final output can go out as 16-byte stores of whole head rows: the base and every
// stride taken a multiple of 8 bf16 (the last dimension is contiguous; the API asks as much of
// the dimensions longer than 1, and a stride never taken does not count here either). The same
// for every thread.
__device__ __forceinline__ bool out_rows_aligned(const MlaSparseParams& p) {
  const long long strides = (p.batch > 1 ? p.out_stride_batch : 0) | (p.q_len > 1 ? p.out_stride_token : 0) |
                            (p.num_heads > 1 ? p.out_stride_head : 0);
  return ((reinterpret_cast<unsigned long long>(p.out) | static_cast<unsigned long long>(strides) * 2u) & 15u) == 0;
}

// store_o for a final bf16 output through shared memory: this warp's 16 rows of the warpgroup's
// 256 columns, scaled and rounded, go by stmatrix into the Q tile as plain rows of 512 bytes
// (pitch kOutPitch: the 16 extra bytes put the eight rows of a matrix in eight different bank
// groups), and one lane hands each real head's row to the bulk-copy unit (one 512-byte
// cp.async.bulk per row, no registers held). The direct stores write 16 bytes of 8 rows per
// instruction (8 half sectors): at the end of a launch every CTA writes its outputs at once, and
// those were a measurable part of a launch's drain (docs/perf-notes-mla.md). The Q tile is
// free here: the request's last S = Q K^T completed (consumer 0 waited for its last P V,
// consumer 1 for out_ready); the copies' reads of it are waited for before this returns, and the
// next load_q waits for both warpgroups (kBarQFree, out_free).
constexpr int kOutPitch = 528;
static_assert(2 * kHeadsPerCta * kOutPitch <= kTileBytes, "both halves of O fit the Q tile");
__device__ __forceinline__ void store_o_staged(const MlaSparseParams& p, const Smem& sm, int r, int tok, int head0,
                                               int warp, int lane, int col0, const float (&o)[128], float f0,
                                               float f1) {
  const unsigned half = sm.q() + static_cast<unsigned>(col0 / 256) * (kHeadsPerCta * kOutPitch);
  const unsigned at = half + static_cast<unsigned>(16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * kOutPitch +
                      16u * static_cast<unsigned>(lane >> 4);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const unsigned v[4] = {f32x2_to_bf16x2(o[8 * j] * f0, o[8 * j + 1] * f0),
                           f32x2_to_bf16x2(o[8 * j + 2] * f1, o[8 * j + 3] * f1),
                           f32x2_to_bf16x2(o[8 * j + 4] * f0, o[8 * j + 5] * f0),
                           f32x2_to_bf16x2(o[8 * j + 6] * f1, o[8 * j + 7] * f1)};
    stmatrix_x4(at + 32u * j, v);
  }
  fence_proxy_async_smem();  // the generic stores, seen by the bulk copies' async-proxy reads
  __syncwarp();
  if (lane == 0) {
    unsigned short* dst = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch + tok * p.out_stride_token + col0;
    for (int rr = 0; rr < 16; ++rr) {
      const int row = 16 * warp + rr;
      if (head0 + row >= p.num_heads) break;
      bulk_store_global(dst + (head0 + row) * p.out_stride_head, half + row * kOutPitch, 512);
    }
    bulk_commit();
    bulk_wait_read();
  }
  __syncwarp();
}

// The chunks of 64 dims QK^T runs over: 9 (576), or MODEL1's 8 (512).
template <class Cfg>
inline constexpr int kQkChunks = kModel1<Cfg> ? kModel1Dim / 64 : kDimQK / 64;

// Pulls the next request's Q rows (64 x 1152 B = 576 lines of 128 B; MODEL1 1024 B) into L2
// while this one runs: load_q then waits for L2, not HBM.
template <class Cfg>
__device__ __forceinline__ void prefetch_q(const MlaSparseParams& p, int r, int tok, int head0, int t) {
  constexpr int kLines = kQkChunks<Cfg>;
  const char* q = static_cast<const char*>(p.q);
  for (int line = t; line < kHeadsPerCta * kLines; line += 128) {
    const int head = head0 + line / kLines;
    if (head >= p.num_heads) break;
    prefetch_l2(q + 2 * (r * p.q_stride_batch + tok * p.q_stride_token + head * p.q_stride_head) +
                128 * (line % kLines));
  }
}

// Q into the Q tile by one warpgroup (thread t).
template <class Cfg>
__device__ __forceinline__ void load_q(const MlaSparseParams& p, const Smem& sm, int r, int tok,
                                       int head0, int t) {
  constexpr int kUnits = 8 * kQkChunks<Cfg>;
  static_assert(kHeadsPerCta * kUnits % 128 == 0, "whole rounds of the warpgroup");
  const char* q = static_cast<const char*>(p.q);
  // 64 rows x 72 (MODEL1 64) units of 16 B; rows past num_heads are zero-filled, their q never read.
#pragma unroll 4
  for (int i = 0; i < kHeadsPerCta * kUnits / 128; ++i) {
    const int job = t + 128 * i;
    const int row = job / kUnits;
    const int u = job % kUnits;
    const int head = head0 + row;
    const bool valid = head < p.num_heads;
    const char* src = valid ? q + 2 * (r * p.q_stride_batch + tok * p.q_stride_token +
                                       head * p.q_stride_head) + 16 * u
                            : q;
    ptx::cp_async_16(sm.q() + (u >> 3) * kChunkBytes + swz(row, u & 7), src, valid);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  fence_proxy_async_smem();
  named_bar_sync(kBarQReady, 128);
}

// S = Q K^T into s, issued and committed (not waited for): A = Q (K-major, rows = heads), B = K
// (K-major, rows = tokens); k step kk reads 16 columns = 32 B at byte 32 (kk % 4) of chunk kk / 4.
template <class Cfg>
__device__ __forceinline__ void issue_qk(float (&s)[32], unsigned long long dq, unsigned tile) {
  wgmma_fence();
  const unsigned long long dk = smem_desc_sw128(tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 4 * kQkChunks<Cfg>; ++kk) {
    const unsigned off = (kk >> 2) * kChunkBytes + (kk & 3) * 32;
    wgmma_m64n64k16_ss<0>(s, desc_advance(dq, off), desc_advance(dk, off), kk > 0);
  }
  wgmma_commit();
}

// O[:, 0:256] += P V, issued and committed: A = P from registers, B = V (MN-major: rows =
// tokens, 64 columns per chunk), k step kk is tokens 16 kk .. 16 kk + 15 = two 8-row groups
// (SBO 1024 B) at byte 2048 kk; the 256 columns are chunks 0..3 (LBO 8192 B), as two N = 128
// halves (columns 0..127: chunks 0, 1; 128..255: chunks 2, 3; sm90_ptx.cuh says why).
// Descriptors from the address per k step (4 here, not QK^T's 36): with desc_advance ptxas
// allocated the kernel so that a producer spilled.
__device__ __forceinline__ void issue_pv_left(float (&o)[128], const unsigned (&pa)[4][4], unsigned tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_m64n128k16_rs<1>(o, pa[kk], smem_desc_sw128(tile + 2048 * kk, kChunkBytes, 1024), true);
    wgmma_m64n128k16_rs<1>(o + 64, pa[kk], smem_desc_sw128(tile + 2 * kChunkBytes + 2048 * kk, kChunkBytes, 1024),
                           true);
  }
  wgmma_commit();
}

// The producers-only ablation: a consumer warpgroup releases each tile of the partition as soon as
// it is full, and does nothing else.
template <class Cfg>
__device__ __forceinline__ void release_only(const DecodeKernelParams& kp, const SparsePart& part,
                                             const Smem& sm, int lane) {
  int it = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r) {
    const Piece pc = piece_of<Cfg>(kp, part, r);
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      wait_tile<Cfg, ClusterOf<Cfg>::value>(sm, it & 1, (it >> 1) & 1);
      if (lane == 0) release_tile<ClusterOf<Cfg>::value>(sm, it & 1);
    }
  }
}

// Consumer 0: per request Q into the Q tile; per block S = Q K^T, the mask and the online
// softmax, P and the row factors handed to consumer 1 (config.cuh kPInRegs says how and in which
// order against its own P V), O[:, 0:256] += P V; per request the output factors for consumer 1,
// its half of the outputs and the LSE.
template <class Cfg>
__device__ __forceinline__ void consumer0(const DecodeKernelParams& kp, const SparsePart& part,
                                          int tok, int head0, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const int c = lane & 3;
  // 0: 1 / sqrt(d_qk), as the CPU reference reads the params (576; MODEL1's 512).
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale
                                             : (kModel1<Cfg> ? 0.044194173824159216f : 0.041666666666666664f);
  const float sl2 = scale * kLog2e;
  const unsigned p_at = p_lane_addr(sm.p(), warp, lane);

  float o[128];
  float s[32];
  int it = 0;
  int nreq = 0;
  const bool staged_out = out_rows_aligned(p);
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of<Cfg>(kp, part, r);
    if (nreq > 0) {
      // The previous request's outputs may have been staged in the Q tile (store_o_staged): every
      // warp of both warpgroups has read its rows back before the next Q lands there. Consumer
      // 1 reads the factors and its rows, then arrives (phase nreq - 1 of out_free).
      named_bar_sync(kBarQFree, 128);
      mbar_wait(sm.out_free(), (nreq - 1) & 1);
    }
    if (pc.blk_begin < pc.blk_end) load_q<Cfg>(p, sm, r, tok, head0, t);
    if (r < part.end_req) prefetch_q<Cfg>(p, r + 1, tok, head0, t);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
    const unsigned long long dq = smem_desc_sw128(sm.q(), 16, 1024);
    // One block from its S (waited for here) to its P V issued: the mask, the online softmax,
    // P to registers and to consumer 1, O rescaled; the caller waits for P V.
    const auto softmax_and_pv = [&](unsigned tile) {
      if constexpr (kNoMma<Cfg>) {
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = 0.f;
      } else {
        wgmma_wait<0>();
        fence_regs(s);
      }
      unsigned pa[4][4];
      const auto [a0, a1] = online_softmax(s, sm.ids(it), c, sl2, m0, m1, l0, l1, pa);
      // P and the row factors to consumer 1. WG1 may still be reading the previous block's
      // (phase it - 1 of p_free).
      const auto hand_over_p = [&] {
        if (it > 0) mbar_wait(sm.p_free(), (it - 1) & 1);
        store_p(p_at, pa);
        if (c == 0) {
          sm.row_scale()[r0] = a0;
          sm.row_scale()[r0 + 8] = a1;
        }
        if constexpr (!kPInRegs<Cfg>) fence_proxy_async_smem();
        mbar_arrive(sm.p_ready());
      };
      // Without a cluster this warpgroup's P V is issued first and the hand-over (stores, proxy
      // fence, arrival) runs while it executes; consumer 1's P V queues behind it on the tensor
      // cores either way.
      if constexpr (kPInRegs<Cfg>) hand_over_p();
      rescale(o, a0, a1);
      if constexpr (!kNoMma<Cfg>) issue_pv_left(o, pa, tile);
      if constexpr (!kPInRegs<Cfg>) hand_over_p();
    };
    // Every wgmma of this warpgroup done (P V the last one), then the block's tile released.
    const auto wait_and_release = [&](int stage) {
      if constexpr (!kNoMma<Cfg>) {
        wgmma_wait<0>();
        fence_regs(o);
      }
      if (lane == 0) release_tile<kCl>(sm, stage);
    };
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      const unsigned tile = sm.k(stage);
      wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
      if constexpr (!kNoMma<Cfg>) issue_qk<Cfg>(s, dq, tile);
      softmax_and_pv(tile);
      wait_and_release(stage);
    }

    // Epilogue: full row sums, then the output factor (1 / l, with the sink for a final
    // output) shared with WG1 and the LSE.
    float f[2], lse[2];
    output_factors(p, pc, head0, r0, quad_sum(l0), quad_sum(l1), m0, m1, f, lse);
    // Consumer 1 read the previous request's factors before its out_free arrival, which this
    // warpgroup waited for before the request's Q.
    float* out_scale = sm.out_scale();
    if (c == 0) {
      out_scale[r0] = f[0];
      out_scale[r0 + 8] = f[1];
    }
    mbar_arrive(sm.out_ready());
    if (!pc.split && staged_out) {
      store_o_staged(p, sm, r, tok, head0, warp, lane, 0, o, f[0], f[1]);
    } else {
      store_o(kp, pc, r, tok, head0, r0, c, 0, o, f[0], f[1]);
    }
    if (c == 0) store_lse(kp, pc, r, tok, head0, r0, lse);
  }
  // Matches WG1's arrival after the partition's last block.
  if (it > 0) mbar_wait(sm.p_free(), (it - 1) & 1);
}

// Consumer 1: per block P and the row factors from consumer 0, O[:, 256:512] rescaled and += P V;
// per request the output factors from consumer 0, then its half of the outputs.
template <class Cfg>
__device__ __forceinline__ void consumer1(const DecodeKernelParams& kp, const SparsePart& part,
                                          int tok, int head0, const Smem& sm) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  const int t = threadIdx.x - 128;
  const int warp = t >> 5, lane = t & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const int c = lane & 3;
  const bool staged_out = out_rows_aligned(kp.p);
  float o[128];
  int it = 0;
  int nreq = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r, ++nreq) {
    const Piece pc = piece_of<Cfg>(kp, part, r);
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      const unsigned tile = sm.k(stage);
      // Acquire the producers' tile for this warpgroup's own async-proxy reads.
      wait_tile<Cfg, kCl>(sm, stage, (it >> 1) & 1);
      mbar_wait(sm.p_ready(), it & 1);
      const float a0 = sm.row_scale()[r0];
      const float a1 = sm.row_scale()[r0 + 8];
      // In a cluster P's A fragments come from where consumer 0 stored its own (same thread
      // layout); P's slot and the factors are then free.
      [[maybe_unused]] unsigned pa[4][4];
      if constexpr (kPInRegs<Cfg>) {
        load_p(p_lane_addr(sm.p(), warp, lane), pa);
        mbar_arrive(sm.p_free());
      }
      rescale(o, a0, a1);
      // O[:, 256:512] += P V: A = P (registers, or K-major 64 x 64 in shared memory, k step kk at
      // byte 32 kk), B = V chunks 4..7 as in consumer 0, in N = 128 halves (columns 256..383:
      // chunks 4, 5; 384..511: chunks 6, 7; sm90_ptx.cuh says why).
      if constexpr (!kNoMma<Cfg>) {
        wgmma_fence();
        const unsigned long long dp = smem_desc_sw128(sm.p(), 16, 1024);
        const unsigned long long dv = smem_desc_sw128(tile + 4 * kChunkBytes, kChunkBytes, 1024);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if constexpr (kPInRegs<Cfg>) {
            wgmma_m64n128k16_rs<1>(o, pa[kk], desc_advance(dv, 2048 * kk), true);
            wgmma_m64n128k16_rs<1>(o + 64, pa[kk], desc_advance(dv, 2 * kChunkBytes + 2048 * kk), true);
          } else {
            wgmma_m64n128k16_ss<1>(o, desc_advance(dp, 32 * kk), desc_advance(dv, 2048 * kk), true);
            wgmma_m64n128k16_ss<1>(o + 64, desc_advance(dp, 32 * kk),
                                   desc_advance(dv, 2 * kChunkBytes + 2048 * kk), true);
          }
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
      }
      if constexpr (!kPInRegs<Cfg>) mbar_arrive(sm.p_free());
      if (lane == 0) release_tile<kCl>(sm, stage);
    }
    mbar_wait(sm.out_ready(), nreq & 1);
    const float* out_scale = sm.out_scale();
    const float f0 = out_scale[r0], f1 = out_scale[r0 + 8];
    // Staged through the Q tile's chunks 4..7, out_free also says this warpgroup's rows are read
    // back (consumer 0 waits for it before the next Q); direct stores (split pieces, fp32) need
    // nothing of the tile, so consumer 0 is released as soon as the factors are read.
    if (!pc.split && staged_out) {
      store_o_staged(kp.p, sm, r, tok, head0, warp, lane, 256, o, f0, f1);
      mbar_arrive(sm.out_free());
    } else {
      mbar_arrive(sm.out_free());
      store_o(kp, pc, r, tok, head0, r0, c, 256, o, f0, f1);
    }
  }
}

}  // namespace deca::mla::sm90
