// MLA sparse FP8 decode, Hopper (sm_90a): the direct kernel, for at most 16 heads (kernel_class in
// traits.cuh), without the bf16 tile: the consumers multiply the FP8 records themselves, from a
// ring of record slots.
//
// Why: with the bf16 tile every record crosses shared memory three times (copied in, read back
// by the converting producers, stored as bf16) and the tile is read twice more by the wgmma; two
// tiles of 72 KB leave no room for more than one block of records in flight. At 16 heads the
// tensor work is small, so the producers' conversion and that traffic bound the block
// (docs/perf-notes-mla.md, 2026-12-02, eighth part). Here the records land in a ring of four
// 42 KB slots and are read once from there, by the consumers' own ld.shared, as the A operands
// of wgmma with A in registers:
//
//   S^T = K Q^T: A = the records' e4m3 NoPE words widened to f16 pairs in registers (exact), B = Q
//     as f16 (q s_h, s_h a power of two per head: exact), one accumulator per 128-value group so
//     that each token's group scale multiplies it after the products (the cache's value e4m3 x
//     fp32 scale, nothing rounded to bf16). Not the e4m3 tensor cores: they keep ~14 bits of
//     the sum (DeepSeek-V3's report), and two e4m3 terms of q in one accumulator moved the LSE by
//     up to 8.5e-3; f16 products accumulate in f32. The RoPE part on the bf16
//     tensor cores from the records' bf16 bytes (q s_h exact in bf16).
//   O^T = V^T P^T on the e4m3 tensor cores: A = the same NoPE bytes transposed in registers (4 x 4
//     byte transposes by prmt; which token sits at which k and which column at which row is free,
//     and is picked so that the loads are conflict-free and a thread's rows are four adjacent
//     columns), B = P as two e4m3 terms per 128-value group g: P_g = P x scale_g(token) x
//     2^(8 - E_g), the scale folded in per token, E_g the group's running scale exponent (O
//     rescaled when it grows).
//
// Roles (384 threads): warpgroup 2 produces (per block the 64 checked ids, and each record
// copied into the ring slot by 16-byte cp.async, a skipped id's as zeros so that P V never meets a
// NaN of an unused slot); consumer warpgroups 0 and 1 take alternate blocks, each the whole S^T,
// softmax and O^T of its block with its own running state, the two merged at a request's end, so
// that one's softmax runs under the other's tensor work.
//
// MODEL1's 584-byte token (Cfg::kKvFormat kMlaKvModel1, two caches) runs this kernel too, with
// its own shared-memory plan and the consumers' format-specific parts in direct_model1.cuh (seven
// 64-value groups with power-of-two scales; V's 64 RoPE columns on the bf16 tensor cores).
//
// Files: direct_ring.cuh (the shared-memory plans, Q's load, the producer's copies into the ring),
// direct_consumer.cuh (the consumers), direct_model1.cuh (MODEL1's S^T, RoPE P, P V and output
// stores); this file the kernel: setup, roles, teardown. Shared with
// the wide kernel: config.cuh, traits.cuh, walk.cuh, layout.cuh (the fragment orders), and the
// softmax's output factors and LSE stores (consumers.cuh).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/direct_consumer.cuh"
#include "kernels/mla/sm90/direct_ring.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

template <class Cfg>
__device__ __forceinline__ void mla_sparse_direct_sm90(const DecodeKernelParams& kp, unsigned char* smem_raw) {
  static_assert(ClusterOf<Cfg>::value == 1, "Cfg::kDirect: one head block of at most 16 heads, no cluster");
  static_assert(!kRowFormat<Cfg>,
                "Cfg::kDirect: the 656-byte token or MODEL1's (dense bf16 / e4m3 rows: the wide kernel)");
  static_assert(!kModel1<Cfg> || !kDense<Cfg>, "MODEL1 is sparse");
  using Plan = DirectPlanT<kModel1<Cfg>>;
  ptx::griddep_wait();
  const SparsePart part = kp.run.parts[blockIdx.z];
  const bool matches = schedule_matches<kModel1<Cfg>>(kp.p, kp.run);
  const unsigned raw = ptx::smem_addr(smem_raw);
  DirectSmem<Cfg> sm;
  sm.base = (raw + 1023u) & ~1023u;
  sm.ptr = smem_raw + (sm.base - raw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kDirectRing; ++s) {
      // The producer: 128 copy-completion arrivals and 128 id releases. The consumers: every
      // thread of the warpgroup reading the slot, each releasing its own reads.
      mbar_init(sm.full(s), 256);
      mbar_init(sm.empty(s), 128);
    }
    // The consumers' rendezvous: every thread of both consumer warpgroups.
    mbar_init(sm.bar(Plan::kBarRequest), 256);
    mbar_init(sm.bar(Plan::kBarQLanded), 256);
    mbar_init(sm.bar(Plan::kBarStates), 256);
    mbar_init(sm.bar(Plan::kBarOX), 256);
    fence_mbar_init();
  }
  __syncthreads();
  if (!matches) {
    fill_nan_outputs(kp.p, 0, kHeadsPerCta, static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z),
                     static_cast<int>(gridDim.z));
    check_schedule<Cfg>(kp);
    return;
  }
  const int tok = blockIdx.y;
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wg == 2) {
    setmaxnreg_dec<40>();
    producer_copies<Cfg>(kp, part, tok, sm);
  } else {
    setmaxnreg_inc<232>();
    consumer_direct<Cfg>(kp, part, tok, sm, wg);
  }
  ptx::griddep_launch_dependents();
}

}  // namespace deca::mla::sm90
