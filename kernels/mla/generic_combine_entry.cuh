// JIT entry of the generic `combine` op on CUDA tensors (kernels/mla/sparse_combine.cuh).
#pragma once

#include "kernels/mla/sparse_combine.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::kCombineThreads)
    deca_combine(const __grid_constant__ deca::CombineParams p) {
  deca::mla::generic_combine(p);
}
