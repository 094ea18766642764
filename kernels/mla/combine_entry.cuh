// JIT entry of the MLA sparse combine (kernels/mla/sparse_combine.cuh).
#pragma once

#include "kernels/mla/sparse_combine.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::kCombineThreads)
    deca_mla_sparse_combine(const __grid_constant__ deca::mla::SparseKernelParams kp) {
  deca::mla::sparse_combine(kp);
}
