// The shared-memory plan's accessors and the tile hand-overs of the sm90a MLA sparse decode
// kernel (decode.cuh says who arrives and waits where): named barrier ids, the tile stores
// (here and, in a cluster of 2, into the peer's tile), and the full / empty barriers' waits and
// arrivals at the scope Cfg::kSync picks.
#pragma once

#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/knobs.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// Hardware barrier ids (0 is __syncthreads). Counts are threads; arrive/sync pairs are one-way
// signals, sync/sync pairs rendezvous.
enum NamedBarrier : int {
  kBarQReady = 1,    // WG0 x 128, sync: Q tile landed and fenced, wgmma may read it
  kBarVote = 2,      // WG0 x 128, sync + AND: whether the next tile is full (kPHandOverlap)
  kBarQFree = 3,     // WG0 x 128, sync: every warp read its staged output rows back (store_o_staged)
  kBarNarrow = 4,    // WG0 x 128, sync: the column softmax's exchanges and P's stores (Cfg::kNarrow)
  kBarIds = 5,       // WG2 x 128, sync: the block's ids are in smem
  kBarPeerCopy = 6,  // a producer warpgroup x 128 (6, 7): its rows are stored and fenced (kPeerCopy)
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
  // Cfg::kSeesaw: consumer 0 loaded the request's Q, consumer 1 may read it (seesaw.cuh).
  __device__ __forceinline__ mbar_t* q_loaded() const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarQLoaded);
  }
  // Cfg::kStage: producer warp w's (0..7) barrier of half h (0, 1) of its staged records.
  __device__ __forceinline__ mbar_t* staged(int w, int h) const {
    return reinterpret_cast<mbar_t*>(ptr + SmemPlan::kBarStage) + 2 * w + h;
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

// A NoPE unit of the tile: store_tile, or only here for the no-peer ablations.
template <class Cfg, int kCl>
__device__ __forceinline__ void store_nope(const Smem& sm, unsigned addr, uint4 v, unsigned peer_bar) {
  if constexpr (kNoPeer<Cfg> || kBulkPeer<Cfg>) {
    sts128(addr, v);
  } else {
    store_tile<kCl>(sm, addr, v, peer_bar);
  }
}

// The cluster's hand-overs at the scope SyncOf<Cfg> picks (kCl == 1: local barriers only).
template <class Cfg, int kCl>
__device__ __forceinline__ void wait_empty(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kCl == 2 && SyncOf<Cfg>::value == kSyncCluster) {
    mbar_wait_cluster(sm.empty(stage), parity);
  } else {
    mbar_wait(sm.empty(stage), parity);
  }
}
template <class Cfg>
__device__ __forceinline__ void expect_peer_bytes(const Smem& sm, int stage) {
  // The no-peer ablations send the RoPE units alone: 32 tokens x 128 bytes.
  constexpr unsigned kBytes = kNoPeer<Cfg> ? (kTokens / 2) * 128 : kPeerBytes;
  if constexpr (SyncOf<Cfg>::value == kSyncCluster) {
    mbar_arrive_expect_tx(sm.remote(stage), kBytes);
  } else {
    mbar_arrive_expect_tx_cta(sm.remote(stage), kBytes);
  }
}

// A tile is ready when the local producer's 128 arrivals (and, in a cluster, the peer's bytes)
// completed its phase; it is released to both producers of a cluster (each writes it).
template <class Cfg, int kCl>
__device__ __forceinline__ void wait_tile(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kNoProduce<Cfg>) return;
  mbar_wait(sm.full(stage), parity);
  if constexpr (kCl == 2) {
    if constexpr (SyncOf<Cfg>::value == kSyncLight) {
      mbar_wait(sm.remote(stage), parity);
    } else {
      mbar_wait_cluster(sm.remote(stage), parity);
    }
  }
}
// Whether wait_tile would return at once (and, if so, the same acquire).
template <class Cfg, int kCl>
__device__ __forceinline__ bool tile_ready(const Smem& sm, int stage, unsigned parity) {
  if constexpr (kNoProduce<Cfg>) return true;
  bool ready = mbar_test(sm.full(stage), parity);
  if constexpr (kCl == 2) {
    if constexpr (SyncOf<Cfg>::value == kSyncLight) {
      ready = ready && mbar_test(sm.remote(stage), parity);
    } else {
      ready = ready && mbar_test_cluster(sm.remote(stage), parity);
    }
  }
  return ready;
}
template <class Cfg, int kCl>
__device__ __forceinline__ void release_tile(const Smem& sm, int stage) {
  mbar_arrive(sm.empty(stage));
  if constexpr (kCl == 2) {
    const unsigned peer_empty = sm.peer(ptx::smem_addr(sm.empty(stage)));
    if constexpr (SyncOf<Cfg>::value == kSyncLight) {
      mbar_arrive_cluster_relaxed(peer_empty);
    } else {
      mbar_arrive_cluster(peer_empty);
    }
  }
}

}  // namespace deca::mla::sm90
