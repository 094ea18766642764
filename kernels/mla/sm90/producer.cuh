// The producer warpgroups of the sm90a MLA sparse decode kernel (decode.cuh): the gather of
// each block's selected records, their dequantization (dequant.cuh) and the stores into the
// K tile (and the peer's), in the pipelines Cfg::kPipe selects.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/dequant.cuh"
#include "kernels/mla/sm90/knobs.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/stamps.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// A 16-byte / 4-byte load of a cache record with the L1 policy of L1Of<Cfg>.
// The no-gather ablations return bytes made from the address instead (from addr_bits): e4m3 and
// bf16 in [0.5, 1), a scale near 2^-7, all finite, and dependent on the id as a load's result
// would be.
__device__ __forceinline__ unsigned addr_bits(const unsigned char* p) {  // the low 32 bits
  return static_cast<unsigned>(reinterpret_cast<unsigned long long>(p));
}
template <class Cfg>
__device__ __forceinline__ uint4 load_rec16(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) {
    const unsigned v = (addr_bits(p) & 0x07070707u) | 0x30303030u;
    return make_uint4(v, v ^ 0x01010101u, v ^ 0x02020202u, v ^ 0x04040404u);
  }
  if constexpr (L1Of<Cfg>::value == 1) return ldg_nc_el_v4(p);
  return ldg_nc_na_v4(p);
}
template <class Cfg>
__device__ __forceinline__ uint2 load_rec8(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) {
    const uint4 v = load_rec16<Cfg>(p);
    return make_uint2(v.x, v.y);
  }
  if constexpr (L1Of<Cfg>::value == 1) return ldg_nc_el_v2(p);
  return ldg_nc_na_v2(p);
}
template <class Cfg>
__device__ __forceinline__ float load_rec4(const unsigned char* p) {
  if constexpr (kNoGather<Cfg>) return __uint_as_float(0x3C000000u | (addr_bits(p) & 0xFFu));
  if constexpr (L1Of<Cfg>::value == 1) return ldg_nc_el_f32(p);
  return ldg_nc_na_f32(p);
}

// The byte offset of token `id`'s 656-byte record in the pool, from an unsigned block and slot
// (one multiply each); `id` >= 0 inside the pool, or -1, whose offset is computed but never read
// from (ldg_nc_v2x3_if tests the id).
template <class Cfg>
__device__ __forceinline__ unsigned long long record_offset(const MlaSparseParams& p, int id) {
  const unsigned u = static_cast<unsigned>(id);
  return static_cast<unsigned long long>(u / Cfg::kPageSize) * static_cast<unsigned long long>(p.kv_stride_block) +
         static_cast<unsigned long long>(u % Cfg::kPageSize) * static_cast<unsigned long long>(p.kv_stride_slot);
}
// The 656-byte record of token `id` (>= 0, inside the pool).
template <class Cfg>
__device__ __forceinline__ const unsigned char* record_of(const MlaSparseParams& p, int id) {
  return p.kv + record_offset<Cfg>(p, id);
}

// Unit j (0..31) of token `id`'s NoPE bytes and the scale of its 128-value group, or zeros for
// an invalid id (-1): a zero row, so that P V never meets a NaN.
template <class Cfg>
__device__ __forceinline__ void load_unit(const MlaSparseParams& p, int id, int j, uint4& raw, float& scale) {
  if (id >= 0) {
    const unsigned char* rec = record_of<Cfg>(p, id);
    raw = load_rec16<Cfg>(rec + 16 * j);
    scale = load_rec4<Cfg>(rec + kDimNope + 4 * (j >> 3));
  } else {
    raw = make_uint4(0, 0, 0, 0);
    scale = 0.f;
  }
}
// One token's NoPE bytes as a producer lane takes them, by Cfg::kMap (layout.cuh): a 16-byte
// unit and its group's scale (the unit split and its pairs), or (kMapRows) two 8-byte pieces,
// units l % 8 of chunks rows_chunk(l) and + 2, and their two groups' scales (adjacent: one
// 8-byte load). load_piece fills one, zeros for an invalid id; store_piece converts it into the
// tile (and the peer's) at row n, from lane l's chunk in the tile (piece_chunk, computed once).
struct UnitPiece {
  uint4 raw;
  float scale;
};
struct RowPieces {
  uint2 a, b;
  float sa, sb;
};
template <bool kRows>
struct PieceOf {
  using type = UnitPiece;
};
template <>
struct PieceOf<true> {
  using type = RowPieces;
};
template <class Cfg>
__device__ __forceinline__ unsigned piece_chunk(unsigned tile, int l) {
  return tile + (MapOf<Cfg>::value == kMapRows ? rows_chunk(l) : l >> 2) * kChunkBytes;
}
template <class Cfg>
__device__ __forceinline__ void load_piece(const MlaSparseParams& p, int id, int l, UnitPiece& u) {
  load_unit<Cfg>(p, id, l, u.raw, u.scale);
}
template <class Cfg>
__device__ __forceinline__ void load_piece(const MlaSparseParams& p, int id, const unsigned char* lane_base,
                                           int scale_delta, RowPieces& r) {
  const unsigned char* a = lane_base + record_offset<Cfg>(p, id);
  uint2 s;
  if constexpr (kNoGather<Cfg>) {
    r.a = id >= 0 ? load_rec8<Cfg>(a) : make_uint2(0, 0);
    r.b = id >= 0 ? load_rec8<Cfg>(a + 128) : make_uint2(0, 0);
    s = id >= 0 ? load_rec8<Cfg>(a + scale_delta) : make_uint2(0, 0);
  } else {
    ldg_nc_v2x3_if<L1Of<Cfg>::value == 1>(id, a, a + scale_delta, r.a, r.b, s);
  }
  r.sa = __uint_as_float(s.x);
  r.sb = __uint_as_float(s.y);
}
template <class Cfg, int kCl>
__device__ __forceinline__ void store_piece(const Smem& sm, unsigned chunk, int n, int l, const UnitPiece& u,
                                            unsigned peer_bar) {
  int u_lo = (l & 3) * 2, u_hi = u_lo + 1;
  uint4 raw = u.raw;
  if constexpr (MapOf<Cfg>::value == kMapPairs) {
    // layout.cuh pair_stores: the even lane swaps its second half (it keeps unit U, gets U + 2),
    // the odd lane its first (it keeps U + 3, gets U + 1). Same token, same 128-value group:
    // same scale.
    const PairStores ps = pair_stores(l);
    const unsigned g0 = __shfl_xor_sync(0xffffffffu, ps.swapped ? raw.z : raw.x, 1);
    const unsigned g1 = __shfl_xor_sync(0xffffffffu, ps.swapped ? raw.w : raw.y, 1);
    raw = ps.swapped ? make_uint4(raw.x, raw.y, g0, g1) : make_uint4(g0, g1, raw.z, raw.w);
    u_lo = ps.lo;
    u_hi = ps.hi;
  }
  uint4 lo, hi;
  if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
    lo = hi = raw;
  } else {
    dequant16<Cfg>(raw, u.scale, lo, hi);
  }
  store_nope<Cfg, kCl>(sm, chunk + swz(n, u_lo), lo, peer_bar);
  store_nope<Cfg, kCl>(sm, chunk + swz(n, u_hi), hi, peer_bar);
}
// `at`: the piece's first unit in the tile (rows_stores).
template <class Cfg, int kCl>
__device__ __forceinline__ void store_piece(const Smem& sm, unsigned at, const RowPieces& r, unsigned peer_bar) {
  uint4 lo, hi;
  if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
    lo = make_uint4(r.a.x, r.a.y, r.a.x, r.a.y);
    hi = make_uint4(r.b.x, r.b.y, r.b.x, r.b.y);
  } else {
    lo = dequant8<Cfg>(r.a, r.sa);
    hi = dequant8<Cfg>(r.b, r.sb);
  }
  store_nope<Cfg, kCl>(sm, at, lo, peer_bar);
  store_nope<Cfg, kCl>(sm, at + 2 * kChunkBytes, hi, peer_bar);
}

// RoPE unit `unit` (0..7, bf16) of token `id`, or zeros.
template <class Cfg>
__device__ __forceinline__ uint4 load_rope(const MlaSparseParams& p, int id, int unit) {
  return id >= 0 ? load_rec16<Cfg>(record_of<Cfg>(p, id) + kDimNope + 16 + 16 * unit) : make_uint4(0, 0, 0, 0);
}

// ---- Producer (WG2) -------------------------------------------------------------------------------
// The CTA's tokens: all 64, or in a cluster of 2 the 32 of its rank (32 rank ..). Thread t
// gathers, for tokens t / 32 + 4 i of them, the 16 NoPE bytes 16 (t % 32) .. + 15 (one warp
// reads one token's 512 contiguous bytes per load), and kRope of the 16-byte RoPE units. Loads
// go out kPerRound tokens at a time (16 KB per CTA in flight), converted when they land: two
// rounds per block, so two memory latencies (L2 hits after the prefetch) per block.
// kPerRound = 16 / kCl (Cfg::kPipe >= kPipeWhole) gathers the CTA's whole share in one round:
// one latency per block, at 128 producer registers. `before_store` runs after the first round's
// loads are issued and before the first store into the tile (kPipeEarly waits there for the
// tile to be free, so that the loads' latency overlaps the consumers still reading it).
template <class Cfg, int kCl, int kWays, int kPerRound, class BeforeStore>
__device__ __forceinline__ void produce_block(const MlaSparseParams& p, const Smem& sm, int stage,
                                              const int* block_ids, int t, int first_token,
                                              BeforeStore before_store) {
  constexpr int kRounds = 16 / kWays / kPerRound;
  constexpr int kRope = 4 / kWays;  // (tokens x 8 units) / 128 threads
  static_assert(kRounds * kPerRound * 4 * kWays == kTokens, "every token of the block, once");
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  const int* ids = block_ids + first_token;
  const int j = t & 31;
  const int g = t >> 5;
  // RoPE first: its loads are in flight while the first NoPE round converts.
  uint4 rope[kRope];
#pragma unroll
  for (int i = 0; i < kRope; ++i) {
    const int job = t + 128 * i;
    rope[i] = load_rope<Cfg>(p, ids[job >> 3], job & 7);
  }
  using Piece = typename PieceOf<MapOf<Cfg>::value == kMapRows>::type;
  const unsigned chunk = piece_chunk<Cfg>(tile, j);
  const RowsStores rs = rows_stores(j, g, first_token);
  const unsigned rows_at[2] = {tile + rs.at[0], tile + rs.at[1]};
  const unsigned char* lane_base = p.kv + rows_nope_byte(j);
  const int scale_delta = rows_scale_byte(j) - rows_nope_byte(j);
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    Piece pc[kPerRound];
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      if constexpr (MapOf<Cfg>::value == kMapRows) {
        load_piece<Cfg>(p, ids[g + 4 * (round * kPerRound + u)], lane_base, scale_delta, pc[u]);
      } else {
        load_piece<Cfg>(p, ids[g + 4 * (round * kPerRound + u)], j, pc[u]);
      }
    }
    if (round == 0) {
      before_store();
#pragma unroll
      for (int i = 0; i < kRope; ++i) {
        const int job = t + 128 * i;
        store_tile<kBulkPeer<Cfg> ? 1 : kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7),
                                             rope[i], peer_bar);
      }
    }
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      const int k = round * kPerRound + u;  // the piece's token: first_token + g + 4 k
      if constexpr (MapOf<Cfg>::value == kMapRows && ProducersOf<Cfg>::value == 1) {
        // One producer's rows (knob variants) keep an address per piece: with the two bases
        // ptxas spilled its pipe 2 with the peer's bulk copies (20 bytes).
        store_piece<Cfg, kCl>(sm, chunk + swz(first_token + g + 4 * k, j & 7), pc[u], peer_bar);
      } else if constexpr (MapOf<Cfg>::value == kMapRows) {
        store_piece<Cfg, kCl>(sm, rows_at[k & 1] + 512u * static_cast<unsigned>(k), pc[u], peer_bar);
      } else {
        store_piece<Cfg, kCl>(sm, chunk, first_token + g + 4 * k, j, pc[u], peer_bar);
      }
    }
  }
  if constexpr (kBulkPeer<Cfg>) {
    // This warpgroup's rows first_token .. + kRows of each chunk, to the same place in the peer's
    // tile, by the bulk-copy unit once every thread's stores are fenced for the async proxy.
    constexpr int kRows = kTokens / kWays;
    const int pw = (first_token / kRows) % ProducersOf<Cfg>::value;
    fence_proxy_async_smem();
    named_bar_sync(kBarPeerCopy + pw, 128);
    if (t == 0) {
#pragma unroll
      for (int c = 0; c < kDimQK / 64; ++c) {
        const unsigned src = tile + c * kChunkBytes + static_cast<unsigned>(first_token) * 128u;
        bulk_copy_to_peer(sm.peer(src), src, kRows * 128u, peer_bar);
      }
    }
  }
}

// Cfg::kMap = kMapTokens: lane l of warp w takes token w * 8 + l % 8 + 32 i of the CTA's share
// (i < kPer: 2 without a cluster, 1 with) and, of its record, the 16 bytes at 16 (l / 8) + 64 k
// for k < 8 (chunk k of the tile, units 2 (l / 8) and + 1), the 16-byte scale group and RoPE
// units 2 (l / 8), + 1. A warp's load covers eight 64-byte pieces; a quarter warp's stores hit
// eight distinct 16-byte bank groups (row n, unit u ^ (n % 8) with n % 8 = l % 8). kPerRound
// tokens per thread are loaded before the first is converted.
template <class Cfg, int kCl, int kPerRound, class BeforeStore>
__device__ __forceinline__ void produce_block_tokens(const MlaSparseParams& p, const Smem& sm, int stage,
                                                     const int* block_ids, int t, int first_token,
                                                     BeforeStore before_store) {
  constexpr int kPer = kTokens / kCl / 32;  // tokens per thread
  constexpr int kRounds = kPer / kPerRound;
  static_assert(kRounds * kPerRound == kPer, "every token of the share, once");
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  const int lane = t & 31;
  const int q = lane >> 3;
  const int local0 = (t >> 5) * 8 + (lane & 7);  // + 32 i
  // Units 2q and 2q + 1 of a 128-byte row, swizzled by the row's n % 8 = lane % 8.
  const unsigned u0 = static_cast<unsigned>(((2 * q) ^ (lane & 7)) << 4);
  const unsigned u1 = static_cast<unsigned>(((2 * q + 1) ^ (lane & 7)) << 4);
#pragma unroll
  for (int round = 0; round < kRounds; ++round) {
    uint4 raw[kPerRound][8];
    uint4 sc[kPerRound];
    uint4 rope[kPerRound][2];
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      const int id = block_ids[first_token + local0 + 32 * (round * kPerRound + u)];
      if (id >= 0) {
        const unsigned char* rec = record_of<Cfg>(p, id);
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[u][k] = load_rec16<Cfg>(rec + 16 * q + 64 * k);
        sc[u] = load_rec16<Cfg>(rec + kDimNope);
        rope[u][0] = load_rec16<Cfg>(rec + kDimNope + 16 + 32 * q);
        rope[u][1] = load_rec16<Cfg>(rec + kDimNope + 32 + 32 * q);
      } else {
        // A zero row: P V must never meet a NaN.
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[u][k] = make_uint4(0, 0, 0, 0);
        sc[u] = make_uint4(0, 0, 0, 0);
        rope[u][0] = rope[u][1] = make_uint4(0, 0, 0, 0);
      }
    }
    if (round == 0) before_store();
#pragma unroll
    for (int u = 0; u < kPerRound; ++u) {
      const unsigned row = tile + static_cast<unsigned>(first_token + local0 + 32 * (round * kPerRound + u)) * 128u;
      const float scale[4] = {__uint_as_float(sc[u].x), __uint_as_float(sc[u].y), __uint_as_float(sc[u].z),
                              __uint_as_float(sc[u].w)};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        uint4 lo, hi;
        if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
          lo = hi = raw[u][k];
        } else {
          dequant16<Cfg>(raw[u][k], scale[k >> 1], lo, hi);
        }
        store_nope<Cfg, kCl>(sm, row + k * kChunkBytes + u0, lo, peer_bar);
        store_nope<Cfg, kCl>(sm, row + k * kChunkBytes + u1, hi, peer_bar);
      }
      store_tile<kCl>(sm, row + 8 * kChunkBytes + u0, rope[u][0], peer_bar);
      store_tile<kCl>(sm, row + 8 * kChunkBytes + u1, rope[u][1], peer_bar);
    }
  }
}

// The seven 128-byte lines of record `id` (>= 0, inside the pool), shared by kThreadsPerToken
// consecutive threads.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_record(const MlaSparseParams& p, int id, int t) {
  const unsigned char* rec = record_of<Cfg>(p, id);
  if constexpr (kNoGather<Cfg>) {
    return;
  } else if constexpr (PrefetchOf<Cfg>::value == kPrefetchBulk) {
    // Records are 16-byte aligned and 41 x 16 bytes (the gather's 16-byte loads need it too).
    if (t % kThreadsPerToken == 0) prefetch_l2_bulk(rec, kTokenBytes);
  } else if constexpr (PrefetchOf<Cfg>::value == kPrefetchLines) {
#pragma unroll
    for (int k = t % kThreadsPerToken; k < 7; k += kThreadsPerToken) {
      prefetch_l2(rec + (k < 6 ? 128 * k : kTokenBytes - 1));
    }
  } else if constexpr (PrefetchOf<Cfg>::value == kPrefetchSectors) {
#pragma unroll
    for (int k = t % kThreadsPerToken; k < 22; k += kThreadsPerToken) {
      prefetch_l2(rec + (k < 21 ? 32 * k : kTokenBytes - 1));
    }
  }
}

// 128 / kThreadsPerToken tokens from `first_token` of block `blk`: the 656-byte record spans six
// or seven 128-byte lines, so seven prefetches (every 128 bytes and the last byte) shared by the
// token's threads.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_block(const MlaSparseParams& p, const int* row, int len,
                                               unsigned pool, int blk, int first_token, int t) {
  if (blk < 0) return;
  const int pos = blk * kTokens + first_token + t / kThreadsPerToken;
  if (pos >= len) return;
  const int id = checked_id(ldg_nc_s32(row + pos), pool);
  if (id < 0) return;
  prefetch_record<Cfg, kThreadsPerToken>(p, id, t);
}

// Prefetches the block two places after (r, blk) in the partition's order, crossing into the
// next requests of the partition when this one ends (their first blocks would otherwise start
// from cold HBM).
template <class Cfg, int kCl>
__device__ __forceinline__ void prefetch_ahead(const DecodeKernelParams& kp, const SparsePart& part,
                                               int tok, int r, int blk, int blk_end, int steps,
                                               unsigned pool, int first_token, int t) {
  for (int step = 0; step < steps; ++step) {
    ++blk;
    while (blk >= blk_end) {
      if (++r > part.end_req) return;
      const Piece next = piece_of(kp, part, r);
      blk = next.blk_begin;
      blk_end = next.blk_end;
    }
  }
  const MlaSparseParams& p = kp.p;
  const int* row = p.indices + r * p.indices_stride_batch + tok * p.indices_stride_token;
  prefetch_block<Cfg, 2 * kCl>(p, row, request_len(p, r), pool, blk, first_token, t);
}

template <class Cfg, int kCl>
__device__ __forceinline__ void producer(const DecodeKernelParams& kp, const SparsePart& part,
                                         int tok, const Smem& sm, int rank) {
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x - 256;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = rank * (kTokens / kCl);
  int it = 0;
  for (int r = part.begin_req; r <= part.end_req; ++r) {
    const Piece pc = piece_of(kp, part, r);
    const int len = request_len(p, r);
    const int* row = p.indices + r * p.indices_stride_batch + tok * p.indices_stride_token;
    for (int blk = pc.blk_begin; blk < pc.blk_end; ++blk, ++it) {
      const int stage = it & 1;
      // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
      // cluster the barrier also counts the peer's consumers: this producer writes their tile.
      wait_empty<Cfg, kCl>(sm, stage, ((it >> 1) & 1) ^ 1);
      // The peer's bytes for this stage may land before this; the phase still cannot complete
      // until this arrival, and the tx count may dip below zero meanwhile (PTX allows it).
      if (kCl == 2 && t == 0) expect_peer_bytes<Cfg>(sm, stage);
      // Every CTA keeps all 64 ids: the consumers mask with them.
      if (t < kTokens) {
        const int pos = blk * kTokens + t;
        // Ids outside the pool are skipped like -1 rather than read out of bounds.
        sm.ids(it)[t] = checked_id(pos < len ? ldg_nc_s32(row + pos) : -1, pool);
      }
      named_bar_sync(kBarIds, 128);
      // The gather's loads wait a full memory latency per round; records of the block after
      // next are pulled into L2 now so that those rounds hit L2 (a block of work is ~2000 clk,
      // about one loaded HBM latency).
      prefetch_ahead<Cfg, kCl>(kp, part, tok, r, blk, pc.blk_end, 2, pool, first_token, t);
      if (it == 0) prefetch_ahead<Cfg, kCl>(kp, part, tok, r, blk, pc.blk_end, 1, pool, first_token, t);
      produce_block<Cfg, kCl, kCl, 8>(p, sm, stage, sm.ids(it), t, first_token, [] {});
      fence_proxy_async_smem();
      mbar_arrive(sm.full(stage));
    }
  }
}

// ---- Producer, Cfg::kPipe >= kPipeAhead ---------------------------------------------------------
// The base producer's block is a chain of dependent memory round trips: the block's ids (global
// -> shared -> barrier), then the id of the block two ahead for its L2 prefetch (a cold index
// line: the prefetch instruction waits for it, and nothing after it is issued meanwhile), then
// the two gather rounds. kPipeAhead loads both ids a block before they are used (registers
// carried across the loop), so that only the gather rounds remain on the block's path;
// kPipeWhole also gathers the share in one round; kPipeEarly also issues that round's loads
// before waiting for the tile to be free (its ids go to a slot of their own, kIdSlots).


// The L2 prefetch's warm-up, `far` at block 1: blocks 1 .. A - 1 prefetched now (the block loop
// prefetches block i + A at block i), `far` left at block A + 1; returns block A's prefetch id
// (this thread's token pf_k), not yet checked, for the prefetch issued at block 0.
template <class Cfg, int kWays>
__device__ __forceinline__ int prefetch_warm_up(const DecodeKernelParams& kp, const SparsePart& part,
                                                int tok, BlockPos& far, int pf_k, unsigned pool, int t) {
  constexpr int kAhead = AheadOf<Cfg>::value;
  static_assert(kAhead >= 1, "prefetch at least the next block");
  for (int a = 1; a < kAhead; ++a) {
    const int b = checked_id(raw_id_at(part, far, pf_k), pool);
    if (b >= 0) prefetch_record<Cfg, 2 * kWays>(kp.p, b, t);
    next_block(kp, part, tok, far);
  }
  const int pf_id = raw_id_at(part, far, pf_k);
  next_block(kp, part, tok, far);
  return pf_id;
}


template <class Cfg, int kCl>
__device__ __forceinline__ void producer_ahead(const DecodeKernelParams& kp, const SparsePart& part,
                                               int tok, const Smem& sm, int rank) {
  constexpr int kPipe = PipeOf<Cfg>::value;
  constexpr int kProducers = ProducersOf<Cfg>::value;
  // The block's tokens split kWays ways: between the CTAs of a cluster, then between this CTA's
  // producer warpgroups (each a whole share: its own loads, conversions, stores and prefetches).
  constexpr int kWays = kCl * kProducers;
  // Two producer warpgroups hold 4 units per round (their 72 registers), one holds 8.
  constexpr int kPerRound = kPipe >= kPipeWhole ? 16 / kWays : (kProducers == 2 ? 4 : 8);
  constexpr int kTpt = 2 * kWays;  // prefetching threads per token (prefetch_record)
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;  // among all producer threads: the id staging, the peer's bytes
  // In this warpgroup: its share of the block (one producer: tg itself, as ptxas cannot tell).
  const int t = kProducers == 1 ? tg : (tg & 127);
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token =
      rank * (kTokens / kCl) + (kProducers == 1 ? 0 : (tg >> 7) * (kTokens / kWays));
  const int pf_k = first_token + t / kTpt;  // the token this thread prefetches in a block

  // Cursors at blocks i (produced now), i + 1 (whose ids are loaded now) and i + A + 1 (A =
  // kAhead; whose prefetch id is loaded now, for the prefetch issued at block i + 1).
  BlockPos cur = first_block(kp, part, tok);
  BlockPos nxt = cur;
  next_block(kp, part, tok, nxt);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kWays>(kp, part, tok, far, pf_k, pool, t);  // block A
  int my_id = tg < kTokens ? raw_id_at(part, cur, tg) : -1;
  // Phases (kStamp): tile wait, ids staged, next ids and prefetch, the block, fence and arrival.
  Stamps<kStamped<Cfg>> st;
  int it = 0;
  for (; cur.r <= part.end_req; ++it) {
    const int stage = it & 1;
    st.start();
    // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
    // cluster the barrier also counts the peer's consumers: this producer writes their tile.
    auto wait_free = [&] {
      wait_empty<Cfg, kCl>(sm, stage, ((it >> 1) & 1) ^ 1);
      // The peer's bytes may land before this arrival; the phase cannot complete without it.
      if (kCl == 2 && tg == 0) expect_peer_bytes<Cfg>(sm, stage);
    };
    if constexpr (kPipe != kPipeEarly) wait_free();
    st.lap(0);
    // Every CTA keeps all 64 ids: the consumers mask with them. The slot of block it was last
    // read by the consumers of block it - kIdSlots, done before the wait for block it - 2.
    if (tg < kTokens) sm.ids(it)[tg] = checked_id(my_id, pool);
    pf_id = checked_id(pf_id, pool);
    named_bar_sync(kBarIds, 128 * kProducers);
    st.lap(1);
    // A block ahead: the next block's ids, and the id of the block three ahead.
    if (tg < kTokens) my_id = raw_id_at(part, nxt, tg);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(part, far, pf_k);
    st.lap(2);
    if constexpr (MapOf<Cfg>::value == kMapTokens) {
      // The whole share in one round for kPipeWhole and later, else a token per round.
      constexpr int kTokRound = kPipe >= kPipeWhole ? kTokens / kCl / 32 : 1;
      if constexpr (kPipe == kPipeEarly) {
        produce_block_tokens<Cfg, kCl, kTokRound>(p, sm, stage, sm.ids(it), t, first_token, wait_free);
      } else {
        produce_block_tokens<Cfg, kCl, kTokRound>(p, sm, stage, sm.ids(it), t, first_token, [] {});
      }
    } else if constexpr (kPipe == kPipeEarly) {
      produce_block<Cfg, kCl, kWays, kPerRound>(p, sm, stage, sm.ids(it), t, first_token, wait_free);
    } else {
      produce_block<Cfg, kCl, kWays, kPerRound>(p, sm, stage, sm.ids(it), t, first_token, [] {});
    }
    st.lap(3);
    fence_proxy_async_smem();
    mbar_arrive(sm.full(stage));
    if (tg == 0 && it == 0) timeline_mark<Cfg>(kEventFirstFull);
    st.lap(4);
    cur = nxt;
    next_block(kp, part, tok, nxt);
    next_block(kp, part, tok, far);
  }
  st.report(it);
}

// ---- Producer, Cfg::kPipe = kPipeStream ---------------------------------------------------------
// The gather as a stream of rounds, the loads of round k + 1 issued before round k is converted,
// so that one round's memory latency runs under the previous round's conversion (kPipeWhole
// waits for a block's loads, then converts: latency + conversion per block). A round is 8 tokens'
// 16-byte NoPE units with their scales and 2 RoPE units per thread (kRoundsPerBlock of them per
// block: one in a cluster of 2, two without), 48 registers; two are live.
//
// When round k + 1 opens block b + 1, that block's ids are staged (slot (b + 1) % kIdSlots)
// before round k is converted; the slot was last read by the consumers of block b - 3, done
// before the producer's wait for the tile of block b - 1.
struct Round {
  uint4 raw[8];
  float scale[8];
  uint4 rope[2];
};

// Loads round kH of a block (ids in shared memory) into `rd`; units as in produce_block.
template <class Cfg, int kH>
__device__ __forceinline__ void load_round(const MlaSparseParams& p, const int* block_ids, int t,
                                           int first_token, Round& rd) {
  const int* ids = block_ids + first_token;
  const int j = t & 31;
  const int g = t >> 5;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int job = t + 128 * (2 * kH + i);
    rd.rope[i] = load_rope<Cfg>(p, ids[job >> 3], job & 7);
  }
#pragma unroll
  for (int u = 0; u < 8; ++u) load_unit<Cfg>(p, ids[g + 4 * (8 * kH + u)], j, rd.raw[u], rd.scale[u]);
}

// Converts round kH of the block in tile `stage` and stores it (and, in a cluster, the peer's copy).
template <class Cfg, int kCl, int kH>
__device__ __forceinline__ void store_round(const Smem& sm, int stage, int t, int first_token,
                                            const Round& rd) {
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int job = t + 128 * (2 * kH + i);
    store_tile<kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7), rd.rope[i],
                    peer_bar);
  }
  // Two swizzled bases and immediates, not one register per store (layout.cuh, stream_stores).
  const StreamStores at = stream_stores(t, first_token);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    uint4 lo, hi;
    if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
      lo = hi = rd.raw[u];
    } else {
      dequant16<Cfg>(rd.raw[u], rd.scale[u], lo, hi);
    }
    const unsigned a = tile + at.at[u & 1] + 512u * (8 * kH + u);
    store_nope<Cfg, kCl>(sm, a, lo, peer_bar);
    store_nope<Cfg, kCl>(sm, a + at.second, hi, peer_bar);
  }
}


template <class Cfg, int kCl>
__device__ __forceinline__ void producer_stream(const DecodeKernelParams& kp, const SparsePart& part,
                                                int tok, const Smem& sm, int rank) {
  constexpr int kRoundsPerBlock = 2 / kCl;
  constexpr int kTpt = 2 * kCl;  // prefetching threads per token (prefetch_record)
  const MlaSparseParams& p = kp.p;
  const int t = threadIdx.x - 256;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = rank * (kTokens / kCl);
  const int pf_k = first_token + t / kTpt;

  BlockPos nxt = first_block(kp, part, tok);
  if (nxt.r > part.end_req) return;  // no block: the consumers wait for none either
  // Block 0's ids staged, its loads issued; cursors at block 1 (ids) and block A + 1 (prefetch).
  if (t < kTokens) sm.ids(0)[t] = checked_id(raw_id_at(part, nxt, t), pool);
  next_block(kp, part, tok, nxt);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kCl>(kp, part, tok, far, pf_k, pool, t);  // block A
  int my_id = t < kTokens ? raw_id_at(part, nxt, t) : -1;  // block 1
  named_bar_sync(kBarIds, 128);
  Round ra, rb;
  load_round<Cfg, 0>(p, sm.ids(0), t, first_token, ra);

  // Per block: the L2 prefetch of block it + A, then (stage_next) block it + 1's ids; false when
  // block it is the partition's last.
  auto prefetch_step = [&] {
    pf_id = checked_id(pf_id, pool);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(part, far, pf_k);
    next_block(kp, part, tok, far);
  };
  auto stage_next = [&](int it) {
    const bool more = nxt.r <= part.end_req;  // the same for every producer thread
    if (more) {
      if (t < kTokens) sm.ids(it + 1)[t] = checked_id(my_id, pool);
      named_bar_sync(kBarIds, 128);
      next_block(kp, part, tok, nxt);
      my_id = t < kTokens ? raw_id_at(part, nxt, t) : -1;
    }
    return more;
  };
  // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
  // cluster the barrier also counts the peer's consumers: this producer writes their tile.
  auto wait_free = [&](int it) {
    wait_empty<Cfg, kCl>(sm, it & 1, ((it >> 1) & 1) ^ 1);
    // The peer's bytes may land before this arrival; the phase cannot complete without it.
    if (kCl == 2 && t == 0) expect_peer_bytes<Cfg>(sm, it & 1);
  };
  auto publish = [&](int it) {
    fence_proxy_async_smem();
    mbar_arrive(sm.full(it & 1));
  };

  if constexpr (kRoundsPerBlock == 1) {
    // rb takes the next block's loads while ra converts, then moves into ra (a copy; two blocks
    // per trip with the roles swapped spill at 136 registers).
    for (int it = 0;; ++it) {
      prefetch_step();
      const bool more = stage_next(it);
      if (more) load_round<Cfg, 0>(p, sm.ids(it + 1), t, first_token, rb);
      wait_free(it);
      store_round<Cfg, kCl, 0>(sm, it & 1, t, first_token, ra);
      publish(it);
      if (!more) break;
      ra = rb;
    }
  } else {
    // ra holds a block's first round, rb its second.
    for (int it = 0;; ++it) {
      prefetch_step();
      load_round<Cfg, 1>(p, sm.ids(it), t, first_token, rb);
      wait_free(it);
      store_round<Cfg, kCl, 0>(sm, it & 1, t, first_token, ra);
      const bool more = stage_next(it);
      if (more) load_round<Cfg, 0>(p, sm.ids(it + 1), t, first_token, ra);
      store_round<Cfg, kCl, 1>(sm, it & 1, t, first_token, rb);
      publish(it);
      if (!more) break;
    }
  }
}

// ---- Producers, Cfg::kProducers = 2 with Cfg::kPipe = kPipeStream -------------------------------
// The round stream in small rounds, for the two producer warpgroups' 72 registers: a round is
// kSmallUnits 16-byte NoPE units (and their scales) per thread, the loads of round k + 1 issued
// before round k is converted, across blocks too; kRounds rounds per block (4 without a cluster,
// 2 in one). The RoPE units of a block (2 or 1 per thread) are loaded with its round 1 (or, with one
// round left, its round 0's successor), before the wait for the tile, and stored after it.
// ncu at cf8c111 (b128 h64) had the two producers of pipe 1 waiting on each round's loads, two
// full L2 latencies per block and warpgroup.
constexpr int kSmallUnits = 2;
struct SmallRound {
  uint4 raw[kSmallUnits];
  float scale[kSmallUnits];
};

// `ids`: the shared-window address of the share's first id (32-bit: a register fewer than a
// generic pointer, which at page size 1 is the difference between spilling and not).
template <class Cfg>
__device__ __forceinline__ void load_small(const MlaSparseParams& p, unsigned ids, int t, int k,
                                           SmallRound& rd) {
  const int j = t & 31;
  const int g = t >> 5;
#pragma unroll
  for (int u = 0; u < kSmallUnits; ++u) {
    const int id = static_cast<int>(ptx::lds32(ids + 4u * static_cast<unsigned>(g + 4 * (kSmallUnits * k + u))));
    load_unit<Cfg>(p, id, j, rd.raw[u], rd.scale[u]);
  }
}

template <class Cfg, int kCl>
__device__ __forceinline__ void store_small(const Smem& sm, unsigned tile, unsigned peer_bar,
                                            const StreamStores& at, int k, const SmallRound& rd) {
#pragma unroll
  for (int u = 0; u < kSmallUnits; ++u) {
    uint4 lo, hi;
    if constexpr (AblateOf<Cfg>::value == kAblateNoDequant) {
      lo = hi = rd.raw[u];
    } else {
      dequant16<Cfg>(rd.raw[u], rd.scale[u], lo, hi);
    }
    // kSmallUnits is even: unit u's parity is its token's row parity in the stream's stores.
    const unsigned a = tile + at.at[u & 1] + 512u * static_cast<unsigned>(kSmallUnits * k + u);
    store_nope<Cfg, kCl>(sm, a, lo, peer_bar);
    store_nope<Cfg, kCl>(sm, a + at.second, hi, peer_bar);
  }
}

template <class Cfg, int kCl>
__device__ __forceinline__ void producer_stream_small(const DecodeKernelParams& kp,
                                                      const SparsePart& part, int tok,
                                                      const Smem& sm, int rank) {
  constexpr int kWays = 2 * kCl;                       // two producer warpgroups per CTA
  constexpr int kUnits = 16 / kWays;                   // NoPE units per thread and block
  constexpr int kRounds = kUnits / kSmallUnits;        // 4, or 2 in a cluster
  constexpr int kRope = 4 / kWays;                     // RoPE units per thread and block
  constexpr int kTpt = 2 * kWays;                      // prefetching threads per token
  static_assert(kRounds % 2 == 0, "rounds alternate between two buffers within a block");
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;
  const int t = tg & 127;
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = rank * (kTokens / kCl) + (tg >> 7) * (kTokens / kWays);
  const int pf_k = first_token + t / kTpt;
  const StreamStores at = stream_stores(t, first_token);

  BlockPos nxt = first_block(kp, part, tok);
  if (nxt.r > part.end_req) return;  // no block: the consumers wait for none either
  if (tg < kTokens) sm.ids(0)[tg] = checked_id(raw_id_at(part, nxt, tg), pool);
  next_block(kp, part, tok, nxt);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kWays>(kp, part, tok, far, pf_k, pool, t);
  int my_id = tg < kTokens ? raw_id_at(part, nxt, tg) : -1;
  named_bar_sync(kBarIds, 256);
  SmallRound ra, rb;
  load_small<Cfg>(p, ptx::smem_addr(sm.ids(0) + first_token), t, 0, ra);

  for (int it = 0;; ++it) {
    const int stage = it & 1;
    const unsigned tile = sm.k(stage);
    const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
    const unsigned ids = ptx::smem_addr(sm.ids(it) + first_token);
    pf_id = checked_id(pf_id, pool);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(part, far, pf_k);
    next_block(kp, part, tok, far);
    uint4 rope[kRope];
    bool more = false;
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      SmallRound& cur = (k & 1) ? rb : ra;
      SmallRound& other = (k & 1) ? ra : rb;
      if (k == 0) {
#pragma unroll
        for (int i = 0; i < kRope; ++i) {
          const int job = t + 128 * i;
          rope[i] = load_rope<Cfg>(p, static_cast<int>(ptx::lds32(ids + 4u * static_cast<unsigned>(job >> 3))),
                                   job & 7);
        }
      }
      if (k + 1 < kRounds) {
        load_small<Cfg>(p, ids, t, k + 1, other);
      } else {
        // The next block's ids (slot it + 1, last read by the consumers of block it - 3, done
        // before this producer's wait for the tile of block it - 1), then its round 0.
        more = nxt.r <= part.end_req;  // the same for every producer thread
        if (more) {
          if (tg < kTokens) sm.ids(it + 1)[tg] = checked_id(my_id, pool);
          named_bar_sync(kBarIds, 256);
          next_block(kp, part, tok, nxt);
          my_id = tg < kTokens ? raw_id_at(part, nxt, tg) : -1;
          load_small<Cfg>(p, ptx::smem_addr(sm.ids(it + 1) + first_token), t, 0, other);
        }
      }
      if (k == 0) {
        // Fresh barriers complete "the phase before phase 0", so the first two waits pass. In a
        // cluster the barrier also counts the peer's consumers: this producer writes their tile.
        wait_empty<Cfg, kCl>(sm, stage, ((it >> 1) & 1) ^ 1);
        if (kCl == 2 && tg == 0) expect_peer_bytes<Cfg>(sm, stage);
      }
      store_small<Cfg, kCl>(sm, tile, peer_bar, at, k, cur);
      if (k == 0) {
#pragma unroll
        for (int i = 0; i < kRope; ++i) {
          const int job = t + 128 * i;
          store_tile<kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7), rope[i],
                          peer_bar);
        }
      }
    }
    fence_proxy_async_smem();
    mbar_arrive(sm.full(stage));
    if (!more) break;
  }
}

// ---- Producers, Cfg::kStage = 1 (at most 16 heads) ---------------------------------------------
// Two producer warpgroups without a cluster, the rows map: warp g of warpgroup w converts tokens
// k = 32 w + g + 4 u (u = 0..7) of each block, as produce_block does, but from their records
// staged whole in the Q tile (layout.cuh stage_slot) by the bulk-copy unit rather than from
// global loads. The copies run a block ahead, half a warp's tokens at a time: once the warp has
// converted tokens u = 4 h .. 4 h + 3 of block it (their slots read), lanes 4 h .. 4 h + 3 copy
// the same tokens' records of block it + 1 into those slots, completing on the warp's barrier of
// half h (phase it + 1), which block it + 1 waits for just before converting that half: each
// copy has about half a block's work to land (the L2 prefetch, AheadOf blocks ahead, makes it an
// L2 hit). A skipped token (-1) is neither copied nor read: its pieces are zeros.
//
// Block it + 1's ids go to their slot during block it (the copies need them; slot it + 1 was
// last read by the consumers of block it - 3, done before the tile of block it - 2 was released,
// which this block's wait for its tile follows).
__device__ __forceinline__ uint2 staged_or_zero(bool valid, unsigned addr) {
  return valid ? ptx::lds64(addr) : make_uint2(0, 0);
}

template <class Cfg>
__device__ __forceinline__ void producer_staged(const DecodeKernelParams& kp, const SparsePart& part,
                                                int tok, const Smem& sm) {
  constexpr int kWays = 2;         // the two producer warpgroups split a block's tokens
  constexpr int kTpt = 2 * kWays;  // prefetching threads per token (prefetch_record)
  static_assert(ClusterOf<Cfg>::value == 1 && ProducersOf<Cfg>::value == 2 && MapOf<Cfg>::value == kMapRows,
                "Cfg::kStage: two producers' rows without a cluster");
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;
  const int t = tg & 127;
  const int g = t >> 5;
  const int j = t & 31;
  const int pw = tg >> 5;  // producer warp 0..7: its staging barriers
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  const int first_token = (tg >> 7) * (kTokens / kWays);
  const int pf_k = first_token + t / kTpt;
  // The no-gather ablation copies nothing (its pieces are whatever the slots hold).
  constexpr unsigned kRecordBytes = kNoGather<Cfg> ? 0u : static_cast<unsigned>(kTokenBytes);
  // Token u's slot is stage_slot(first_token + g + 4 u): since first_token % 8 = 0 that is the
  // warp's first slot + (u / 2) chunks + (u % 2) four records (layout.cuh), immediates from one
  // base; the lane's NoPE and scale bytes from two more.
  const unsigned slot0 = sm.q() + stage_slot(first_token + g);
  const auto slot = [&](int u) {
    return slot0 + static_cast<unsigned>((u >> 1) * kChunkBytes + (u & 1) * 4 * kTokenBytes);
  };
  const unsigned nope0 = slot0 + rows_nope_byte(j);
  const unsigned scale0 = slot0 + rows_scale_byte(j);
  const RowsStores rs = rows_stores(j, g, first_token);
  const unsigned bar0 = ptx::smem_addr(sm.staged(pw, 0));
  // Half h of this warp's tokens of a block: lane 0 raises the barrier's phase by the valid
  // records' bytes, then lanes 4 h .. 4 h + 3 copy theirs (`id`: lane u's token u, checked).
  const auto copy_half = [&](int h, int id, unsigned valid) {
    if (j == 0) {
      mbar_arrive_expect_tx_cta(sm.staged(pw, h),
                                static_cast<unsigned>(__popc((valid >> (4 * h)) & 0xFu)) * kRecordBytes);
    }
    __syncwarp();
    if (j >= 4 * h && j < 4 * h + 4 && id >= 0) {
      if constexpr (!kNoGather<Cfg>) bulk_load_shared(slot(j), record_of<Cfg>(p, id), kTokenBytes, bar0 + 8u * h);
    }
  };

  // Cursors at blocks it + 1 (whether it exists), it + 2 (its ids loaded now, staged at block
  // it + 1) and the prefetch's.
  BlockPos nxt = first_block(kp, part, tok);
  if (nxt.r > part.end_req) return;  // no block: the consumers wait for none either
  if (tg < kTokens) sm.ids(0)[tg] = checked_id(raw_id_at(part, nxt, tg), pool);
  next_block(kp, part, tok, nxt);
  BlockPos nxt2 = nxt;
  next_block(kp, part, tok, nxt2);
  BlockPos far = nxt;
  int pf_id = prefetch_warm_up<Cfg, kWays>(kp, part, tok, far, pf_k, pool, t);  // block A
  int my_id = tg < kTokens ? raw_id_at(part, nxt, tg) : -1;  // block 1, staged at block 0
  named_bar_sync(kBarIds, 256);
  unsigned valid;  // bit u: this warp's token u of the block converted next is not skipped
  {
    const int id = j < 8 ? sm.ids(0)[first_token + g + 4 * j] : -1;
    valid = __ballot_sync(0xffffffffu, id >= 0) & 0xFFu;
    copy_half(0, id, valid);
    copy_half(1, id, valid);
  }

  Stamps<kStamped<Cfg>> st;
  int it = 0;
  for (bool more = true; more; ++it) {
    const int stage = it & 1;
    const unsigned tile = sm.k(stage);
    st.start();
    // Fresh barriers complete "the phase before phase 0", so the first two waits pass.
    wait_empty<Cfg, 1>(sm, stage, ((it >> 1) & 1) ^ 1);
    st.lap(0);
    more = nxt.r <= part.end_req;  // block it + 1 exists (the same for every thread)
    if (tg < kTokens) sm.ids(it + 1)[tg] = more ? checked_id(my_id, pool) : -1;
    pf_id = checked_id(pf_id, pool);
    named_bar_sync(kBarIds, 256);
    st.lap(1);
    if (tg < kTokens) my_id = raw_id_at(part, nxt2, tg);
    if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
    pf_id = raw_id_at(part, far, pf_k);
    // Block it + 1's ids of this warp's tokens (lane u), for its copies.
    const int next_id = more && j < 8 ? sm.ids(it + 1)[first_token + g + 4 * j] : -1;
    const unsigned next_valid = __ballot_sync(0xffffffffu, next_id >= 0) & 0xFFu;
    st.lap(2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mbar_wait(sm.staged(pw, h), static_cast<unsigned>(it & 1));
      RowPieces pc[4];
      uint4 rope;
      {
        const int u = 4 * h + (j >> 3);
        const bool ok = (valid >> u) & 1u;
        rope = ok ? ptx::lds128(slot(u) + kDimNope + 16 + 16 * (j & 7)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int u = 4 * h + i;
        const bool ok = (valid >> u) & 1u;
        const unsigned du = slot(u) - slot0;
        pc[i].a = staged_or_zero(ok, nope0 + du);
        pc[i].b = staged_or_zero(ok, nope0 + du + 128);
        const uint2 s = staged_or_zero(ok, scale0 + du);
        pc[i].sa = __uint_as_float(s.x);
        pc[i].sb = __uint_as_float(s.y);
      }
      {
        const int u = 4 * h + (j >> 3);
        sts128(tile + 8 * kChunkBytes + swz(first_token + g + 4 * u, j & 7), rope);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int u = 4 * h + i;
        store_piece<Cfg, 1>(sm, tile + rs.at[u & 1] + 512u * static_cast<unsigned>(u), pc[i], 0u);
      }
      // The half's slots are read (every lane's loads were consumed by its stores): block it + 1's
      // records of the same tokens may land in them.
      __syncwarp();
      if (more) copy_half(h, next_id, next_valid);
    }
    st.lap(3);
    fence_proxy_async_smem();
    mbar_arrive(sm.full(stage));
    if (tg == 0 && it == 0) timeline_mark<Cfg>(kEventFirstFull);
    st.lap(4);
    valid = next_valid;
    nxt = nxt2;
    next_block(kp, part, tok, nxt2);
    next_block(kp, part, tok, far);
  }
  st.report(it);
}

}  // namespace deca::mla::sm90
