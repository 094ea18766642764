// Split-KV combine kernels, one warp per (request, query token, head) row, 8 rows per CTA:
//  - sparse_combine: MLA sparse decode's pieces (kernels/mla/schedule/work.cuh: slots split_offsets[r] ..
//    split_offsets[r + 1] - 1 of run.partial_o / partial_lse), 512 dims, bf16 out. Unsplit
//    requests were finished by the decode kernel: their rows return at once. Launched with
//    programmatic dependent launch behind the decode kernel (griddepcontrol.wait comes before the
//    first read of anything the decode kernel or the scheduler before it wrote), and only when
//    there may be pieces to merge: with topk_length, or when the schedule cuts a request
//    (schedule_cuts_requests).
//  - generic_combine: the `combine` op (CombineParams: num_splits equal pieces, any dim_v,
//    strides, bf16 / fp16 / fp32 out), which the CPU reference specifies.
// Grid: x = head groups of 8, y = query token, z = request.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/split_merge.cuh"
#include "kernels/mla/launch.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla {

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
    const uint2 nan2 = make_uint2(0x7FC07FC0u, 0x7FC07FC0u);  // bf16 NaN pairs
#pragma unroll
    for (int k = 0; k < 4; ++k) *reinterpret_cast<uint2*>(out + 128 * k) = nan2;
    if (p.lse != nullptr && lane == 0) {
      p.lse[r * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] =
          __int_as_float(0x7FC00000);
    }
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
  if (p.lse != nullptr && lane == 0) {
    p.lse[r * p.lse_stride_batch + i * p.lse_stride_token + h * p.lse_stride_head] = w.lse;
  }
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
