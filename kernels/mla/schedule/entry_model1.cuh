// JIT entry of the sparse decode scheduler (kernels/mla/schedule/kernel.cuh) for MODEL1: every
// request's work list is the first cache's blocks, then the extra cache's, and the stamp carries
// extra_topk and whether extra_topk_length was given. Same entry name and launch shape as
// kernels/mla/schedule/entry.cuh.
#pragma once

#include "kernels/mla/schedule/kernel.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::kScheduleThreads)
    deca_mla_sparse_schedule(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  deca::mla::schedule_kernel<true>(kp);
}
