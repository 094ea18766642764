// JIT entry of the sparse decode scheduler (kernels/mla/schedule/kernel.cuh) for one cache: V3.2
// sparse and dense decode. One CTA of kScheduleThreads threads.
#pragma once

#include "kernels/mla/schedule/kernel.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::kScheduleThreads)
    deca_mla_sparse_schedule(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  deca::mla::schedule_kernel<false>(kp);
}
