// The JIT entry of the Hopper GQA decode kernels, fp8 (and bf16 / fp16: Traits::k16)
// (kernels/gqa/sm90/decode.cuh, tokens on M; decode_rows.cuh, rows on M when Cfg::kRowsOnM;
// skip.cuh, skip-softmax when Cfg::kSkip, up to 16 rows; skip_rows.cuh, skip-softmax at 32 and
// 64 rows; fp8 and 16-bit alike): a
// generated prologue defines `struct Cfg` (GqaKernelKey::spec, fp8_mma = kv::kWgmma) and includes
// this file.
// Same grid, block and parameters as the portable kernel's entry (kernels/gqa/sm80/entry.cuh).
#pragma once

#include "kernels/gqa/sm90/decode.cuh"
#include "kernels/gqa/sm90/decode_rows.cuh"
#include "kernels/gqa/sm90/skip.cuh"
#include "kernels/gqa/sm90/skip_rows.cuh"

extern "C" __global__ void __launch_bounds__(deca::gqa::sm90::Traits<Cfg>::kThreads,
                                             deca::gqa::sm90::Traits<Cfg>::kMinCtas)
    deca_gqa_decode(const __grid_constant__ deca::GqaParams params) {
  extern __shared__ __align__(128) unsigned char deca_smem[];  // aligned to 1024 inside
  // Programmatic dependent launch: the wait before anything reads or writes global memory, as
  // the portable kernel's entry says. The kernels' own set-up before their first global read
  // (shared-memory base and descriptors, the checked ring's slots) is a few dozen instructions,
  // no mbarrier or tensor map to overlap, so the wait stays here where no path can skip it.
  // The stamp build (kernels/gqa/stamps.cuh) reads the timer before the wait and stores it after.
  const unsigned long long t_entry = deca::gqa::stamp_now();
  deca::ptx::griddep_wait();
  deca::gqa::stamp_entry(t_entry);
  if constexpr (Cfg::kRowsOnM && deca::gqa::sm90::Traits<Cfg>::kSkip) {
    deca::gqa::sm90::gqa_decode_skip_rows_kernel<Cfg>(params, deca_smem);
  } else if constexpr (Cfg::kRowsOnM) {
    deca::gqa::sm90::gqa_decode_rows_kernel<Cfg>(params, deca_smem);
  } else if constexpr (deca::gqa::sm90::Traits<Cfg>::kSkip) {
    deca::gqa::sm90::gqa_decode_skip_kernel<Cfg>(params, deca_smem);
  } else {
    deca::gqa::sm90::gqa_decode_kernel<Cfg>(params, deca_smem);
  }
}
