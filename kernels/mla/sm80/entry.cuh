// JIT entry of the portable MLA sparse decode kernel (kernels/mla/sm80/decode.cuh). Grid:
// x = head blocks of 64, y = query token, z = scheduler partition; kThreads threads, kSmemBytes
// of dynamic shared memory. One CTA per SM: the plan holds 161 KB of shared memory.
#pragma once

#include "kernels/mla/sm80/decode.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::portable::kThreads, 1)
    deca_mla_sparse_decode(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  extern __shared__ __align__(128) unsigned char deca_smem[];
  deca::mla::portable::decode<false>(kp, deca_smem);
}
