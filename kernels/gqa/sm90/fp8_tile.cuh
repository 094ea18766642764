// One 128-token tile of GQA decode attention on the e4m3 wgmma, as docs/design-gqa-sm90.md
// formulates it (tokens on M, the query rows of one KV head on N = 8, the two-term split of q and
// P): the first step of the Hopper GQA kernel, checked alone by tests/gpu/gqa_sm90_fp8_tile_test.cpp
// (a "probe": one warpgroup, one tile, no pipeline) before the kernel is built around it.
//
//   S^T [128 x 8] = K [128 x 128] . (q_hi + q_lo)^T    two m64 halves, 4 k-steps of 32, 2 terms
//   softmax down the token axis (per query row: a column of S^T)
//   O^T [128 x 8] = V^T [128 x 128] . (P_hi + P_lo)^T  two m64 halves of d, 4 k-steps of tokens
//
// Every operand is K-major in shared memory with 128-byte rows in the 128-byte swizzle (wgmma has
// no transpose for 8-bit operands): K as stored (token rows of d bytes), q_hi / q_lo (query rows
// of d bytes), V^T (d rows of token bytes: V transposed while it is copied in, 4 x 4 byte blocks
// through prmt) and P_hi / P_lo (query rows of token bytes, written by the softmax).
#pragma once

#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/sm90/fp8_tile_traits.cuh"
#include "kernels/gqa/sm90/tile_ops.cuh"

namespace deca::gqa::sm90 {

using namespace ::deca::sm90;

// acc[h] = A[h] . (B_hi + B_lo)^T for the two m64 halves h of A (rows 64 h .., 8192 B apart),
// K = 128 in four k-steps of 32 bytes: 16 wgmma in one group, waited for before returning.
__device__ __forceinline__ void two_term_product(float (&acc)[2][4], unsigned a, unsigned b_hi,
                                                 unsigned b_lo) {
  wgmma_fence();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long da = smem_desc_sw128(a + 8192 * h + 32 * kk, 16, 1024);
      wgmma_m64n8k32_e4m3_ss(acc[h], da, smem_desc_sw128(b_hi + 32 * kk, 16, 1024), kk > 0);
      wgmma_m64n8k32_e4m3_ss(acc[h], da, smem_desc_sw128(b_lo + 32 * kk, 16, 1024), true);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(acc[0]);
  fence_regs(acc[1]);
}

// This thread's two columns (query rows 2 (l % 4) + c) of an m64n8 accumulator folded down the
// rows: over the lanes that hold the column (l / 4), then warp w's result into part[8 w + row].
// The caller synchronises the CTA before column_total reads the four warps' parts.
template <bool kMax>
__device__ __forceinline__ void column_partials(float (&v)[2], float* part, int w, int l) {
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    for (int m = 4; m < 32; m <<= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v[c], m);
      v[c] = kMax ? fmaxf(v[c], o) : v[c] + o;
    }
  }
  if (l < 4) {
    part[w * 8 + 2 * l] = v[0];
    part[w * 8 + 2 * l + 1] = v[1];
  }
}
template <bool kMax>
__device__ __forceinline__ float column_total(const float* part, int row) {
  return kMax ? fmaxf(fmaxf(part[row], part[8 + row]), fmaxf(part[16 + row], part[24 + row]))
              : part[row] + part[8 + row] + part[16 + row] + part[24 + row];
}

__device__ __forceinline__ void fp8_tile_probe(const Fp8TileProbeParams& p, unsigned char* smem) {
  const unsigned raw = ptx::smem_addr(smem);
  const unsigned base = (raw + 1023u) & ~1023u;
  float* s_max = reinterpret_cast<float*>(smem + (base - raw) + Fp8TilePlan::kMax);
  float* s_sum = reinterpret_cast<float*>(smem + (base - raw) + Fp8TilePlan::kSum);
  float* s_qscale = reinterpret_cast<float*>(smem + (base - raw) + Fp8TilePlan::kQScale);
  const int t = threadIdx.x;
  const int w = t >> 5;
  const int l = t & 31;

  // K as stored: 1024 units of 16 bytes, eight per thread.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int u = t + kTileThreads * i;
    const int row = u >> 3;
    const uint4 v = *reinterpret_cast<const uint4*>(p.k + row * kTileDim + (u & 7) * 16);
    sts128(base + Fp8TilePlan::kK + swz128(row, (u & 7) * 16), v);
  }
  // V^T: thread t takes d 4 (t % 32) .. + 3 of tokens 32 (t / 32) .. + 31, four tokens at a time.
  {
    const int d0 = 4 * l;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int tok = 32 * w + 4 * g;
      unsigned rows[4], cols[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) rows[j] = *reinterpret_cast<const unsigned*>(p.v + (tok + j) * kTileDim + d0);
      transpose4x4(rows, cols);
#pragma unroll
      for (int j = 0; j < 4; ++j) sts32(base + Fp8TilePlan::kVt + swz128(d0 + j, tok), cols[j]);
    }
  }
  // q: row t / 16, d 8 (t % 16) .. + 7, scaled per row by the power of two that puts its largest
  // magnitude in [128, 256), then split into two e4m3 terms.
  {
    const int row = t >> 4;
    const int d0 = 8 * (t & 15);
    float x[8];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[j] = p.q[row * kTileDim + d0 + j];
      amax = fmaxf(amax, fabsf(x[j]));
    }
#pragma unroll
    for (int m = 1; m < 16; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    int ex = 0;
    frexpf(amax, &ex);  // amax = f 2^ex, f in [0.5, 1)
    const float scale = amax > 0.f ? ldexpf(1.f, 8 - ex) : 1.f;
    unsigned hi[2], lo[2];
    kv::split_e4m3_f32(x[0] * scale, x[1] * scale, x[2] * scale, x[3] * scale, hi[0], lo[0]);
    kv::split_e4m3_f32(x[4] * scale, x[5] * scale, x[6] * scale, x[7] * scale, hi[1], lo[1]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      sts32(base + Fp8TilePlan::kQhi + swz128(row, d0 + 4 * j), hi[j]);
      sts32(base + Fp8TilePlan::kQlo + swz128(row, d0 + 4 * j), lo[j]);
    }
    if ((t & 15) == 0) s_qscale[row] = 1.f / scale;
  }
  fence_proxy_async_smem();
  __syncthreads();

  // S^T = K (q_hi + q_lo)^T: thread (w, l) holds tokens 64 h + 16 w + l / 4 (+ 8) of rows
  // 2 (l % 4) (+ 1): s[h][0] (token, row), [1] (token, row + 1), [2] (token + 8, row), [3].
  float s[2][4];
  two_term_product(s, base + Fp8TilePlan::kK, base + Fp8TilePlan::kQhi, base + Fp8TilePlan::kQlo);

  // Softmax down the tokens, base 2, the scales folded in per query row.
  const int r0 = 2 * (l & 3);
  const float kLog2e = 1.4426950408889634f;
  float f[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) f[c] = s_qscale[r0 + c] * p.k_scale * p.softmax_scale * kLog2e;
  float mx[2] = {__int_as_float(0xff800000), __int_as_float(0xff800000)};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[h][i] *= f[i & 1];
      mx[i & 1] = fmaxf(mx[i & 1], s[h][i]);
    }
  }
  column_partials<true>(mx, s_max, w, l);
  __syncthreads();
  float row_max[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int c = 0; c < 2; ++c) row_max[c] = column_total<true>(s_max, r0 + c);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      pr[i] = ptx::ex2(s[h][i] - row_max[i & 1]);
      sum[i & 1] += pr[i];
    }
    // P scaled by 256 into e4m3 range, two terms; byte i of hi / lo is pr[i].
    unsigned hi, lo;
    kv::split_e4m3_f32(256.f * pr[0], 256.f * pr[1], 256.f * pr[2], 256.f * pr[3], hi, lo);
    const int tok = 64 * h + 16 * w + (l >> 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = r0 + (i & 1);
      const int tk = tok + 8 * (i >> 1);
      sts8(base + Fp8TilePlan::kPhi + swz128(row, tk), (hi >> (8 * i)) & 0xFFu);
      sts8(base + Fp8TilePlan::kPlo + swz128(row, tk), (lo >> (8 * i)) & 0xFFu);
    }
  }
  column_partials<false>(sum, s_sum, w, l);
  fence_proxy_async_smem();
  __syncthreads();

  // O^T = V^T (P_hi + P_lo)^T: thread (w, l) holds d 64 m + 16 w + l / 4 (+ 8) of rows r0, r0 + 1.
  float o[2][4];
  two_term_product(o, base + Fp8TilePlan::kVt, base + Fp8TilePlan::kPhi, base + Fp8TilePlan::kPlo);

  float total[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) total[c] = column_total<false>(s_sum, r0 + c);
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = r0 + (i & 1);
      const int d = 64 * m + 16 * w + (l >> 2) + 8 * (i >> 1);
      p.out[row * kTileDim + d] = o[m][i] * (p.v_scale / 256.f) / total[i & 1];
    }
  }
  if (w == 0 && l < 4) {
    const float kLn2 = 0.6931471805599453f;
#pragma unroll
    for (int c = 0; c < 2; ++c) p.lse[r0 + c] = (row_max[c] + ptx::lg2(total[c])) * kLn2;
  }
}

}  // namespace deca::gqa::sm90
