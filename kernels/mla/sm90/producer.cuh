// The producer warpgroups of the sm90a MLA sparse decode wide kernel (decode.cuh): per block of
// 64 selected tokens, the ids staged for the consumers' masks, the L2 prefetch of the next
// block's records, the gather of this block's records, their dequantization (dequant.cuh) and
// the stores into the K tile (and, in a cluster of 2, the peer's).
//
// The block's tokens are split kWays ways: between the CTAs of a cluster, then between the two
// producer warpgroups of a CTA (each a whole share: its own loads, conversions, stores and
// prefetches). Each warpgroup gathers its whole share of a block in one round (all loads issued,
// then converted as they land: one memory latency per block), and loads the next block's ids and
// the prefetch's ids a block before they are used (registers carried across the loop), so that
// only the gather remains on a block's path.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/checked.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/dequant.cuh"
#include "kernels/mla/sm90/gather.cuh"
#include "kernels/mla/sm90/layout.cuh"
#include "kernels/mla/sm90/model1.cuh"
#include "kernels/mla/sm90/pipeline.cuh"
#include "kernels/mla/sm90/rows.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/sm90/walk.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// One token's NoPE bytes as a producer lane takes them (layout.cuh, whole rows): lane l of the
// warp on token n takes two 8-byte pieces, units l % 8 of chunks rows_chunk(l) and + 2, and their
// two 128-value groups' scales (adjacent: one 8-byte load), so that each of its two stores is one
// eighth of a whole 128-byte row of the tile: a warp's store writes four rows, each a contiguous
// 128 bytes (the swizzle permutes units within a row), which the peer's st.async needs too.
// load_piece fills one (zeros for an invalid id: a zero row, so that P V never meets a NaN);
// store_piece converts it into the tile (and the peer's).
struct RowPieces {
  uint2 a, b;
  float sa, sb;
};
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
    ldg_nc_v2x3_if<kL1EvictLast<Cfg>>(id, a, a + scale_delta, r.a, r.b, s);
  }
  r.sa = __uint_as_float(s.x);
  r.sb = __uint_as_float(s.y);
}
// `at`: the piece's first unit in the tile (rows_stores).
template <int kCl>
__device__ __forceinline__ void store_piece(const Smem& sm, unsigned at, const RowPieces& r, unsigned peer_bar) {
  const uint4 lo = dequant8(r.a, r.sa);
  const uint4 hi = dequant8(r.b, r.sb);
  store_tile<kCl>(sm, at, lo, peer_bar);
  store_tile<kCl>(sm, at + 2 * kChunkBytes, hi, peer_bar);
}

// RoPE unit `unit` (0..7, bf16) of token `id`, or zeros.
template <class Cfg>
__device__ __forceinline__ uint4 load_rope(const MlaSparseParams& p, int id, int unit) {
  return id >= 0 ? load_rec16<Cfg>(record_of<Cfg>(p, id) + kDimNope + 16 + 16 * unit) : make_uint4(0, 0, 0, 0);
}

// One producer warpgroup's share of a block: tokens first_token .. + 64 / kWays, kPerRound
// (= 16 / kWays) pieces per thread, all loaded before the first is converted. Thread t (warp g,
// lane j) takes tokens first_token + g + 4 u, u < kPerRound, and kRope of the share's 16-byte
// RoPE units, whose loads are issued first so that they are in flight while the NoPE converts.
template <class Cfg, int kCl, int kWays, int kPerRound>
__device__ __forceinline__ void produce_block(const MlaSparseParams& p, const Smem& sm, int stage,
                                              const int* block_ids, int t, int first_token) {
  constexpr int kRope = 4 / kWays;  // (tokens x 8 units) / 128 threads
  static_assert(kPerRound * 4 * kWays == kTokens, "every token of the block, once");
  const unsigned tile = sm.k(stage);
  const unsigned peer_bar = sm.peer(ptx::smem_addr(sm.remote(stage)));
  const int* ids = block_ids + first_token;
  const int j = t & 31;
  const int g = t >> 5;
  uint4 rope[kRope];
#pragma unroll
  for (int i = 0; i < kRope; ++i) {
    const int job = t + 128 * i;
    rope[i] = load_rope<Cfg>(p, ids[job >> 3], job & 7);
  }
  // Two swizzled bases and immediates, not an address per piece (layout.cuh rows_stores).
  const RowsStores rs = rows_stores(j, g, first_token);
  const unsigned rows_at[2] = {tile + rs.at[0], tile + rs.at[1]};
  const unsigned char* lane_base = p.kv + rows_nope_byte(j);
  const int scale_delta = rows_scale_byte(j) - rows_nope_byte(j);
  RowPieces pc[kPerRound];
#pragma unroll
  for (int u = 0; u < kPerRound; ++u) load_piece<Cfg>(p, ids[g + 4 * u], lane_base, scale_delta, pc[u]);
#pragma unroll
  for (int i = 0; i < kRope; ++i) {
    const int job = t + 128 * i;
    store_tile<kCl>(sm, tile + 8 * kChunkBytes + swz(first_token + (job >> 3), job & 7), rope[i], peer_bar);
  }
#pragma unroll
  for (int u = 0; u < kPerRound; ++u) {
    store_piece<kCl>(sm, rows_at[u & 1] + 512u * static_cast<unsigned>(u), pc[u], peer_bar);
  }
}

// The L2 prefetch of token `id`'s record (>= 0, inside the pool): the 656 bytes span six or seven
// 128-byte lines, so seven prefetches (every 128 bytes and the last byte) shared by the token's
// kThreadsPerToken consecutive threads.
template <class Cfg, int kThreadsPerToken>
__device__ __forceinline__ void prefetch_record(const MlaSparseParams& p, int id, int t) {
  if constexpr (kNoGather<Cfg>) return;
  const unsigned char* rec = record_of<Cfg>(p, id);
#pragma unroll
  for (int k = t % kThreadsPerToken; k < 7; k += kThreadsPerToken) {
    prefetch_l2(rec + (k < 6 ? 128 * k : kTokenBytes - 1));
  }
}

template <class Cfg, int kCl>
__device__ __forceinline__ void producer(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                         const Smem& sm, int rank, const TensorMapBytes* kv_map) {
  constexpr int kWays = kCl * 2;           // CTAs of the cluster x producer warpgroups
  constexpr int kPerRound = 16 / kWays;    // the warpgroup's whole share in one round
  constexpr int kTpt = 2 * kWays;          // prefetching threads per token (prefetch_record)
  static_assert(!kTmaRows<Cfg> || (kCl == 2 && kDense<Cfg> && KvFormatOf<Cfg>::value == kMlaKvBF16 &&
                                   Cfg::kPageSize % kTokens == 0),
                "Cfg::kTma: dense bf16 rows in a cluster of 2, pages of a multiple of 64 tokens");
  const MlaSparseParams& p = kp.p;
  const int tg = threadIdx.x - 256;  // among both producer warpgroups: the id staging, the peer's bytes
  const int t = tg & 127;            // in this warpgroup: its share of the block
  const unsigned pool = pool_bound(static_cast<long long>(p.num_blocks) * Cfg::kPageSize);
  [[maybe_unused]] unsigned extra_pool = 0;
  if constexpr (kModel1<Cfg>) {
    extra_pool = pool_bound(static_cast<long long>(p.extra_num_blocks) * ExtraPageOf<Cfg>::value);
  }
  const int first_token = rank * (kTokens / kCl) + (tg >> 7) * (kTokens / kWays);
  const int pf_k = first_token + t / kTpt;  // the token this thread prefetches in a block
  // Dense bf16 rows by TMA (rows.cuh) when the host encoded the cache's tensor map; the no-gather
  // ablation times the register producers' stand-in loads instead.
  [[maybe_unused]] const bool use_map = kTmaRows<Cfg> && !kNoGather<Cfg> && kp.dense.use_map != 0;

  // Cursors at blocks i (produced now), i + 1 (whose ids are loaded now) and i + 2 (whose
  // prefetch id is loaded now, for the prefetch issued at block i + 1: the L2 prefetch runs one
  // block ahead of the gather).
  BlockPos<Cfg> cur = first_block<Cfg>(kp, part, tok);
  BlockPos<Cfg> nxt = cur;
  next_block<Cfg>(kp, part, tok, nxt);
  BlockPos<Cfg> far = nxt;
  RawId pf_raw = raw_id_at<Cfg>(part, far, pf_k);  // block 1's, prefetched at block 0
  next_block<Cfg>(kp, part, tok, far);
  RawId my_raw = tg < kTokens ? raw_id_at<Cfg>(part, cur, tg) : RawId{-1, 0};
  [[maybe_unused]] int bad_it = -1;  // checked: the first block whose id of this thread was refused
  for (int it = 0; cur.r <= part.end_req; ++it) {
    const int stage = it & 1;
    // The tile free. Fresh barriers complete "the phase before phase 0", so the first two waits
    // pass. In a cluster the barrier also counts the peer's consumers: this producer writes their
    // tile, and the peer's bytes may land before the expect_tx arrival (the phase cannot complete
    // without it).
    const auto wait_free = [&] {
      wait_empty(sm, stage, ((it >> 1) & 1) ^ 1);
      if constexpr (kTmaRows<Cfg>) {
        if (tg == 0) mbar_arrive_expect_tx_cta(sm.remote(stage), use_map ? kTileBytes : kPeerBytes);
      } else if (kCl == 2 && tg == 0) {
        expect_peer_bytes<kModel1<Cfg>>(sm, stage);
      }
    };
    wait_free();
    // Every CTA keeps all 64 ids: the consumers mask with them. The slot of block it was last
    // read by the consumers of block it - kIdSlots, done before the wait for block it - 2.
    // Checked, the first block whose id of these was refused is kept for the record (checked.cuh);
    // the prefetch's ids are the same entries, finished silently.
    if (tg < kTokens) {
      const int id = finish_id<Cfg>(kp, my_raw, pool, extra_pool);
      if constexpr (kChecked<Cfg>) bad_it = first_refused<Cfg>(my_raw, id, it, bad_it);
      if constexpr (kTmaRows<Cfg>) {
        if (tg == 0 && use_map) issue_rows_tma<Cfg>(kv_map, sm, stage, id, rank);
      }
      sm.ids(it)[tg] = id;
    }
    const int pf_id = finish_id<Cfg>(kp, pf_raw, pool, extra_pool);
    named_bar_sync(kBarIds, 256);
    // A block ahead: the next block's ids, and the id of the block two ahead.
    if (tg < kTokens) my_raw = raw_id_at<Cfg>(part, nxt, tg);
    if constexpr (kRowFormat<Cfg>) {
      if (pf_id >= 0) prefetch_row<Cfg, kTpt>(p, pf_id, t);
      pf_raw = raw_id_at<Cfg>(part, far, pf_k);
      if (use_map) {  // false at compile time but in the TMA rows' kernels
        zero_invalid_rows(sm, stage, sm.ids(it), tg, (it >> 1) & 1);
      } else {
        produce_rows<Cfg, kCl, kWays>(kp, sm, stage, sm.ids(it), t, first_token);
      }
    } else if constexpr (kModel1<Cfg>) {
      if (pf_id >= 0) prefetch_model1<Cfg, kTpt>(p, pf_id, pf_raw.slot != 0, t);
      pf_raw = raw_id_at<Cfg>(part, far, pf_k);
      produce_model1<Cfg, kCl, kWays>(p, sm, stage, sm.ids(it), t, first_token, in_extra(cur));
    } else {
      if (pf_id >= 0) prefetch_record<Cfg, kTpt>(p, pf_id, t);
      pf_raw = raw_id_at<Cfg>(part, far, pf_k);
      produce_block<Cfg, kCl, kWays, kPerRound>(p, sm, stage, sm.ids(it), t, first_token);
    }
    fence_proxy_async_smem();
    mbar_arrive(sm.full(stage));
    cur = nxt;
    next_block<Cfg>(kp, part, tok, nxt);
    next_block<Cfg>(kp, part, tok, far);
  }
  if constexpr (kChecked<Cfg>) {
    report_refused<Cfg>(kp, part, tok, bad_it, tg, pool, extra_pool);
    if (tg < 32) check_lengths<Cfg>(kp, part, tg);
  }
}

}  // namespace deca::mla::sm90
