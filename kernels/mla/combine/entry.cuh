// JIT entry of the MLA sparse combine (kernels/mla/combine/combine.cuh).
#pragma once

#include "kernels/mla/combine/combine.cuh"

// No __launch_bounds__: with one, ptxas aims at 8 CTAs per SM (32 registers) and spills.
extern "C" __global__ void
    deca_mla_sparse_combine(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  deca::mla::sparse_combine(kp);
}
