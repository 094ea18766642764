// MLA decode, Hopper (sm_90a): the wide kernel, for 17..128 heads (kernel_class in traits.cuh; at
// most 16 heads of the 656-byte token run direct.cuh). Warp-specialized: wgmma tensor cores fed by
// two producer warpgroups that gather and dequantize the tokens into a bf16 tile. Sparse decode
// selects the tokens by top-k indices; dense decode (Cfg::kDense, config.cuh) takes every token
// of a request through its block table, causal among the q_len new tokens (walk.cuh), from the
// 656-byte token or from bf16 / e4m3 rows (Cfg::kKvFormat, rows.cuh): only the producers differ.
//
// MODEL1 (Cfg::kKvFormat kMlaKvModel1, config.cuh kModel1): this kernel above 16 heads (at 16 or
// fewer the direct kernel, direct_model1.cuh); a request's blocks come from two caches
// (walk.cuh), the producers read the 584-byte token (model1.cuh) into the tile's first 8 chunks
// (its 512 dims), QK^T runs over those 8.
//
// Unit of work: one CTA = (block of 64 heads = grid x, query token = grid y, SM partition = grid
// z). The partition's SparsePart (kernels/mla/schedule/work.cuh) lists the requests and blocks of
// 64 top-k indices it owns; the CTA walks them in order and, per request piece, writes either the
// final bf16 output + LSE (unsplit request, sink applied) or the normalised fp32 partial + LSE of
// its slot (split request; the combine kernel merges the slots).
//
// Algorithm per block of 64 tokens: the producers convert each selected token's 656-byte record
// (512 e4m3 x 4 per-128 fp32 scales, 64 bf16 RoPE) into a row of a 128 B-swizzled bf16 K tile
// [64 tokens x 576] (exactly the reference's rounding); consumer 0 computes S = Q K^T [64 heads x
// 64 tokens] (num_heads padded to 64 rows), masks invalid ids and runs the online softmax in
// base 2 with the scale folded in; both consumers then add P V to their half of O [64 x 512],
// with V the same tile read MN-major (no second copy).
//
// Warp roles (512 threads, registers rebalanced with setmaxnreg after the setup: traits.cuh
// reg_budget):
//   WG0 (consumer 0): loads Q [64 heads x 576] of the request into shared memory (cp.async,
//       rows past num_heads zero-filled), S = Q K^T (36 x wgmma m64n64k16, both operands in
//       shared memory), the mask, the online softmax, P (bf16) to registers and to shared
//       memory, O[:, 0:256] += P V (A = P from registers), and the softmax state for the epilogue.
//   WG1 (consumer 1): O[:, 256:512] += P V with P from shared memory (or, in a cluster, loaded
//       into registers), after rescaling its O by WG0's per-row factors.
//   WG2, WG3 (producers): per block, the 64 ids staged for the consumers' masks, the L2 prefetch
//       of the next block's records, and each warpgroup's half of the block's tokens gathered,
//       dequantized and stored in whole 128-byte rows (producer.cuh). Invalid ids leave zero rows.
//
// Cluster of 2 (65..128 heads, two head blocks): the two CTAs of a request token need the same
// tiles, so each CTA's producers gather and dequantize 32 of the 64 tokens and write them into
// their own tile (st.shared) and the peer's (st.async, completing on the peer's `remote` barrier
// with kPeerBytes per block); the empty barriers count both CTAs' consumers. Dense bf16 rows by
// TMA (Cfg::kTma, rows.cuh): each CTA's copy unit multicasts half of the chunks into both tiles,
// and `remote` expects the whole tile's bytes.
//
// Pipeline: kStages = 2 K tiles. Per tile two mbarriers: full (256 producer arrivals, after
// fence.proxy.async so wgmma's async proxy sees the generic stores) and empty (one arrival per
// consumer warp once its wgmmas reading the tile completed). Two more mbarriers hand P and the
// row rescale factors from consumer 0 to consumer 1 (p_ready: 128 arrivals of consumer 0) and
// back (p_free: 128 arrivals of consumer 1 once its reads of P completed); out_ready / out_free
// do the same for a request's final output factors. These hand-overs between warpgroups are
// mbarriers, not named barriers of part of the CTA: compute-sanitizer racecheck orders nothing
// by the latter, and an mbarrier arrive / wait is release / acquire for each thread, which it
// follows. Named barriers (NamedBarrier, pipeline.cuh) remain inside one role.
//
// Files: config.cuh (the Cfg fields and the fixed choices), traits.cuh (launch facts,
// shared-memory plan, register budgets), pipeline.cuh (shared-memory accessors, tile stores and
// hand-overs), walk.cuh (the partition's request pieces and block cursors, where a record lies),
// dequant.cuh (e4m3 x scale -> bf16), layout.cuh (the tile's store addresses), producer.cuh,
// consumers.cuh; this file the kernel: setup, roles, teardown.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/producer.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// `kv_map`: the TMA rows' tensor map (Cfg::kTma; the entry's second parameter), else null.
template <class Cfg>
__device__ __forceinline__ void mla_sparse_decode_sm90(const DecodeKernelParams& kp, unsigned char* smem_raw,
                                                       const TensorMapBytes* kv_map = nullptr) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  static_assert(kCl == 1 || kCl == 2, "Cfg::kCluster: 1, or 2 for two head blocks");
  // Under programmatic dependent launch the scheduler's metadata may still be in flight: wait,
  // then load the partition and the stamp together before the barrier set-up, so that their
  // memory latency (the walk's first id loads wait on the partition) runs under it. (The
  // partition is read within the workspace whatever the stamp says; only a matching one is used.)
  ptx::griddep_wait();
  const SparsePart part = kp.run.parts[blockIdx.z];
  const bool matches = schedule_matches<kModel1<Cfg>>(kp.p, kp.run);
  const unsigned raw = ptx::smem_addr(smem_raw);
  Smem sm;
  sm.base = (raw + 1023u) & ~1023u;
  sm.ptr = smem_raw + (sm.base - raw);
  // Both CTAs of a cluster run the same kernel, so their plans sit at the same offsets.
  unsigned rank = 0;
  sm.peer_delta = 0;
  if constexpr (kCl == 2) {
    rank = cluster_ctarank();
    sm.peer_delta = mapa_shared(sm.base, rank ^ 1u) - sm.base;
  }

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(sm.full(s), 256);       // every producer thread
      mbar_init(sm.empty(s), 8 * kCl);  // lane 0 of each consumer warp (of both CTAs)
      mbar_init(sm.remote(s), 1);       // the local expect_tx arrival (+ the peer's bytes)
    }
    mbar_init(sm.p_ready(), 128);  // every consumer-0 thread
    mbar_init(sm.p_free(), 128);   // every consumer-1 thread
    mbar_init(sm.out_ready(), 128);
    mbar_init(sm.out_free(), 128);
    mbar_init(sm.q_loaded(), 128);  // unused (traits.cuh SmemPlan::kBarQLoaded)
    fence_mbar_init();
  }
  if constexpr (kNoProduce<Cfg>) {
    // Consumers only: finite tiles (zeros) and valid ids (0) in place of the producers' work.
    for (int i = threadIdx.x; i < (kStages * kTileBytes + kIdSlots * 64 * 4) / 16; i += blockDim.x) {
      const unsigned off = i < kStages * kTileBytes / 16
                               ? SmemPlan::kK + 16u * i
                               : SmemPlan::kIdx + 16u * (i - kStages * kTileBytes / 16);
      sts128(sm.base + off, make_uint4(0, 0, 0, 0));
    }
    fence_proxy_async_smem();
  }
  // In a cluster the peer's barriers must be initialised before its first remote arrival
  // (fence_mbar_init publishes them; the consumers-only ablation's zeroed tiles need the release).
  if constexpr (kCl == 2 && kNoProduce<Cfg>) {
    cluster_sync();
  } else if constexpr (kCl == 2) {
    cluster_sync_relaxed();
  } else {
    __syncthreads();
  }
  // A reused schedule of another call shape (ScheduleStamp): NaN outputs, no attention. Every CTA
  // of a cluster reads the same stamp, so both leave here or neither does.
  if (!matches) {
    fill_nan_outputs(kp.p, static_cast<int>(blockIdx.x) * kHeadsPerCta, kHeadsPerCta, static_cast<int>(blockIdx.y),
                     static_cast<int>(blockIdx.z), static_cast<int>(gridDim.z));
    check_schedule<Cfg>(kp);
    return;
  }

  const int tok = blockIdx.y;
  const int head0 = blockIdx.x * kHeadsPerCta;
  // Read through a shuffle so that ptxas sees a warp-uniform role: wgmma in a path it takes for
  // divergent is serialized (C7518: a wait after every wgmma).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  constexpr RegBudget kRegs = reg_budget(kCl);
  if (wg >= 2) {
    setmaxnreg_dec<kRegs.producer>();
    if constexpr (!kNoProduce<Cfg>) producer<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank), kv_map);
  } else if (wg == 0) {
    setmaxnreg_inc<kRegs.consumer0>();
    if constexpr (kNoConsume<Cfg>) {
      release_only<Cfg>(kp, part, sm, static_cast<int>(threadIdx.x & 31));
    } else {
      consumer0<Cfg>(kp, part, tok, head0, sm);
    }
  } else {
    static_assert(kRegs.consumer1 > launch_regs(kThreadsWide), "consumer 1 gains registers");
    setmaxnreg_inc<kRegs.consumer1>();
    if constexpr (kNoConsume<Cfg>) {
      release_only<Cfg>(kp, part, sm, static_cast<int>(threadIdx.x & 31));
    } else {
      consumer1<Cfg>(kp, part, tok, head0, sm);
    }
  }
  // The combine kernel (launched with programmatic dependent launch) may start; its
  // griddepcontrol.wait still sees every write of this grid.
  ptx::griddep_launch_dependents();
  // Neither CTA of a cluster may leave while the other can still write its tiles or arrive on
  // its barriers.
  if constexpr (kCl == 2) cluster_sync();
}

}  // namespace deca::mla::sm90
