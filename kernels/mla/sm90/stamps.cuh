// Cycle stamps per phase of each role of the sm90a MLA kernel (Cfg::kStamp = 1, DECA_MLA_STAMP=1;
// timing aid only): every thread adds clock64 deltas between the points its role marks, and the
// first thread of each warpgroup of the first CTAs (grid x < 2, y = z = 0) stores its block count
// and sums into deca_mla_stamps, which the CUDA backend reads after the launch and prints. Not
// printf: a call in the kernel makes ptxas serialize every wgmma (a wait after each). Off (the
// default), every call compiles to nothing.
#pragma once

#include "kernels/mla/sm90/knobs.cuh"

// [CTA x][warpgroup][block count, phase sums] (traits.cuh kStampCtas, kStampWarpgroups, kStampSlots)
extern "C" __device__ long long
    deca_mla_stamps[deca::mla::sm90::kStampCtas * deca::mla::sm90::kStampWarpgroups * deca::mla::sm90::kStampSlots];

// Cfg::kStamp = 2: the time (%globaltimer, ns) of each event below, per CTA (linear index below
// kTimelineCtas), written by the one thread that sees it; the backend prints each event's
// spread over the CTAs from the earliest entry, to show where a launch's fixed cost goes
// (start-up before the first tile, the drain after the last).
extern "C" __device__ unsigned long long
    deca_mla_timeline[deca::mla::sm90::kTimelineCtas * deca::mla::sm90::kTimelineEvents];

namespace deca::mla::sm90 {

template <class Cfg>
__device__ __forceinline__ void timeline_mark(int event) {
  if constexpr (StampOf<Cfg>::value == 2) {
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (cta < static_cast<unsigned>(kTimelineCtas)) {
      deca_mla_timeline[cta * kTimelineEvents + event] = ::cuda::ptx::get_sreg_globaltimer();
    }
  }
}

template <bool kOn, int kN = 6>
struct Stamps {
  static_assert(kN < kStampSlots, "the block count and kN sums fit a warpgroup's record");
  long long last = 0;
  long long sum[kN] = {};
  __device__ __forceinline__ void start() {
    if constexpr (kOn) last = clock64();
  }
  // Adds the time since the previous mark to phase i.
  __device__ __forceinline__ void lap(int i) {
    if constexpr (kOn) {
      const long long now = clock64();
      sum[i] += now - last;
      last = now;
    }
  }
  __device__ __forceinline__ void report(int blocks) const {
    if constexpr (kOn) {
      if (blockIdx.x >= kStampCtas || blockIdx.y != 0 || blockIdx.z != 0 || (threadIdx.x & 127) != 0) return;
      long long* out = deca_mla_stamps + (blockIdx.x * kStampWarpgroups + threadIdx.x / 128) * kStampSlots;
      out[0] = blocks;
#pragma unroll
      for (int i = 0; i < kN; ++i) out[1 + i] = sum[i];
    }
  }
};

}  // namespace deca::mla::sm90
