// JIT entry of the MLA sparse combine spread over the value dimensions (sparse_combine_split,
// kernels/mla/combine/combine.cuh; chosen by src/plan/mla_combine.hpp). Same entry name and parameter as
// kernels/mla/combine/entry.cuh; grid (num_heads, q_len, batch), kCombineSplitThreads threads.
#pragma once

#include "kernels/mla/combine/combine.cuh"

// One CTA per SM as the budget: without it ptxas interleaves each piece's load with its use (a
// few registers, but a round trip per piece again); with it all kCombineUnroll loads are issued
// together (about 100 registers).
extern "C" __global__ void __launch_bounds__(deca::mla::kCombineSplitThreads, 1)
    deca_mla_sparse_combine(const __grid_constant__ deca::mla::DecodeKernelParams kp) {
  deca::mla::sparse_combine_split(kp);
}
