// Cycle stamps per phase of each role of the sm90a MLA kernel (Cfg::kStamp = 1, DECA_MLA_STAMP=1;
// timing aid only): every thread adds clock64 deltas between the points its role marks, and the
// first thread of each warpgroup of the first CTAs (grid x < 2, y = z = 0) prints the mean per
// block. Off (the default), every call compiles to nothing.
#pragma once

#include "kernels/mla/sm90/knobs.cuh"

namespace deca::mla::sm90 {

template <bool kOn, int kN = 6>
struct Stamps {
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
  __device__ __forceinline__ void report(const char* role, int blocks) const {
    if constexpr (kOn) {
      if (blockIdx.x >= 2 || blockIdx.y != 0 || blockIdx.z != 0 || (threadIdx.x & 127) != 0) return;
      const double n = blocks > 0 ? static_cast<double>(blocks) : 1.0;
      printf("stamp %s cta %d wg %d blocks %d clk/block: %.0f %.0f %.0f %.0f %.0f %.0f\n", role,
             static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x / 128), blocks, sum[0] / n,
             kN > 1 ? sum[1 % kN] / n : 0.0, kN > 2 ? sum[2 % kN] / n : 0.0, kN > 3 ? sum[3 % kN] / n : 0.0,
             kN > 4 ? sum[4 % kN] / n : 0.0, kN > 5 ? sum[5 % kN] / n : 0.0);
    }
  }
};

}  // namespace deca::mla::sm90
