// JIT entry of the checked portable MLA sparse decode kernel (issue 9): the same kernel as
// kernels/mla/sm80/entry.cuh with its index and topk_length tests compiled in (they record the
// first offender in SparseRun::check). Same entry name, launch shape and shared memory.
#pragma once

#include "kernels/mla/sm80/decode.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::portable::kThreads, 1)
    deca_mla_sparse_decode(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  extern __shared__ __align__(128) unsigned char deca_smem[];
  deca::mla::portable::decode<true>(kp, deca_smem);
}
