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

// ---- Dense bf16 rows by TMA (Cfg::kTma, a cluster of 2) -----------------------------------------
// The tensor map (src/cuda/mla_tma.cpp) views the cache as bf16 [num_blocks][page][576] with the
// caller's strides (innermost first: 576 dims, page slots, blocks), box {64 dims, 64 slots, 1
// block}, 128-byte swizzle: one box is one chunk of the tile exactly as swz() (layout.cuh) orders
// it, since the copy unit's 128-byte swizzle stores 16-byte unit u of the box's row r at unit
// u ^ (r % 8) of that row inside each 1024-byte atom and every chunk starts 1024-aligned
// (tests/plan/mla_tma_map_test.cpp checks the two orders agree). The plan takes it only for
// page sizes that are multiples of 64 (src/cuda/mla_tma.hpp): a block of 64 tokens (blocks start
// at multiples of 64 of the request) then lies in one page, block-table entry e, slots s0 .. s0 +
// 63, one box per chunk at coordinates {64 c, s0, e}.
//
// Each CTA of the pair issues its half of the chunks (CTA 0 chunks 0..4, CTA 1 5..8), multicast
// into both tiles; both CTAs' `remote` barriers expect the whole tile's bytes (kTileBytes: the
// producers' expect_tx after the free-tile wait, producer.cuh). `id0` is token 0's id: below
// zero the whole block is invalid (past the query token's causal end, past the partition, or a
// block-table entry outside [0, num_blocks)) and the box is issued at entry -1, outside the
// tensor, which the copy unit fills with zeros and counts in full. `kv_map`: the entry's second
// parameter (its address in the parameter space).
template <class Cfg>
__device__ __forceinline__ void issue_rows_tma(const TensorMapBytes* kv_map, const Smem& sm, int stage, int id0,
                                               int rank) {
  constexpr int kHalf = (kDimQK / 64 + 1) / 2;  // CTA 0's chunks; CTA 1 the rest
  const unsigned u = static_cast<unsigned>(id0);
  const int entry = id0 >= 0 ? static_cast<int>(u / Cfg::kPageSize) : -1;
  const int slot = id0 >= 0 ? static_cast<int>(u % Cfg::kPageSize) : 0;
  const unsigned mbar = ptx::smem_addr(sm.remote(stage));
  const unsigned tile = sm.k(stage);
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const int c = rank * kHalf + i;
    if (c < kDimQK / 64) tma_load_3d_multicast(tile + c * kChunkBytes, kv_map, 64 * c, slot, entry, mbar, 0x3);
  }
}

// Zero rows for the invalid ids of a TMA block, which holds whatever the cache's slots hold past
// the request's length (unused slots: any bytes, NaN included). Masking S alone would not do:
// P = 0 there, but P V computes 0 x V, and 0 x NaN is NaN. The invalid ids of a block are a
// suffix (past the causal end) or all 64 (a block in one page: a refused entry, or past the
// partition), so the last id says whether any is: only such blocks (a request's last, or none)
// wait here for the copies to land, the others hand the tile over at once. After the wait the
// bytes are in this CTA's tile (its `remote` barrier counts the peer's multicast too); each CTA
// zeroes its own tile (it holds all 64 ids), and the caller's fence.proxy.async orders the zeros
// before the consumers' wgmma. 256 threads: four per row, 32 bytes of it per chunk each.
__device__ __forceinline__ void zero_invalid_rows(const Smem& sm, int stage, const int* ids, int tg, unsigned parity) {
  if (ids[kTokens - 1] >= 0) return;
  mbar_wait(sm.remote(stage), parity);
  const int n = tg >> 2;
  if (ids[n] >= 0) return;
  const unsigned row = sm.k(stage) + static_cast<unsigned>(n * 128 + (tg & 3) * 32);
#pragma unroll
  for (int c = 0; c < kDimQK / 64; ++c) {
    sts128(row + c * kChunkBytes, make_uint4(0, 0, 0, 0));
    sts128(row + c * kChunkBytes + 16, make_uint4(0, 0, 0, 0));
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
