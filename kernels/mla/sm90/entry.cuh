// The JIT entry of the sm90a MLA sparse FP8 decode kernel. The generated prologue defines, before
// including this file:
//   struct Cfg {
//     static constexpr int kPageSize = 64;  // tokens per cache block: id / kPageSize, id % kPageSize
//     static constexpr int kCluster = 1;    // optional (default 1); 2 only for 65..128 heads
//   };
// Launch: grid (head_blocks(num_heads), q_len, num_parts), threads_of(Cfg::kProducers) threads
// (kThreads = 384 with one producer), kSmemBytes dynamic shared memory (all from
// kernels/mla/sm90/traits.cuh); with kCluster = 2 a cluster dimension attribute (2, 1, 1)
// (jit::LaunchOptions::cluster). May be launched with programmatic dependent launch (it waits on
// griddepcontrol before reading the metadata) and releases its dependents (the combine kernel)
// when done.
#pragma once

#include "kernels/mla/sm90/decode.cuh"
#include "kernels/mla/sm90/direct.cuh"

// One CTA per SM (the shared memory allows no second): the register budget is 65536 / threads per
// thread at launch (384, or 512 with two producers), rebalanced between the warpgroups with
// setmaxnreg.
extern "C" __global__ void __launch_bounds__(
    deca::mla::sm90::threads_of(deca::mla::sm90::ProducersOf<Cfg>::value), 1)
    deca_mla_sparse_decode_sm90(const __grid_constant__ deca::mla::DecodeKernelParams params) {
  extern __shared__ __align__(1024) unsigned char deca_smem[];
  if constexpr (deca::mla::sm90::kDirect<Cfg>) {
    deca::mla::sm90::mla_sparse_direct_sm90<Cfg>(params, deca_smem);
  } else {
    deca::mla::sm90::mla_sparse_decode_sm90<Cfg>(params, deca_smem);
  }
}
