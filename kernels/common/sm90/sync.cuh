// Synchronisation for the warp-specialized Hopper kernels, one wrapper per instruction with its PTX
// syntax: register reallocation (setmaxnreg), named barriers, mbarriers and the async-proxy
// fences (through CCCL's cuda::ptx where it has them). Needs sm_90a (setmaxnreg). Programmatic
// dependent launch (griddepcontrol): kernels/common/ptx.cuh.
#pragma once

#include <cuda/ptx>
#include <cuda/std/cstdint>

namespace deca::sm90 {

// ---- Register reallocation (PTX ISA 9.7.19.5, setmaxnreg, sm_90a) --------------------------------
// setmaxnreg.inc.sync.aligned.u32 N; / setmaxnreg.dec.sync.aligned.u32 N; -- warpgroup-wide.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- Named barriers (PTX ISA 9.7.13.1, barrier) ---------------------------------------------------
// barrier.sync id, count;   -- arrive and wait until `count` threads (a multiple of 32) arrived.
// barrier.arrive id, count; -- arrive without waiting (the producer side of a one-way signal).
// Not the .aligned forms (bar.sync / bar.arrive): .aligned promises that every thread of the CTA
// executes the same barrier instruction, and warp-specialized roles meet on one id from different
// instructions (both consumers' epilogue sync, one side's arrive against the other's sync).
// compute-sanitizer synccheck reports that as "divergent thread(s) in block".
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// barrier.red.and.pred out, id, count, in; -- barrier.sync that also returns whether `in` held
// in every one of the `count` threads: a decision all of them take alike (wgmma's .aligned
// instructions need the warpgroup's threads on one path).
__device__ __forceinline__ bool named_bar_all(int id, int count, bool in) {
  unsigned out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbarrier.red.and.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(out)
      : "r"(static_cast<unsigned>(in)), "r"(id), "r"(count)
      : "memory");
  return out != 0;
}

// ---- mbarrier (through cuda::ptx, PTX ISA 9.7.13.15) ---------------------------------------------
using mbar_t = cuda::std::uint64_t;  // an mbarrier object in shared memory (8-byte aligned)
// mbarrier.init.shared::cta.b64 [addr], count;
__device__ __forceinline__ void mbar_init(mbar_t* bar, unsigned count) {
  cuda::ptx::mbarrier_init(bar, count);
}
// mbarrier.arrive.shared::cta.b64 state, [addr]; (release, cta scope)
__device__ __forceinline__ void mbar_arrive(mbar_t* bar) {
  (void)cuda::ptx::mbarrier_arrive(bar);
}
// mbarrier.try_wait.parity.shared::cta.b64 done, [addr], parity; in a loop until the phase with
// that parity has completed (acquire, cta scope).
__device__ __forceinline__ void mbar_wait(mbar_t* bar, unsigned parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
// mbarrier.test_wait.parity.shared::cta.b64 done, [addr], parity; -- whether that phase has
// completed, without waiting (acquire, cta scope, when it has).
__device__ __forceinline__ bool mbar_test(mbar_t* bar, unsigned parity) {
  return cuda::ptx::mbarrier_test_wait_parity(bar, parity);
}
// The same at cluster scope (mbar_wait_cluster's test).
__device__ __forceinline__ bool mbar_test_cluster(mbar_t* bar, unsigned parity) {
  return cuda::ptx::mbarrier_test_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, parity);
}
// mbarrier.arrive.expect_tx.release.cluster.shared::cta.b64 state, [addr], tx_count; -- one
// arrival that also raises the phase's expected transaction bytes (completed by another CTA's
// st.async, hence the cluster scope).
__device__ __forceinline__ void mbar_arrive_expect_tx(mbar_t* bar, unsigned bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                             cuda::ptx::space_shared, bar, bytes);
}
// mbarrier.arrive.release.cluster.shared::cluster.b64 _, [addr]; -- arrival on a barrier of
// another CTA of the cluster (`addr` from mapa).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned cluster_addr) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
}
// mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [addr]; -- the same arrival without
// the release: no ordering of this thread's earlier memory operations, so no MEMBAR.ALL.GPU in
// front of it (the release form costs one per arrival). For "I finished reading my tile"
// signals whose reads were already completed (wgmma.wait_group) before the arrival issues.
__device__ __forceinline__ void mbar_arrive_cluster_relaxed(unsigned cluster_addr) {
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
               : "memory");
}
// mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [addr], parity; in a loop: for
// barriers that other CTAs of the cluster arrive on or complete bytes on (their writes, and the
// reads they finished before arriving, are ordered before what follows).
__device__ __forceinline__ void mbar_wait_cluster(mbar_t* bar, unsigned parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar,
                                              parity)) {
  }
}
// mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [addr], tx_count; -- as
// mbar_arrive_expect_tx at CTA scope (no MEMBAR.ALL.GPU): the bytes that complete the phase are
// counted by the barrier whatever the scope of this arrival.
__device__ __forceinline__ void mbar_arrive_expect_tx_cta(mbar_t* bar, unsigned bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, bar, bytes);
}
// fence.mbarrier_init.release.cluster; -- makes the inits visible before any other thread
// (or the async proxy) uses the barriers.
__device__ __forceinline__ void fence_mbar_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
// fence.proxy.async.shared::cta; -- generic-proxy writes to shared memory become visible to the
// async proxy (wgmma reads its shared operands through it).
__device__ __forceinline__ void fence_proxy_async_smem() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

}  // namespace deca::sm90
