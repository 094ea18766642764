// The JIT entry of the sm90a MLA sparse FP8 decode kernels. The generated prologue defines the
// Cfg struct config.cuh describes (src/cuda/mla_spec.cpp renders it from the head count's
// kernel_class) before including this file.
// Launch: grid (head_blocks(num_heads), q_len, num_parts), threads_of(Cfg::kDirect) threads,
// kSmemBytes dynamic shared memory (all from kernels/mla/sm90/traits.cuh); with kCluster = 2 a
// cluster dimension attribute (2, 1, 1) (jit::LaunchOptions::cluster). May be launched with
// programmatic dependent launch (it waits on griddepcontrol before reading the metadata) and
// releases its dependents (the combine kernel) when done. The TMA rows' kernels take the cache's
// tensor map as a second parameter.
#pragma once

#include "kernels/mla/sm90/decode.cuh"
#include "kernels/mla/sm90/direct.cuh"

// One CTA per SM (the shared memory allows no second): the register budget is 65536 / threads per
// thread at launch, rebalanced between the warpgroups with setmaxnreg.
#if defined(DECA_MLA_TMA_ROWS)
// The dense bf16 rows by TMA (Cfg::kTma; the prologue defines the macro beside it): the cache's
// tensor map is a second parameter (kernels/mla/schedule/work.cuh TensorMapBytes says why),
// whose address the copies name.
static_assert(deca::mla::sm90::kTmaRows<Cfg>, "DECA_MLA_TMA_ROWS comes with Cfg::kTma");
extern "C" __global__ void __launch_bounds__(deca::mla::sm90::kThreadsWide, 1)
    deca_mla_sparse_decode_sm90(const __grid_constant__ deca::mla::DecodeKernelParams params,
                                const __grid_constant__ deca::mla::TensorMapBytes kv_map) {
  extern __shared__ __align__(1024) unsigned char deca_smem[];
  deca::mla::sm90::mla_sparse_decode_sm90<Cfg>(params, deca_smem, &kv_map);
}
#else
static_assert(!deca::mla::sm90::kTmaRows<Cfg>, "Cfg::kTma comes with DECA_MLA_TMA_ROWS");
extern "C" __global__ void __launch_bounds__(deca::mla::sm90::threads_of(deca::mla::sm90::DirectOf<Cfg>::value), 1)
    deca_mla_sparse_decode_sm90(const __grid_constant__ deca::mla::DecodeKernelParams params) {
  extern __shared__ __align__(1024) unsigned char deca_smem[];
  if constexpr (deca::mla::sm90::kDirect<Cfg>) {
    deca::mla::sm90::mla_sparse_direct_sm90<Cfg>(params, deca_smem);
  } else {
    deca::mla::sm90::mla_sparse_decode_sm90<Cfg>(params, deca_smem);
  }
}
#endif
