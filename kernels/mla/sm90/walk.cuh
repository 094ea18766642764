// How a CTA of the sm90a MLA sparse decode kernels walks its partition (SparsePart,
// kernels/mla/schedule/work.cuh): the request pieces the consumers take in order, the block
// cursors and raw index loads the producers run ahead with, and where a token's record lies.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::mla::sm90 {

using namespace ::deca::sm90;  // the Hopper PTX wrappers

// One request's share of this partition.
struct Piece {
  int blk_begin;
  int blk_end;
  int slot;    // partial slot when split
  bool split;
};

__device__ __forceinline__ int request_len(const MlaSparseParams& p, int r) {
  if (p.topk_length == nullptr) return p.topk;
  int l = p.topk_length[r];
  l = l < 0 ? 0 : l;
  return l > p.topk ? p.topk : l;
}

// MODEL1 (kModel1<Cfg>): the request's blocks of both caches.
template <class Cfg>
__device__ __forceinline__ Piece piece_of(const DecodeKernelParams& kp, const SparsePart& part,
                                          int r) {
  int n;
  if constexpr (kModel1<Cfg>) {
    n = request_blocks(topk_lists<true>(kp.p), r);
  } else {
    n = (request_len(kp.p, r) + kTokens - 1) / kTokens;
  }
  Piece pc;
  pc.blk_begin = r == part.begin_req ? part.begin_block : 0;
  pc.blk_end = r == part.end_req ? part.end_block : n;
  const int count = r == part.begin_req ? part.begin_split_count
                                        : (r == part.end_req ? part.end_split_count : 1);
  pc.split = count > 1;
  pc.slot = r == part.begin_req ? part.begin_split : kp.run.split_offsets[r];
  return pc;
}

// A position in the partition's order of blocks, as the producers walk it, with the request's
// row of indices for the CTA's query token: set once per request, so that a block's id loads
// add an offset to it (built from the strides per load, the address took ~25 instructions).
// MODEL1 (BlockPosT<true>): n1 = the first cache's blocks; from block n1 on, `row` and `len` are
// the extra cache's, shifted so that position blk * 64 + k still addresses entry
// (blk - n1) * 64 + k (to_extra). The one-cache kernels keep the struct without n1.
template <bool kTwoCaches>
struct BlockPosT {
  int r, blk, blk_end, len;
  const int* row;
};
template <>
struct BlockPosT<true> {
  int r, blk, blk_end, len;
  const int* row;
  int n1;
};
template <class Cfg>
using BlockPos = BlockPosT<kModel1<Cfg>>;

// MODEL1: the cursor enters request c.r's extra-cache blocks.
__device__ __forceinline__ void to_extra(const MlaSparseParams& p, int tok, BlockPosT<true>& c) {
  const int shift = c.n1 * kTokens;
  c.row = p.extra_indices + c.r * p.extra_indices_stride_batch + tok * p.extra_indices_stride_token - shift;
  c.len = shift + ::deca::mla::request_len(p.extra_topk_length, p.extra_topk, c.r);
}
// Whether the cursor's block is the extra cache's (MODEL1).
__device__ __forceinline__ bool in_extra(const BlockPosT<true>& c) { return c.blk >= c.n1; }

// Dense decode: the request's block-table row, and the keys query token `tok` sees (causal among
// the q_len new tokens; below zero when it sees none).
template <class Cfg>
__device__ __forceinline__ void enter_request(const DecodeKernelParams& kp, const SparsePart& part,
                                              int tok, BlockPos<Cfg>& c) {
  const Piece pc = piece_of<Cfg>(kp, part, c.r);
  c.blk = pc.blk_begin;
  c.blk_end = pc.blk_end;
  c.len = request_len(kp.p, c.r);
  if constexpr (kDense<Cfg>) {
    c.len -= kp.p.q_len - 1 - tok;
    c.row = kp.dense.block_table + c.r * kp.dense.block_table_stride;
    if constexpr (kChecked<Cfg>) {
      // A length past the table's columns (recorded by check_lengths) reads no entry past them.
      const long long columns = static_cast<long long>(kp.dense.max_blocks) * Cfg::kPageSize;
      if (c.len > columns) c.len = static_cast<int>(columns);
    }
  } else {
    c.row = kp.p.indices + c.r * kp.p.indices_stride_batch + tok * kp.p.indices_stride_token;
  }
  if constexpr (kModel1<Cfg>) {
    c.n1 = (c.len + kTokens - 1) / kTokens;
    if (c.blk >= c.n1) to_extra(kp.p, tok, c);
  }
}

template <class Cfg>
__device__ __forceinline__ void settle(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                       BlockPos<Cfg>& c) {
  while (c.r <= part.end_req && c.blk >= c.blk_end) {
    if (++c.r > part.end_req) break;
    enter_request<Cfg>(kp, part, tok, c);
  }
}

template <class Cfg>
__device__ __forceinline__ BlockPos<Cfg> first_block(const DecodeKernelParams& kp, const SparsePart& part,
                                                int tok) {
  BlockPos<Cfg> c{part.begin_req, 0, 0, 0, kp.p.indices};
  if (c.r <= part.end_req) enter_request<Cfg>(kp, part, tok, c);
  settle<Cfg>(kp, part, tok, c);
  return c;
}

template <class Cfg>
__device__ __forceinline__ void next_block(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                           BlockPos<Cfg>& c) {
  if (c.r > part.end_req) return;
  ++c.blk;
  // MODEL1: the request goes on in the extra cache (a new request's cursor is set by settle).
  if constexpr (kModel1<Cfg>) {
    if (c.blk == c.n1 && c.blk < c.blk_end) to_extra(kp.p, tok, c);
  }
  settle<Cfg>(kp, part, tok, c);
}

// Token `k` of the block at `c` as loaded, a block before it is used: the index as stored
// (sparse; MODEL1: slot 1 for the extra cache's), or the block-table entry and the slot in that
// block (dense); -1 past the partition or past the request's (the query token's) length (a checked
// dense kernel's slot -1 then tells it from a table entry of -1, which is an offender there).
// Not yet checked: the check reads the loaded value, so it is done where the id is used, a
// block later (finish_id), or the load's latency would be waited for here (ptxas puts the compare
// right after the load).
struct RawId {
  int v;
  int slot;
};
template <class Cfg>
__device__ __forceinline__ RawId raw_id_at(const SparsePart& part, const BlockPos<Cfg>& c, int k) {
  const int pos = c.blk * kTokens + k;
  if (c.r > part.end_req || pos >= c.len) return RawId{-1, kChecked<Cfg> && kDense<Cfg> ? -1 : 0};
  if constexpr (kDense<Cfg>) {
    return RawId{ldg_nc_s32(c.row + pos / Cfg::kPageSize), pos % Cfg::kPageSize};
  } else if constexpr (kModel1<Cfg>) {
    return RawId{ldg_nc_s32(c.row + pos), in_extra(c) ? 1 : 0};
  } else {
    return RawId{ldg_nc_s32(c.row + pos), 0};
  }
}
// The token id a raw one names, or -1: an index outside the pool (checked_id), or a block-table
// entry outside [0, num_blocks) (one unsigned compare; -1 is 2^32 - 1 as unsigned).
// MODEL1: an extra cache's index (raw.slot 1) against that cache's pool, `extra_pool`.
template <class Cfg>
__device__ __forceinline__ int finish_id(const DecodeKernelParams& kp, RawId raw, unsigned pool,
                                         unsigned extra_pool = 0) {
  if constexpr (kModel1<Cfg>) {
    return checked_id(raw.v, raw.slot ? extra_pool : pool);
  } else if constexpr (kDense<Cfg>) {
    return static_cast<unsigned>(raw.v) >= static_cast<unsigned>(kp.p.num_blocks) ? -1
                                                                                  : raw.v * Cfg::kPageSize + raw.slot;
  } else {
    return checked_id(raw.v, pool);
  }
}

// The byte offset of token `id`'s record in the pool, from an unsigned block and slot
// (one multiply each); `id` >= 0 inside the pool, or -1, whose offset is computed but never read
// from (ldg_nc_v2x3_if tests the id).
template <class Cfg>
__device__ __forceinline__ unsigned long long record_offset(const MlaSparseParams& p, int id) {
  const unsigned u = static_cast<unsigned>(id);
  return static_cast<unsigned long long>(u / Cfg::kPageSize) * static_cast<unsigned long long>(p.kv_stride_block) +
         static_cast<unsigned long long>(u % Cfg::kPageSize) * static_cast<unsigned long long>(p.kv_stride_slot);
}
// The record (the 656-byte token, or a dense row) of token `id` (>= 0, inside the pool).
template <class Cfg>
__device__ __forceinline__ const unsigned char* record_of(const MlaSparseParams& p, int id) {
  return p.kv + record_offset<Cfg>(p, id);
}

}  // namespace deca::mla::sm90
