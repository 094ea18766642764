// The JIT entry point. A generated prologue defines `struct Cfg` (the specialization constants)
// and then includes this file; the module exports one extern "C" kernel.
#pragma once

#include "kernels/gqa/sm80/decode.cuh"

// The register budget is told the occupancy the shared memory allows (2 CTAs per SM for most
// shapes): without it ptxas may aim at 3 and spill.
extern "C" __global__ void __launch_bounds__(deca::gqa::Traits<Cfg>::kThreads,
                                             deca::gqa::Traits<Cfg>::kMinCtas)
    deca_gqa_decode(const __grid_constant__ deca::GqaParams params) {
  extern __shared__ __align__(128) unsigned char deca_smem[];
  // Programmatic dependent launch (sm_90+): every global access of the kernel (seq_lens, q, the
  // page table, the cache and its scales, the fused step's new tokens, the split workspace and
  // its counters, out, LSE, the check record) may touch what the previous kernel in the stream
  // writes or reads, so nothing comes before the wait; what PDL hides here is the launch and the
  // CTAs' placement. The trigger for the next grid is in finish_cta (epilogue.cuh).
  deca::ptx::griddep_wait();
  deca::gqa::gqa_decode_kernel<Cfg>(params, deca_smem);
}
