// JIT entry of the sparse decode scheduler: one thread runs schedule_sparse into the workspace on
// the caller's stream, reading topk_length from device memory (graph-safe: a replay schedules the
// lengths of the replay). The whole walk is a few microseconds for thousands of requests.
#pragma once

#include "kernels/mla/sparse_schedule.cuh"

extern "C" __global__ void __launch_bounds__(32)
    deca_mla_sparse_schedule(const __grid_constant__ deca::mla::SparseKernelParams kp) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  // The decode kernels read the parts as const; only this kernel writes them.
  auto* parts = const_cast<deca::mla::SparsePart*>(kp.run.parts);
  auto* offsets = const_cast<int*>(kp.run.split_offsets);
  const int slots = deca::mla::schedule_sparse(kp.p.batch, kp.p.topk, kp.p.topk_length,
                                               kp.run.num_parts, parts, offsets);
  // Unreachable when the workspace is sized as plan_mla_decode sizes it (slots <= batch +
  // num_parts): a trap beats writing partials past the end of the workspace.
  if (slots > kp.run.max_slots) __trap();
}
