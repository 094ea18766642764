// The shared-memory plan's accessors and the tile hand-overs of the sm90a MLA sparse decode wide
// kernel (decode.cuh says who arrives and waits where): named barrier ids, the tile stores (here
// and, in a cluster of 2, into the peer's tile), and the full / empty barriers' waits and
// arrivals.
#pragma once

#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// Hardware barrier ids (0 is __syncthreads). Counts are threads; sync/sync pairs rendezvous.
enum NamedBarrier : int {
  kBarQReady = 1,  // WG0 x 128: Q tile landed and fenced, wgmma may read it
  kBarQFree = 3,   // WG0 x 128: every warp read its staged output rows back (store_o_staged)
  kBarIds = 5,     // both producer warpgroups x 256: the block's ids are in smem
};

struct Smem {
  unsigned base;  // shared-window address of the 1024-aligned plan
  unsigned char* ptr;
  unsigned peer_delta;  // cluster of 2: the peer CTA's address of X is X + peer_delta
  __device__ __forceinline__ unsigned q() const { return base + SmemPlan::kQ; }
  __device__ __forceinline__ unsigned k(int stage) const {
    return base + SmemPlan::kK + stage * kTileBytes;
  }
  __device__ __forceinline__ unsigned p() const { return base + SmemPlan::kP; }
  __device__ __forceinline__ float* row_scale() const {
    return reinterpret_cast<float*>(ptr + SmemPlan::kRowScale);
  }
  __device__ __forceinline__ float* out_scale() const {
    return reinterpret_cast<float*>(ptr + SmemPlan::kOutScale);
  }
  // The ids of the block with running index `it` (slot it % kIdSlots).
  __device__ __forceinline__ int* ids(int it) const {
    return reinterpret_cast<int*>(ptr + SmemPlan::kIdx) + (it & (kIdSlots - 1)) * 64;
  }
  __device__ __forceinline__ mbar_t* full(int stage) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarFull) + stage;
  }
  __device__ __forceinline__ mbar_t* empty(int stage) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarEmpty) + stage;
  }
  // Completed by the peer's st.async bytes (cluster of 2).
  __device__ __forceinline__ mbar_t* remote(int stage) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarRemote) + stage;
  }
  __device__ __forceinline__ mbar_t* p_ready() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarPReady);
  }
  __device__ __forceinline__ mbar_t* p_free() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarPFree);
  }
  __device__ __forceinline__ mbar_t* out_ready() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarOutReady);
  }
  __device__ __forceinline__ mbar_t* out_free() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarOutFree);
  }
  __device__ __forceinline__ mbar_t* q_loaded() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarQLoaded);
  }
  __device__ __forceinline__ unsigned peer(unsigned smem_addr) const { return smem_addr + peer_delta; }
};

// Writes 16 bytes of the tile here and, in a cluster of 2, at the same place in the peer's tile
// (completing on the peer's remote barrier of that stage).
template <int kCl>
__device__ __forceinline__ void store_tile(const Smem& sm, unsigned addr, uint4 v, unsigned peer_bar) {
  sts128(addr, v);
  if constexpr (kCl == 2) st_async_v4(sm.peer(addr), v, peer_bar);
}

// The cluster's hand-overs are light: the remote arrival on the peer's empty barrier is relaxed
// (the tile's reads completed at wgmma.wait_group, before it issues) and every wait is at CTA
// scope (the peer's st.async bytes are made visible by the barrier's transaction count, not by
// the wait's scope). At cluster scope each consumer warp's remote arrival cost a MEMBAR.ALL.GPU
// and each wait an L1 invalidation (CCTL.IVALL), ~12 % of the warp-state samples at b128 h128.
__device__ __forceinline__ void wait_empty(const Smem& sm, int stage, unsigned parity) {
  mbar_wait(sm.empty(stage), parity);
}
// MODEL1's producers write 8 chunks a token (its 512 dims), not 9.
template <bool kModel1Tile = false>
__device__ __forceinline__ void expect_peer_bytes(const Smem& sm, int stage) {
  mbar_arrive_expect_tx_cta(sm.remote(stage), kModel1Tile ? kPeerBytes / 9 * 8 : kPeerBytes);
}

// A tile is ready when the local producers' 256 arrivals (and, in a cluster, the peer's bytes)
// completed its phase; it is released to both CTAs' producers of a cluster (each writes it).
template <class Cfg, int kCl>
__device__ __forceinline__ void wait_tile(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kNoProduce<Cfg>) return;
  mbar_wait(sm.full(stage), parity);
  if constexpr (kCl == 2) mbar_wait(sm.remote(stage), parity);
}
template <int kCl>
__device__ __forceinline__ void release_tile(const Smem& sm, int stage) {
  mbar_arrive(sm.empty(stage));
  if constexpr (kCl == 2) mbar_arrive_cluster_relaxed(sm.peer(ptx::smem_addr(sm.empty(stage))));
}

}  // namespace deca::mla::sm90
