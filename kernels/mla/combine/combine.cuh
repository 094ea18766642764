// Split-KV combine kernels, one warp per (request, query token, head) row, 8 rows per CTA
// (sparse_combine_split: one CTA per row, a warp per 128 of its value dims):
//  - sparse_combine: MLA sparse decode's pieces (kernels/mla/schedule/work.cuh: slots split_offsets[r] ..
//    split_offsets[r + 1] - 1 of run.partial_o / partial_lse), 512 dims, bf16 out. Unsplit
//    requests were finished by the decode kernel: their rows return at once. Launched with
//    programmatic dependent launch behind the decode kernel (griddepcontrol.wait comes before the
//    first read of anything the decode kernel or the scheduler before it wrote), and only when
//    there may be pieces to merge: with topk_length, or when the schedule cuts a request
//    (schedule_cuts_requests).
//  - generic_combine: the `combine` op (CombineParams: num_splits equal pieces, any dim_v,
//    strides, bf16 / fp16 / fp32 out), which the CPU reference specifies.
//  - sparse_combine_split: sparse_combine's merge with the same operations in the same order
//    (bitwise its output and LSE), spread so that a few long requests fill the GPU: one CTA of
//    kCombineSplitWarps warps per (request, token, head), each warp 128 of the 512 value dims;
//    the row's LSEs are loaded across the lanes (merge::warp_row_weights) and kCombineUnroll
//    pieces' values are in flight at once. sparse_combine keeps one warp per row whose lanes walk
//    the pieces one load round after another: at one request of 66 pieces that is 16 CTAs and
//    about 66 dependent L2 round trips (docs/perf-notes-mla.md, "Small batches").
// Grid: x = head groups of 8 (split: heads), y = query token, z = request.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/split_merge.cuh"
#include "kernels/mla/launch.cuh"
#include "kernels/mla/lse.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla {

__device__ __forceinline__ uint2 nan_bf16x4() { return make_uint2(0x7FC07FC0u, 0x7FC07FC0u); }

__device__ __forceinline__ float* combine_lse_at(const MlaSparseParams& p, int r, int i, int h) {
  return p.lse + r * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head;
}

// kExtra: a MODEL1 run (its stamp carries the extra cache's list, ScheduleStamp).
template <bool kExtra = false>
__device__ __forceinline__ void sparse_combine(const DecodeKernelParams& kp) {
  ptx::griddep_wait();
  const MlaSparseParams& p = kp.p;
  const SparseRun& run = kp.run;
  const int r = blockIdx.z;
  const int i = blockIdx.y;
  const int h = blockIdx.x * kCombineWarps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (h >= p.num_heads) return;
  auto* out = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch +
              i * p.out_stride_token + h * p.out_stride_head + lane * 4;
  if (!schedule_matches<kExtra>(p, run)) {
    // A reused schedule of another call shape (ScheduleStamp): the decode kernel wrote nothing.
#pragma unroll
    for (int k = 0; k < 4; ++k) *reinterpret_cast<uint2*>(out + 128 * k) = nan_bf16x4();
    if (p.lse != nullptr && lane == 0) *combine_lse_at(p, r, i, h) = __int_as_float(0x7FC00000);
    return;
  }
  const int first = run.split_offsets[r];
  const int count = run.split_offsets[r + 1] - first;
  if (count <= 1) return;

  constexpr int kDimV = 512;
  const long long rows_per_slot = static_cast<long long>(p.q_len) * p.num_heads;
  const long long row = (static_cast<long long>(first) * p.q_len + i) * p.num_heads + h;
  const float* lse = run.partial_lse + row;
  const float* o = run.partial_o + row * kDimV + lane * 4;
  const merge::RowWeights w =
      merge::row_weights(lse, rows_per_slot, count, p.attn_sink ? p.attn_sink + h : nullptr);

  float acc[4][4] = {};
  if (!w.empty) {
    for (int j = 0; j < count; ++j) {
      const float wj = merge::piece_weight(w, lse[j * rows_per_slot]);
      if (wj == 0.f) continue;
      const float* oj = o + j * rows_per_slot * kDimV;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(oj + 128 * k);
        acc[k][0] += wj * v.x;
        acc[k][1] += wj * v.y;
        acc[k][2] += wj * v.z;
        acc[k][3] += wj * v.w;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint2 packed;
    packed.x = ptx::pack2<false>(acc[k][0], acc[k][1]);
    packed.y = ptx::pack2<false>(acc[k][2], acc[k][3]);
    *reinterpret_cast<uint2*>(out + 128 * k) = packed;
  }
  if (p.lse != nullptr && lane == 0) *combine_lse_at(p, r, i, h) = final_lse(w.lse);
}

inline constexpr int kCombineUnroll = 16;  // pieces whose values one warp has in flight

template <bool kExtra = false>
__device__ __forceinline__ void sparse_combine_split(const DecodeKernelParams& kp) {
  ptx::griddep_wait();
  const MlaSparseParams& p = kp.p;
  const SparseRun& run = kp.run;
  const int r = blockIdx.z;
  const int i = blockIdx.y;
  const int h = blockIdx.x;
  const int chunk = static_cast<int>(threadIdx.x) / 32;  // value dims [128 chunk, 128 chunk + 128)
  const int lane = static_cast<int>(threadIdx.x) % 32;
  auto* out = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch + i * p.out_stride_token +
              h * p.out_stride_head + 128 * chunk + lane * 4;
  if (!schedule_matches<kExtra>(p, run)) {
    // A reused schedule of another call shape (ScheduleStamp): the decode kernel wrote nothing.
    *reinterpret_cast<uint2*>(out) = nan_bf16x4();
    if (p.lse != nullptr && threadIdx.x == 0) *combine_lse_at(p, r, i, h) = __int_as_float(0x7FC00000);
    return;
  }
  const int first = run.split_offsets[r];
  const int count = run.split_offsets[r + 1] - first;
  if (count <= 1) return;

  constexpr int kDimV = 512;
  const float neg_inf = -__int_as_float(0x7f800000);
  const long long rows_per_slot = static_cast<long long>(p.q_len) * p.num_heads;
  const long long row = (static_cast<long long>(first) * p.q_len + i) * p.num_heads + h;
  const float* lse = run.partial_lse + row;
  const float* o = run.partial_o + row * kDimV + 128 * chunk + lane * 4;
  const merge::RowWeights w =
      merge::warp_row_weights(lse, rows_per_slot, count, p.attn_sink ? p.attn_sink + h : nullptr);

  float acc[4] = {};
  if (!w.empty) {
    for (int base = 0; base < count; base += 32) {
      // This lane's piece of the group: its weight, shuffled to every lane in turn below.
      const int mine = base + lane;
      const float l = mine < count ? lse[mine * rows_per_slot] : neg_inf;
      const float wl = merge::piece_weight(w, l);
      const int n = count - base < 32 ? count - base : 32;
      for (int k0 = 0; k0 < n; k0 += kCombineUnroll) {
        float wj[kCombineUnroll];
        float4 v[kCombineUnroll];
        // Every load first, unpredicated (a predicated one is sunk to its use by ptxas, which
        // serializes the round trips again); past the row's last piece the address is clamped to
        // it. Lanes past the row's pieces hold weight 0, and a piece of weight 0 (empty, or past
        // the end) is loaded but never added, so whatever its row holds cannot leak in.
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          const int j = base + k0 + u < count ? base + k0 + u : count - 1;
          v[u] = *reinterpret_cast<const float4*>(o + j * rows_per_slot * kDimV);
        }
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) wj[u] = __shfl_sync(0xffffffffu, wl, k0 + u);
#pragma unroll
        for (int u = 0; u < kCombineUnroll; ++u) {
          if (wj[u] == 0.f) continue;
          acc[0] += wj[u] * v[u].x;
          acc[1] += wj[u] * v[u].y;
          acc[2] += wj[u] * v[u].z;
          acc[3] += wj[u] * v[u].w;
        }
      }
    }
  }
  uint2 packed;
  packed.x = ptx::pack2<false>(acc[0], acc[1]);
  packed.y = ptx::pack2<false>(acc[2], acc[3]);
  *reinterpret_cast<uint2*>(out) = packed;
  if (p.lse != nullptr && threadIdx.x == 0) *combine_lse_at(p, r, i, h) = final_lse(w.lse);
}

__device__ __forceinline__ void generic_combine(const CombineParams& p) {
  const int b = blockIdx.z;
  const int i = blockIdx.y;
  const int h = blockIdx.x * kCombineWarps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (h >= p.num_heads) return;
  const float* lse =
      p.partial_lse + b * p.pl_stride_batch + i * p.pl_stride_token + h * p.pl_stride_head;
  const float* o =
      p.partial_out + b * p.po_stride_batch + i * p.po_stride_token + h * p.po_stride_head;
  const merge::RowWeights w = merge::row_weights(lse, p.pl_stride_split, p.num_splits,
                                                 p.attn_sink ? p.attn_sink + h : nullptr);
  const long long oo = b * p.out_stride_batch + i * p.out_stride_token + h * p.out_stride_head;
  for (int d = lane; d < p.dim_v; d += 32) {
    float acc = 0.f;
    if (!w.empty) {
      for (int j = 0; j < p.num_splits; ++j) {
        const float wj = merge::piece_weight(w, lse[j * p.pl_stride_split]);
        if (wj != 0.f) acc += wj * o[j * p.po_stride_split + d];
      }
    }
    if (p.out_dtype == 0) {
      static_cast<unsigned short*>(p.out)[oo + d] = ptx::float_to_bf16_bits(acc);
    } else if (p.out_dtype == 1) {
      static_cast<unsigned short*>(p.out)[oo + d] = ptx::float_to_fp16_bits(acc);
    } else {
      static_cast<float*>(p.out)[oo + d] = acc;
    }
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[b * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] = w.lse;
  }
}

}  // namespace deca::mla
