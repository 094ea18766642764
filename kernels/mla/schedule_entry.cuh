// JIT entry of the sparse decode scheduler: schedule_sparse into the workspace on the caller's
// stream, reading topk_length from device memory (graph-safe: a replay schedules the lengths of
// the replay).
//
// The walk is serial (each partition starts where the last stopped), so it runs on one thread;
// its latency is the chain of loads it waits on. With dynamic shared memory for the lengths, the
// partitions and the offsets (the launcher gives it whenever the batch fits in 48 KB), the whole
// CTA stages topk_length with coalesced loads first, the walk touches only shared memory, and the
// CTA writes the results back together: a few microseconds less on the critical path of every
// decode call. Without it (huge batches) the same function runs on global memory directly.
#pragma once

#include "kernels/mla/sparse_schedule.cuh"
#include "kernels/mla/sparse_traits.cuh"

extern "C" __global__ void __launch_bounds__(deca::mla::kScheduleThreads)
    deca_mla_sparse_schedule(const __grid_constant__ deca::mla::SparseKernelParams kp) {
  using deca::mla::SparsePart;
  // The decode kernels read the parts as const; only this kernel writes them.
  auto* parts = const_cast<SparsePart*>(kp.run.parts);
  auto* offsets = const_cast<int*>(kp.run.split_offsets);
  const int batch = kp.p.batch;
  const int num_parts = kp.run.num_parts;
  unsigned dynamic_smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_smem));
  int slots;
  if (dynamic_smem == 0) {
    if (threadIdx.x != 0) return;
    slots = deca::mla::schedule_sparse(batch, kp.p.topk, kp.p.topk_length, num_parts, parts,
                                       offsets);
  } else {
    // Layout: parts [num_parts], offsets [batch + 1], lengths [batch].
    extern __shared__ __align__(16) unsigned char deca_smem[];
    auto* s_parts = reinterpret_cast<SparsePart*>(deca_smem);
    int* s_offsets = reinterpret_cast<int*>(s_parts + num_parts);
    int* s_lengths = s_offsets + batch + 1;
    const int* lengths = nullptr;
    if (kp.p.topk_length != nullptr) {
      for (int r = threadIdx.x; r < batch; r += blockDim.x) s_lengths[r] = kp.p.topk_length[r];
      lengths = s_lengths;
    }
    __shared__ int s_slots;
    __syncthreads();
    if (threadIdx.x == 0) {
      s_slots = deca::mla::schedule_sparse(batch, kp.p.topk, lengths, num_parts, s_parts,
                                           s_offsets);
    }
    __syncthreads();
    const int* src = reinterpret_cast<const int*>(s_parts);
    int* dst = reinterpret_cast<int*>(parts);
    const int part_words = num_parts * static_cast<int>(sizeof(SparsePart) / sizeof(int));
    for (int w = threadIdx.x; w < part_words; w += blockDim.x) dst[w] = src[w];
    for (int r = threadIdx.x; r <= batch; r += blockDim.x) offsets[r] = s_offsets[r];
    if (threadIdx.x != 0) return;
    slots = s_slots;
  }
  // Unreachable when the workspace is sized as plan_mla_decode sizes it (slots <= batch +
  // num_parts): a trap beats writing partials past the end of the workspace.
  if (slots > kp.run.max_slots) __trap();
}
