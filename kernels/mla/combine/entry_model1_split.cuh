// JIT entry of the split MLA sparse combine (kernels/mla/combine/entry_split.cuh) behind a MODEL1
// decode: the schedule's stamp compared with the extra cache's list too, as entry_model1.cuh.
#pragma once

#include "kernels/mla/combine/combine.cuh"

// One CTA per SM as the budget: without it ptxas interleaves each piece's load with its use (a
// few registers, but a round trip per piece again); with it all kCombineUnroll loads are issued
// together (about 100 registers).
extern "C" __global__ void __launch_bounds__(deca::mla::kCombineSplitThreads, 1)
    deca_mla_sparse_combine(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  deca::mla::sparse_combine_split<true>(kp);
}
