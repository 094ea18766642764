// Thread-block clusters and the bulk-copy unit (sm_90), one wrapper per instruction with its PTX
// syntax: the cluster rank and barrier, mapa, st.async into a peer CTA's shared memory, and
// cp.async.bulk between global memory, this CTA's shared memory and a peer's, and the tensor
// copy (TMA) multicast into the cluster's CTAs.
#pragma once

#include <cuda/ptx>
#include <cuda/std/cstdint>

namespace deca::sm90 {

// ---- Thread-block clusters (PTX ISA 9.7.13.4 barrier.cluster, 9.7.9.24 mapa, 9.7.9.12 st.async) --
// %cluster_ctarank through cuda::ptx.
__device__ __forceinline__ unsigned cluster_ctarank() { return cuda::ptx::get_sreg_cluster_ctarank(); }
// barrier.cluster.arrive.release; barrier.cluster.wait.acquire; -- every thread of every CTA of
// the cluster; also a barrier for the CTA's own threads.
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}
// barrier.cluster.arrive.relaxed; barrier.cluster.wait.acquire; -- the same rendezvous without
// ordering this thread's earlier memory accesses: after fence.mbarrier_init (which makes the
// barrier inits visible to the cluster by itself), so that loads issued before it need not
// complete first.
__device__ __forceinline__ void cluster_sync_relaxed() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}
// mapa.shared::cluster.u32 d, a, rank; -- the address of `a` (shared::cta) in CTA `rank`'s
// window; a CTA's window is contiguous, so the result minus `a` is a constant offset.
__device__ __forceinline__ unsigned mapa_shared(unsigned smem_addr, unsigned rank) {
  unsigned d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(smem_addr), "r"(rank));
  return d;
}
// st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [addr], {a, b, c, d}, [mbar];
// -- 16 bytes into another CTA's shared memory; the 16 bytes complete on that CTA's mbarrier,
// whose waiters then see the data.
__device__ __forceinline__ void st_async_v4(unsigned cluster_addr, uint4 v, unsigned cluster_mbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
          cluster_addr),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(cluster_mbar)
      : "memory");
}

// cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [src], size, [mbar];
// -- `size` bytes (a multiple of 16, both addresses 16-byte aligned) of this CTA's shared memory
// copied by the bulk-copy unit into another CTA's, completing on that CTA's mbarrier. (CCCL's
// cuda::ptx::cp_async_bulk takes generic pointers; the kernels hold 32-bit shared::cluster
// addresses from mapa.) The source must be visible to the async proxy: fence.proxy.async after
// the generic stores, and a barrier between the storing threads and the issuing one.
__device__ __forceinline__ void bulk_copy_to_peer(unsigned cluster_dst, unsigned smem_src, unsigned bytes,
                                                  unsigned cluster_mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          cluster_dst),
      "r"(smem_src), "r"(bytes), "r"(cluster_mbar)
      : "memory");
}

// cp.async.bulk.global.shared::cta.bulk_group [dst], [src], bytes; -- shared -> global by the
// bulk-copy unit (16-byte aligned, a multiple of 16 bytes), then commit_group and
// wait_group.read 0: the copies' reads of shared memory done (their global writes complete with
// the grid). The copy itself written here for a shared-window address (CCCL's takes a generic
// pointer); commit and wait through cuda::ptx.
__device__ __forceinline__ void bulk_store_global(void* dst, unsigned smem_src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_src), "r"(bytes)
               : "memory");
}
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [mbar];
// -- global -> this CTA's shared memory by the bulk-copy unit (both 16-byte aligned, a multiple
// of 16 bytes), completing `bytes` of the mbarrier's transaction count. Shared-window addresses
// (this CTA's are valid shared::cluster ones).
__device__ __forceinline__ void bulk_load_shared(unsigned smem_dst, const void* src, unsigned bytes,
                                                 unsigned smem_mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_dst),
      "l"(src), "r"(bytes), "r"(smem_mbar)
      : "memory");
}
// cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster
//     [dst], [tmap, {c0, c1, c2}], [mbar], mask;
// -- PTX ISA 9.7.9.25.5.1 (cp.async.bulk.tensor, sm_90a for .multicast::cluster): the box of the
// tensor map `tmap` at coordinates {c0, c1, c2} (innermost first, in elements) copied by the TMA
// unit into the shared memory of every CTA of the cluster whose rank bit is set in `mask`, at
// the same CTA-relative offset as `smem_dst` in each, completing its bytes on the mbarrier at
// `smem_mbar`'s offset in each destination CTA. The box's bytes count in full whether or not
// they lie inside the tensor: elements outside it are written as zeros. `tmap` is the generic
// address of a CUtensorMap-sized object in the kernel's __grid_constant__ parameter (or in
// global / const memory), 64-byte aligned.
__device__ __forceinline__ void tma_load_3d_multicast(unsigned smem_dst, const void* tmap, int c0, int c1, int c2,
                                                      unsigned smem_mbar, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(smem_mbar), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void bulk_commit() { cuda::ptx::cp_async_bulk_commit_group(); }
__device__ __forceinline__ void bulk_wait_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }

}  // namespace deca::sm90
