// Sizes, the parameter struct and the shared-memory plan of the e4m3 wgmma tile probe
// (kernels/gqa/sm90/fp8_tile.cuh); plain C++ for the host code that launches it.
#pragma once

namespace deca::gqa::sm90 {

constexpr int kTileTokens = 128;
constexpr int kTileDim = 128;
constexpr int kTileRows = 8;      // query rows of one KV head: wgmma's N
constexpr int kTileThreads = 128;  // one warpgroup

struct Fp8TileProbeParams {
  const unsigned char* k;  // [128 tokens][128] e4m3
  const unsigned char* v;  // [128 tokens][128] e4m3
  const float* q;          // [8 rows][128]
  float k_scale;
  float v_scale;
  float softmax_scale;
  float* out;  // [8 rows][128]
  float* lse;  // [8 rows], natural log
};

// Byte offsets from the 1024-aligned base; every operand starts on a swizzle atom (1024 B).
struct Fp8TilePlan {
  static constexpr int kK = 0;                 // 128 token rows x 128 B
  static constexpr int kVt = kK + 16384;       // 128 d rows x 128 B (tokens)
  static constexpr int kQhi = kVt + 16384;     // 8 query rows x 128 B (d)
  static constexpr int kQlo = kQhi + 1024;
  static constexpr int kPhi = kQlo + 1024;     // 8 query rows x 128 B (tokens)
  static constexpr int kPlo = kPhi + 1024;
  static constexpr int kMax = kPlo + 1024;     // float [4 warps][8 rows]
  static constexpr int kSum = kMax + 128;      // float [4 warps][8 rows]
  static constexpr int kQScale = kSum + 128;   // float [8]: the power of two q's row was scaled by
  static constexpr int kEnd = kQScale + 32;
};
constexpr int kFp8TileSmemBytes = Fp8TilePlan::kEnd + 1024;  // + alignment of the base

}  // namespace deca::gqa::sm90
