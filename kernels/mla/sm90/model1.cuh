// MODEL1's 584-byte token (kMlaKvModel1, kernels/mla/model1.cuh) in the wide kernel's producers
// (producer.cuh): a block's tokens come from one of the two caches (walk.cuh: the first cache's
// blocks of a request, then the extra cache's), each token's 448 e4m3 values (7 tiles of 64, one
// ue8m0 scale each) dequantized into the tile's chunks 0..6 and its 64 bf16 RoPE values copied
// into chunk 7, so that the 512 dims of K (and V) are chunks 0..7 and the consumers run QK^T over
// 8 chunks (consumers.cuh kQkChunks) and P V as for V3.2. Chunk 8 is not written.
//
// Thread mapping (as the dense e4m3 rows', rows.cuh): eight threads a token; thread t takes tile
// unit t % 8 of every chunk: 8 e4m3 bytes at 64 c + 8 (t % 8) of the row for chunk c < 7, the 16
// RoPE bytes at 448 + 16 (t % 8) for chunk 7, and the token's 8 scale bytes (one load; byte c is
// chunk c's scale). A quarter warp reads a token's contiguous 64 (128) bytes and writes one whole
// 128-byte swizzled row of a chunk. Every token's loads are in flight before the first store (one
// memory latency per block). Ids below zero leave zero rows (P V never meets a NaN of an unused
// slot).
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/model1.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/dequant.cuh"
#include "kernels/mla/sm90/gather.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::mla::sm90 {

// Token `id`'s row (>= 0, inside its pool) in the first cache (extra = false) or the extra one;
// `scales` gets its scales' address. The page sizes are compiled in (Cfg::kPageSize,
// Cfg::kExtraPageSize).
template <class Cfg>
__device__ __forceinline__ const unsigned char* model1_row(const MlaSparseParams& p, int id, bool extra,
                                                           const unsigned char*& scales) {
  constexpr int kPage = Cfg::kPageSize;
  constexpr int kExtraPage = ExtraPageOf<Cfg>::value;
  const unsigned u = static_cast<unsigned>(id);
  const unsigned block = extra ? u / kExtraPage : u / kPage;
  const int slot = static_cast<int>(extra ? u % kExtraPage : u % kPage);
  const unsigned char* page = extra ? p.extra_kv + static_cast<unsigned long long>(block) * p.extra_kv_stride_block
                                    : p.kv + static_cast<unsigned long long>(block) * p.kv_stride_block;
  scales = page + model1_scale_offset(extra ? kExtraPage : kPage, slot);
  return page + model1_row_offset(slot);
}

// One producer warpgroup's share of a block (kTokens / kWays tokens from first_token; `extra`:
// the block is the extra cache's).
template <class Cfg, int kCl, int kWays>
__device__ __forceinline__ void produce_model1(const MlaSparseParams& p, const Smem& sm, int stage,
                                               const int* block_ids, int t, int first_token, bool extra) {
  constexpr int kNope = kModel1NopeDims / 64;    // 7 chunks of e4m3
  constexpr int kPasses = kTokens / kWays / 16;  // tokens per thread
  static_assert(kPasses * 16 * kWays == kTokens, "every token of the block, once");
  const int lane8 = t & 7;
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  uint2 raw[kPasses][kNope];
  uint4 rope[kPasses];
  uint2 sc[kPasses];
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int id = block_ids[first_token + (t >> 3) + 16 * k];
    const unsigned char* scales;
    const unsigned char* row = model1_row<Cfg>(p, id >= 0 ? id : 0, extra, scales);
#pragma unroll
    for (int c = 0; c < kNope; ++c) {
      raw[k][c] = id >= 0 ? load_row8<Cfg>(row + 64 * c + 8 * lane8) : make_uint2(0, 0);
    }
    rope[k] = id >= 0 ? load_row16<Cfg>(row + kModel1NopeDims + 16 * lane8) : make_uint4(0, 0, 0, 0);
    sc[k] = id >= 0 ? load_row8<Cfg>(scales) : make_uint2(0, 0);
  }
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int n = first_token + (t >> 3) + 16 * k;
    const unsigned at = tile + swz(n, lane8);
#pragma unroll
    for (int c = 0; c < kNope; ++c) {
      const unsigned byte = ((c < 4 ? sc[k].x : sc[k].y) >> (8 * (c & 3))) & 0xFFu;
      // bf16(float(e4m3) x 2^(byte - 127)), the reference's rounding (dequant.cuh); zeros stay zeros.
      store_tile<kCl>(sm, at + c * kChunkBytes, dequant8(raw[k][c], e8m0_to_float(byte)), peer_bar);
    }
    store_tile<kCl>(sm, at + kNope * kChunkBytes, rope[k], peer_bar);
  }
}

// The L2 prefetch of token `id`'s row and scales (>= 0, inside its pool): the 576-byte row spans
// five or six 128-byte lines (every 128 bytes and its last byte), then the scales' line; shared by
// the token's kThreadsPerToken consecutive threads.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_model1(const MlaSparseParams& p, int id, bool extra, int t) {
  if constexpr (kNoGather<Cfg>) return;
  const unsigned char* scales;
  const unsigned char* row = model1_row<Cfg>(p, id, extra, scales);
#pragma unroll
  for (int k = t % kThreadsPerToken; k < 7; k += kThreadsPerToken) {
    prefetch_l2(k < 5 ? row + 128 * k : (k == 5 ? row + kModel1RowBytes - 1 : scales));
  }
}

}  // namespace deca::mla::sm90
