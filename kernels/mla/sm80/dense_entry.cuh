// JIT entry of the portable MLA dense decode kernel (kernels/mla/sm80/decode.cuh with the block
// table as token source). The generated prologue defines, before including this file:
//   struct Cfg {
//     static constexpr bool kChecked = false;  // block ids and cache lengths range-tested
//     static constexpr int kKvFormat = 0;      // MlaKvFormat of the cache's records
//   };
// Launch shape, shared memory and parameters are the sparse entry's (kernels/mla/sm80/entry.cuh).
#pragma once

#include "kernels/mla/sm80/decode.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::portable::kThreads, 1)
    deca_mla_dense_decode(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  extern __shared__ __align__(128) unsigned char deca_smem[];
  deca::mla::portable::decode<Cfg::kChecked, true, Cfg::kKvFormat>(kp, deca_smem);
}
