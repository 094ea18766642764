// How a CTA of the sm90a MLA sparse decode kernels walks its partition (SparsePart,
// kernels/mla/schedule/work.cuh): the request pieces the consumers take in order, the block
// cursors and raw index loads the producers run ahead with, and where a token's record lies.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/mla/sm90/traits.cuh"
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

__device__ __forceinline__ Piece piece_of(const DecodeKernelParams& kp, const SparsePart& part,
                                          int r) {
  const int n = (request_len(kp.p, r) + kTokens - 1) / kTokens;
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
struct BlockPos {
  int r, blk, blk_end, len;
  const int* row;
};

__device__ __forceinline__ void enter_request(const DecodeKernelParams& kp, const SparsePart& part,
                                              int tok, BlockPos& c) {
  const Piece pc = piece_of(kp, part, c.r);
  c.blk = pc.blk_begin;
  c.blk_end = pc.blk_end;
  c.len = request_len(kp.p, c.r);
  c.row = kp.p.indices + c.r * kp.p.indices_stride_batch + tok * kp.p.indices_stride_token;
}

__device__ __forceinline__ void settle(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                       BlockPos& c) {
  while (c.r <= part.end_req && c.blk >= c.blk_end) {
    if (++c.r > part.end_req) break;
    enter_request(kp, part, tok, c);
  }
}

__device__ __forceinline__ BlockPos first_block(const DecodeKernelParams& kp, const SparsePart& part,
                                                int tok) {
  BlockPos c{part.begin_req, 0, 0, 0, kp.p.indices};
  if (c.r <= part.end_req) enter_request(kp, part, tok, c);
  settle(kp, part, tok, c);
  return c;
}

__device__ __forceinline__ void next_block(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                           BlockPos& c) {
  if (c.r > part.end_req) return;
  ++c.blk;
  settle(kp, part, tok, c);
}

// Id `k` of the block at `c` as stored (-1 past the partition or past the request's length),
// not yet checked: the check reads the loaded value, so it is done where the id is used, a block
// later (checked_id), or the load's latency is waited for here (ptxas puts the compare right
// after the load).
__device__ __forceinline__ int raw_id_at(const SparsePart& part, const BlockPos& c, int k) {
  const int pos = c.blk * kTokens + k;
  if (c.r > part.end_req || pos >= c.len) return -1;
  return ldg_nc_s32(c.row + pos);
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

}  // namespace deca::mla::sm90
