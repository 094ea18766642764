// The sparse decode scheduler kernel: the phases of schedule_requests into the workspace on the
// caller's stream, reading topk_length (and MODEL1's extra_topk_length) from device memory
// (graph-safe: a replay schedules the lengths of the replay). Entries: entry.cuh (one cache:
// V3.2 sparse, dense), entry_model1.cuh (MODEL1's two caches).
//
// Only the walk (phase 2) is serial: thread 0 carries (request, block) from one partition to the
// next in registers, with one load per request (none without topk_length). Block counts, piece
// counts, the offset scan and the slots run on all threads. The one-thread version of every
// phase (a chain of shared-memory read-modify-writes per step) took 33-39 us on the H200 at
// 128 requests, on the critical path of every decode call (ncu, ec2-r2 round). The partitions and
// offsets are staged in dynamic shared memory when they fit (the launcher gives it whenever they
// fit in 48 KB) and written back together; without it (huge batches) the phases work on global
// memory directly.
#pragma once

#include "kernels/common/cta_scan.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "kernels/mla/launch.cuh"

namespace deca::mla {

// Inclusive scan of a[1 .. n] in place by the whole CTA (kScheduleThreads threads, a multiple of
// 32): each thread scans a contiguous chunk, the chunk totals are scanned with warp shuffles.
__device__ __forceinline__ void schedule_block_scan(int* a, int n) {
  __shared__ int s_warp[kScheduleThreads / 32];
  const int t = threadIdx.x;
  const int chunk = (n + kScheduleThreads - 1) / kScheduleThreads;
  const int lo = 1 + t * chunk;
  const int hi = min(n, (t + 1) * chunk);
  int sum = 0;
  for (int r = lo; r <= hi; ++r) {
    sum += a[r];
    a[r] = sum;
  }
  const int base = cta_exclusive_scan<kScheduleThreads>(sum, s_warp).before;
  for (int r = lo; r <= hi; ++r) a[r] += base;
}

// The whole scheduler on one CTA of kScheduleThreads threads; kExtra: both caches' lists.
template <bool kExtra>
__device__ __forceinline__ void schedule_kernel(const DecodeKernelParams& kp) {
  namespace m = deca::mla;
  // The decode kernel may take its SMs and set up its barriers now; its griddepcontrol.wait
  // still waits for this grid's writes.
  deca::ptx::griddep_launch_dependents();
  // The decode kernels read the parts as const; only this kernel writes them.
  auto* g_parts = const_cast<m::SparsePart*>(kp.run.parts);
  auto* g_offsets = const_cast<int*>(kp.run.split_offsets);
  const int batch = kp.p.batch;
  const int num_parts = kp.run.num_parts;
  const int t = threadIdx.x;
  constexpr int nt = m::kScheduleThreads;
  unsigned dynamic_smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_smem));
  // Layout when staged: parts [num_parts], offsets [batch + 1].
  extern __shared__ __align__(16) unsigned char deca_smem[];
  m::SparsePart* parts = dynamic_smem ? reinterpret_cast<m::SparsePart*>(deca_smem) : g_parts;
  int* offsets = dynamic_smem ? reinterpret_cast<int*>(parts + num_parts) : g_offsets;
  __shared__ int s_total;

  const m::TopkLists lists = m::topk_lists<kExtra>(kp.p);
  const int uniform = m::uniform_blocks(lists);
  int total = batch * (uniform + m::kFixedOverheadBlocks);
  if (uniform < 0) {
    if (t == 0) s_total = 0;
    __syncthreads();
    const int mine = m::schedule_stage_blocks(batch, lists, offsets, t, nt);
    atomicAdd(&s_total, mine);
    __syncthreads();
    total = s_total;
  }
  if (t == 0) m::schedule_walk(batch, uniform, offsets, total, num_parts, parts);
  __syncthreads();
  for (int r = t; r < batch; r += nt) offsets[r + 1] = 1;
  if (t == 0) offsets[0] = 0;
  __syncthreads();
  for (int i = t; i < num_parts; i += nt) {
    if (m::part_cuts_in(parts[i])) atomicAdd(&offsets[parts[i].begin_req + 1], 1);
  }
  __syncthreads();
  m::schedule_block_scan(offsets, batch);
  __syncthreads();
  m::schedule_fill_slots(num_parts, offsets, parts, t, nt);
  if (dynamic_smem) {
    __syncthreads();
    const int* src = reinterpret_cast<const int*>(parts);
    int* dst = reinterpret_cast<int*>(g_parts);
    const int part_words = num_parts * static_cast<int>(sizeof(m::SparsePart) / sizeof(int));
    for (int w = t; w < part_words; w += nt) dst[w] = src[w];
    for (int r = t; r <= batch; r += nt) g_offsets[r] = offsets[r];
  }
  // Unreachable when the workspace is sized as plan_mla_decode sizes it (slots <= batch +
  // num_parts): a trap beats writing partials past the end of the workspace.
  if (t == 0 && offsets[batch] > kp.run.max_slots) __trap();
  if (t == 0) *kp.run.stamp = m::schedule_stamp<kExtra>(kp.p, num_parts);
}

}  // namespace deca::mla
