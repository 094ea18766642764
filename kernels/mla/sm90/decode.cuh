// MLA sparse FP8 decode, Hopper (sm_90a), warp-specialized: wgmma tensor cores fed by a producer
// warpgroup that gathers and dequantizes the selected tokens.
//
// Unit of work: one CTA = (block of 64 heads = grid x, query token = grid y, SM partition = grid
// z). The partition's SparsePart (kernels/mla/schedule/work.cuh) lists the requests and blocks of
// 64 top-k indices it owns; the CTA walks them in order and, per request piece, writes either the
// final bf16 output + LSE (unsplit request, sink applied) or the normalised fp32 partial + LSE of
// its slot (split request; the combine kernel merges the slots).
//
// Warp roles (384 threads, registers rebalanced with setmaxnreg after the setup):
//   WG0 (consumer 0): loads Q [64 heads x 576] of the request into shared memory (cp.async,
//       rows past num_heads zero-filled), S = Q K^T (36 x wgmma m64n64k16, both operands in
//       shared memory), masking of invalid ids, online softmax in base 2 with the scale folded
//       in, P (bf16) to registers and to shared memory, O[:, 0:256] += P V (4 x m64n256k16,
//       A = P from registers), and the softmax state for the epilogue.
//   WG1 (consumer 1): O[:, 256:512] += P V with P read from shared memory, after rescaling its
//       O by WG0's per-row factors.
//   WG2 (producer): per block, reads the 64 ids, gathers each token's 656-byte record with
//       non-coherent loads, dequantizes e4m3 x fp32 scale -> bf16 (exactly the reference's
//       rounding) and copies the bf16 RoPE part into a 128 B-swizzled K tile; V is the same tile
//       read MN-major (no second copy). Invalid ids leave zero rows. How lanes split a record
//       (Cfg::kMap) decides the stores' shape: the plan's default, whole 128-byte rows per eight
//       lanes, is what the peer's st.async needs (docs/perf-notes-mla.md, 2026-12-02). With
//       Cfg::kProducers = 2 a fourth warpgroup (512 threads) shares each block's tokens.
//
// Cluster of 2 (Cfg::kCluster = 2, two head blocks of 65..128 heads): the two CTAs of a request
// token need the same tiles, so each producer gathers and dequantizes 32 of the 64 tokens and
// writes them into its own tile (st.shared) and the peer's (st.async, completing on the peer's
// `remote` barrier with kPeerBytes per block); the empty barriers count both CTAs' consumers.
//
// Pipeline: kStages = 2 K tiles. Per tile two mbarriers: full (128 producer arrivals, after
// fence.proxy.async so wgmma's async proxy sees the generic stores) and empty (one arrival per
// consumer warp once its wgmmas reading the tile completed). Two more mbarriers hand P and the
// row rescale factors from consumer 0 to consumer 1 (p_ready: 128 arrivals of consumer 0) and
// back (p_free: 128 arrivals of consumer 1 once its wgmmas reading P completed); out_ready /
// out_free do the same for a request's final output factors. They were named barriers
// (bar.arrive / bar.sync of 256 of the 384 threads) until compute-sanitizer racecheck, which
// orders nothing by a named barrier of part of the CTA (tools/racecheck_probe.cu), reported
// every hand-over as a race; an mbarrier arrive / wait is release / acquire for each thread,
// which it follows. Named barriers (NamedBarrier, pipeline.cuh) remain for the Q and id
// staging, inside one warpgroup.
//
// Files: knobs.cuh (the Cfg knobs, what each value does and measured), traits.cuh (launch facts,
// shared-memory plan, register budgets), pipeline.cuh (shared-memory accessors, tile stores and
// hand-overs), walk.cuh (the partition's request pieces and block cursors), dequant.cuh (e4m3 x
// scale -> bf16), producer.cuh (and its staged records, Cfg::kStage), consumers.cuh, narrow.cuh
// (the consumers with the heads on N at 16 heads or fewer, Cfg::kNarrow); this file the kernel:
// setup, roles, teardown.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/consumers.cuh"
#include "kernels/mla/sm90/knobs.cuh"
#include "kernels/mla/sm90/narrow.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/producer.cuh"
#include "kernels/mla/sm90/seesaw.cuh"
#include "kernels/mla/sm90/stamps.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

template <class Cfg>
__device__ __forceinline__ void mla_sparse_decode_sm90(const DecodeKernelParams& kp,
                                                       unsigned char* smem_raw) {
  constexpr int kCl = ClusterOf<Cfg>::value;
  constexpr int kProducers = ProducersOf<Cfg>::value;
  static_assert(kCl == 1 || kCl == 2, "Cfg::kCluster: 1, or 2 for two head blocks");
  static_assert(PipeOf<Cfg>::value >= kPipeBase && PipeOf<Cfg>::value <= kPipeStream, "Cfg::kPipe");
  static_assert(kProducers == 1 || (kProducers == 2 && PipeOf<Cfg>::value >= kPipeAhead &&
                                    MapOf<Cfg>::value != kMapTokens),
                "Cfg::kProducers: 1, or 2 with kPipe 1..4 and the unit split (or its pairs)");
  static_assert(DequantOf<Cfg>::value >= 0 && DequantOf<Cfg>::value <= 2, "Cfg::kDequant");
  static_assert(!kBulkPeer<Cfg> || (PipeOf<Cfg>::value >= kPipeAhead && PipeOf<Cfg>::value <= kPipeEarly &&
                                    MapOf<Cfg>::value != kMapTokens && !kNoPeer<Cfg>),
                "Cfg::kPeerCopy 1: the block producer (pipes 1-3, not the token split)");
  static_assert(MapOf<Cfg>::value != kMapRows || DequantOf<Cfg>::value <= 1,
                "Cfg::kMap 3 (rows) converts with the hardware conversions or the integer placement");
  static_assert(DequantOf<Cfg>::value != 2 || (MapOf<Cfg>::value == kMapUnits && kCl == 2),
                "Cfg::kDequant = 2: a quad of lanes on one token (the unit split), in a cluster "
                "(without one the producer spills)");
  static_assert(SeesawOf<Cfg>::value == 0 ||
                    (SeesawOf<Cfg>::value <= 2 && kProducers == 2 && kCl == 2 &&
                     (PipeOf<Cfg>::value == kPipeAhead || PipeOf<Cfg>::value == kPipeWhole)),
                "Cfg::kSeesaw 1, 2: two producers (56 registers: pipes 1 and 2) in a cluster of 2");
  static_assert(StageOf<Cfg>::value == 0 ||
                    (StageOf<Cfg>::value == 1 && kCl == 1 && kProducers == 2 &&
                     PipeOf<Cfg>::value == kPipeWhole && MapOf<Cfg>::value == kMapRows && SeesawOf<Cfg>::value == 0),
                "Cfg::kStage 1: two producers' whole shares in rows (pipe 2, map 3) without a cluster");
  static_assert(NarrowOf<Cfg>::value == 0 ||
                    (NarrowOf<Cfg>::value == 1 && kCl == 1 && SeesawOf<Cfg>::value == 0 &&
                     PHandOf<Cfg>::value != kPHandRegs),
                "Cfg::kNarrow 1: one head block, consumer 1 reading P from shared memory");
  constexpr bool kSeesaw = SeesawOf<Cfg>::value != 0;
  if (threadIdx.x == 0) timeline_mark<Cfg>(kEventEntry);
  // Under programmatic dependent launch the scheduler's metadata may still be in flight: wait,
  // then load the partition and the stamp together before the barrier set-up, so that their
  // memory latency (the walk's first id loads wait on the partition) runs under it. (The
  // partition is read within the workspace whatever the stamp says; only a matching one is used.)
  grid_dependency_wait();
  const SparsePart part = kp.run.parts[blockIdx.z];
  const bool matches = schedule_matches(kp.p, kp.run);
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
      mbar_init(sm.full(s), 128 * kProducers);  // every producer thread
      mbar_init(sm.empty(s), 8 * kCl);  // lane 0 of each consumer warp (of both CTAs)
      mbar_init(sm.remote(s), 1);       // the local expect_tx arrival (+ the peer's bytes)
    }
    mbar_init(sm.p_ready(), 128);  // every consumer-0 thread
    mbar_init(sm.p_free(), 128);   // every consumer-1 thread
    mbar_init(sm.out_ready(), 128);
    mbar_init(sm.out_free(), 128);
    mbar_init(sm.q_loaded(), 128);  // every consumer-0 thread (Cfg::kSeesaw)
    if constexpr (kStaged<Cfg>) {
      for (int w = 0; w < 8; ++w) {
        mbar_init(sm.staged(w, 0), 1);  // lane 0 of the producer warp (+ its copies' bytes)
        mbar_init(sm.staged(w, 1), 1);
      }
    }
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
    return;
  }

  if (threadIdx.x == 0) timeline_mark<Cfg>(kEventStart);
  const int tok = blockIdx.y;
  const int head0 = blockIdx.x * kHeadsPerCta;
  // Read through a shuffle so that ptxas sees a warp-uniform role: wgmma in a path it takes for
  // divergent is serialized (C7518: a wait after every wgmma).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  constexpr RegBudget kRegs =
      reg_budget(PipeOf<Cfg>::value, PHandOf<Cfg>::value, kProducers, kCl, SeesawOf<Cfg>::value);
  if (wg >= 2) {
    setmaxnreg_dec<kRegs.producer>();
    if constexpr (kNoProduce<Cfg>) {
    } else if constexpr (kStaged<Cfg>) {
      producer_staged<Cfg>(kp, part, tok, sm);
    } else if constexpr (PipeOf<Cfg>::value == kPipeBase) {
      producer<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    } else if constexpr (PipeOf<Cfg>::value == kPipeStream && kProducers == 2) {
      producer_stream_small<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    } else if constexpr (PipeOf<Cfg>::value == kPipeStream) {
      producer_stream<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    } else {
      producer_ahead<Cfg, kCl>(kp, part, tok, sm, static_cast<int>(rank));
    }
  } else if (wg == 0) {
    setmaxnreg_inc<kRegs.consumer0>();
    if constexpr (kNoConsume<Cfg>) {
      release_only<Cfg>(kp, part, sm, static_cast<int>(threadIdx.x & 31));
    } else if constexpr (kSeesaw) {
      consumer_seesaw<Cfg, 0>(kp, part, tok, head0, sm);
    } else if constexpr (kNarrowS<Cfg>) {
      consumer0_narrow<Cfg>(kp, part, tok, head0, sm);
    } else {
      consumer0<Cfg>(kp, part, tok, head0, sm);
    }
  } else {
    if constexpr (kRegs.consumer1 > launch_regs(kProducers)) {
      setmaxnreg_inc<kRegs.consumer1>();
    } else {
      setmaxnreg_dec<kRegs.consumer1>();
    }
    if constexpr (kNoConsume<Cfg>) {
      release_only<Cfg>(kp, part, sm, static_cast<int>(threadIdx.x & 31));
    } else if constexpr (kSeesaw) {
      consumer_seesaw<Cfg, 1>(kp, part, tok, head0, sm);
    } else if constexpr (kNarrowS<Cfg>) {
      consumer1_narrow<Cfg>(kp, part, tok, sm);
    } else {
      consumer1<Cfg>(kp, part, tok, head0, sm);
    }
  }
  // The combine kernel (launched with programmatic dependent launch) may start; its
  // griddepcontrol.wait still sees every write of this grid.
  launch_dependents();
  // Neither CTA of a cluster may leave while the other can still write its tiles or arrive on
  // its barriers.
  if constexpr (kCl == 2) cluster_sync();
  if (threadIdx.x == 0) timeline_mark<Cfg>(kEventExit);
}

}  // namespace deca::mla::sm90
