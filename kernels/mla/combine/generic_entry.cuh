// JIT entry of the generic `combine` op on CUDA tensors (kernels/mla/combine/combine.cuh).
#pragma once

#include "kernels/mla/combine/combine.cuh"

// No __launch_bounds__: with one, ptxas aims at 8 CTAs per SM (32 registers) and spills.
extern "C" __global__ void
    deca_combine(const __grid_constant__ deca::CombineParams p) {
  deca::mla::generic_combine(p);
}
