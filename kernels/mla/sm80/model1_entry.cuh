// JIT entry of the portable MLA sparse decode kernel for MODEL1 (kernels/mla/sm80/decode.cuh with
// kMlaKvModel1 records of two caches). The generated prologue defines, before including this file:
//   struct Cfg {
//     static constexpr bool kChecked = false;  // both caches' indices and lengths range-tested
//   };
// Launch shape, shared memory and parameters are the sparse entry's (kernels/mla/sm80/entry.cuh).
#pragma once

#include "kernels/mla/sm80/decode.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::portable::kThreads, 1)
    deca_mla_sparse_decode(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  extern __shared__ __align__(128) unsigned char deca_smem[];
  deca::mla::portable::decode<Cfg::kChecked, false, deca::kMlaKvModel1>(kp, deca_smem);
}
