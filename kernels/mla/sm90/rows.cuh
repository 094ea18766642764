// Dense MLA decode's bf16 and e4m3 caches in the wide kernel's producers (producer.cuh): a block's
// tokens are whole cache rows, 576 bf16 (1152 bytes) or 576 e4m3 (576 bytes, real = stored x the
// cache's one scale), widened into the same 128 B-swizzled bf16 K tile that the 656-byte tokens
// are dequantized into, so that the consumers are the sparse kernel's. (The 656-byte token read
// densely goes through the records' producer, with ids from the block table: walk.cuh.)
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/params.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/dequant.cuh"
#include "kernels/mla/sm90/gather.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"

namespace deca::mla::sm90 {

// Bytes of one cached row in a dense row format.
template <int kFormat>
inline constexpr int kRowBytes = kFormat == kMlaKvBF16 ? 2 * kDimQK : kDimQK;

// A round's raw units: 16 bytes of bf16, or 8 e4m3 bytes that widen into one 16-byte unit.
template <bool kBf16>
struct RowRaw {
  using type = uint4;
};
template <>
struct RowRaw<false> {
  using type = uint2;
};

// A warpgroup's share of a block: kTokens / kWays tokens from `first_token` (32 without a
// cluster, 16 in one), eight threads a token: thread t takes tokens first_token + t / 8 + 16 k and,
// of each, tile unit t % 8 of every chunk c (9 of them: the 576 dims, 64 a chunk), i.e. the
// cache's 16 bytes (bf16) or 8 bytes (e4m3) at 128 c + 16 (t % 8) (or 64 c + 8 (t % 8)). A
// quarter warp then reads one token's 128 (64) contiguous bytes and writes one whole 128-byte
// swizzled row of a chunk (conflict-free), and a thread's nine loads are immediate offsets from
// one row address. A round is the loads in flight before the first store: one token's nine units
// for bf16 (36 registers), every token's for e4m3 (18 or 9 registers a token). Ids below zero (past
// the query token's causal end, outside the pool, a bad block-table entry) leave zero rows, so
// that P V never meets a NaN of an unused slot.
template <class Cfg, int kCl, int kWays>
__device__ __forceinline__ void produce_rows(const DecodeKernelParams& kp, const Smem& sm, int stage,
                                             const int* block_ids, int t, int first_token) {
  constexpr int kFormat = KvFormatOf<Cfg>::value;
  constexpr bool kBf16 = kFormat == kMlaKvBF16;
  static_assert(kBf16 || kFormat == kMlaKvFP8E4M3, "produce_rows: the dense row formats");
  constexpr int kChunks = kDimQK / 64;
  constexpr int kPasses = kTokens / kWays / 16;  // tokens per thread
  static_assert(kPasses * 16 * kWays == kTokens, "every token of the block, once");
  constexpr int kPerRound = kBf16 ? 1 : kPasses;  // tokens whose loads are in flight together
  constexpr int kUnitBytes = kBf16 ? 16 : 8;
  using Raw = typename RowRaw<kBf16>::type;
  const MlaSparseParams& p = kp.p;
  const float scale = kp.dense.kv_scale;
  const int lane8 = t & 7;
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  if constexpr (kBf16 && kCl == 1 && !kNoGather<Cfg>) {
    // bf16 without a cluster: the rows need no conversion and no peer, so they go straight to
    // shared memory by 16-byte cp.async (zeros for a skipped id: src-size 0 reads nothing),
    // every token's at once (through registers, one token's units a round: a memory latency per
    // round). Waited for here: the caller's proxy fence then orders the landed bytes for wgmma.
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
      const int n = first_token + (t >> 3) + 16 * k;
      const int id = block_ids[n];
      const unsigned char* at = record_of<Cfg>(p, id >= 0 ? id : 0) + kUnitBytes * lane8;
      const unsigned row = tile + swz(n, lane8);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) ptx::cp_async_16(row + c * kChunkBytes, at + 128 * c, id >= 0);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    return;
  }
#pragma unroll
  for (int round = 0; round < kPasses / kPerRound; ++round) {
    Raw raw[kPerRound][kChunks];
#pragma unroll
    for (int k = 0; k < kPerRound; ++k) {
      const int id = block_ids[first_token + (t >> 3) + 16 * (round * kPerRound + k)];
      const unsigned char* at = record_of<Cfg>(p, id) + kUnitBytes * lane8;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if constexpr (kBf16) {
          raw[k][c] = id >= 0 ? load_row16<Cfg>(at + 128 * c) : make_uint4(0, 0, 0, 0);
        } else {
          raw[k][c] = id >= 0 ? load_row8<Cfg>(at + 64 * c) : make_uint2(0, 0);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kPerRound; ++k) {
      const int n = first_token + (t >> 3) + 16 * (round * kPerRound + k);
      const unsigned row = tile + swz(n, lane8);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        uint4 v;
        if constexpr (kBf16) {
          v = raw[k][c];
        } else {
          // bf16(float(e4m3) x scale), the reference's rounding (dequant.cuh); zeros stay zeros.
          v = dequant8(raw[k][c], scale);
        }
        store_tile<kCl>(sm, row + c * kChunkBytes, v, peer_bar);
      }
    }
  }
}

// The 128-byte lines of dense row `id` (>= 0, inside the pool) into L2, shared by the token's
// kThreadsPerToken consecutive threads: every 128 bytes and the last byte, so that a row not
// aligned to 128 bytes (e4m3 rows sit 576 bytes apart) is covered whole.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_row(const MlaSparseParams& p, int id, int t) {
  if constexpr (kNoGather<Cfg>) return;
  constexpr int kBytes = kRowBytes<KvFormatOf<Cfg>::value>;
  constexpr int kLines = (kBytes + 127) / 128 + 1;
  const unsigned char* row = record_of<Cfg>(p, id);
#pragma unroll
  for (int k = t % kThreadsPerToken; k < kLines; k += kThreadsPerToken) {
    prefetch_l2(row + (k < kLines - 1 ? 128 * k : kBytes - 1));
  }
}

}  // namespace deca::mla::sm90
