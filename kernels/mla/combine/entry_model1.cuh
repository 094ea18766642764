// JIT entry of the MLA sparse combine (kernels/mla/combine/combine.cuh) behind a MODEL1 decode:
// the same merge, the schedule's stamp compared with the extra cache's list too. Same entry name
// and launch shape as kernels/mla/combine/entry.cuh.
#pragma once

#include "kernels/mla/combine/combine.cuh"

// No __launch_bounds__, as in entry.cuh.
extern "C" __global__ void
    deca_mla_sparse_combine(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  deca::mla::sparse_combine<true>(kp);
}
