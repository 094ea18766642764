// The JIT entry of the e4m3 wgmma tile probe (kernels/gqa/sm90/fp8_tile.cuh): one CTA of one
// warpgroup (kTileThreads), kFp8TileSmemBytes of dynamic shared memory, sm_90a.
#pragma once

#include "kernels/gqa/sm90/fp8_tile.cuh"

extern "C" __global__ void __launch_bounds__(deca::gqa::sm90::kTileThreads, 1)
    deca_gqa_sm90_fp8_tile_probe(const __grid_constant__ deca::gqa::sm90::Fp8TileProbeParams p) {
  extern __shared__ __align__(1024) unsigned char deca_smem[];
  deca::gqa::sm90::fp8_tile_probe(p, deca_smem);
}
