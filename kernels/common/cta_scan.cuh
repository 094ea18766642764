// A prefix sum over the threads of one CTA, shared by the sparse MLA scheduler
// (kernels/mla/schedule/entry.cuh) and the Hopper GQA kernel's balanced schedule
// (kernels/gqa/sm90/decode.cuh): each thread holds one value (typically the sum of a contiguous
// chunk of the work), the lanes scan with shuffles, the warps' totals go through shared memory.
#pragma once

namespace deca {

struct CtaScan {
  int before;  // sum of the values of the threads below this one
  int total;   // sum over the CTA
};

// kThreads: the CTA's threads, a multiple of 32. warp_sums: kThreads / 32 ints of shared memory,
// written and then read after one __syncthreads (a second scan needs a barrier before it).
template <int kThreads>
__device__ __forceinline__ CtaScan cta_exclusive_scan(int v, int* warp_sums) {
  static_assert(kThreads % 32 == 0, "whole warps");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += x;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int before = incl - v, total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    total += warp_sums[w];
  }
  return CtaScan{before, total};
}

}  // namespace deca
