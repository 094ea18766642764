// The sparse decode scheduler: one plain function, compiled for the host (table tests, the
// bench's expectations) and for the device (a one-thread kernel runs it per call, reading
// topk_length from device memory, so a captured graph replays it with the lengths of the replay).
// Deterministic: the same lengths give the same bytes.
//
// Greedy split (seed 001 step 3, the contract in sparse_work.cuh): request r costs
// n(r) + kFixedOverheadBlocks units; every partition gets at most
//   payload = ceil(total cost / num_parts) + kFixedOverheadBlocks
// units. Walking the requests in order, a partition takes a whole remainder of a request when
// remainder + overhead fits, else remain - overhead blocks of it (cutting the request) when that
// is at least one block. Each partition consumes at least payload - overhead = ceil(total /
// num_parts) units of the original cost, so num_parts partitions always cover every request;
// cutting adds one piece per partition at most, so slots <= batch + num_parts - 1.
#pragma once

#include "kernels/mla/sparse_work.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_MLA_HD __host__ __device__
#else
#define DECA_MLA_HD
#endif

namespace deca::mla {

// Indices of request r that count: topk, or topk_length[r] clamped to [0, topk].
DECA_MLA_HD inline int sparse_request_len(const int* topk_length, int topk, int r) {
  if (topk_length == nullptr) return topk;
  const int len = topk_length[r];
  return len < 0 ? 0 : (len > topk ? topk : len);
}

DECA_MLA_HD inline int sparse_request_blocks(const int* topk_length, int topk, int r) {
  return (sparse_request_len(topk_length, topk, r) + kTopkBlock - 1) / kTopkBlock;
}

// Fills parts[0 .. num_parts) and split_offsets[0 .. batch]; returns the slot count
// (split_offsets[batch]). split_offsets doubles as the per-request piece counter during the walk.
DECA_MLA_HD inline int schedule_sparse(int batch, int topk, const int* topk_length, int num_parts,
                                       SparsePart* parts, int* split_offsets) {
  int total = 0;  // batch * (512 + 5) at most: no overflow below four million requests
  for (int r = 0; r < batch; ++r) {
    total += sparse_request_blocks(topk_length, topk, r) + kFixedOverheadBlocks;
    split_offsets[r + 1] = 0;
  }
  split_offsets[0] = 0;
  const int payload = (total + num_parts - 1) / num_parts + kFixedOverheadBlocks;

  // Pass 1: the walk. parts[i].begin_split holds begin_req's piece index until pass 2.
  int req = 0;
  int block = 0;
  int piece = 0;  // pieces of `req` already handed out
  for (int i = 0; i < num_parts; ++i) {
    SparsePart& part = parts[i];
    part.begin_req = req;
    part.begin_block = block;
    part.begin_split = piece;
    part.pad = 0;
    int remain = payload;
    int end_req = req - 1;
    int end_block = 0;
    while (req < batch) {
      const int n = sparse_request_blocks(topk_length, topk, req);
      const int rest = n - block;
      if (rest + kFixedOverheadBlocks <= remain) {
        remain -= rest + kFixedOverheadBlocks;
        ++split_offsets[req + 1];
        end_req = req;
        end_block = n;
        ++req;
        block = 0;
        piece = 0;
        continue;
      }
      if (remain - kFixedOverheadBlocks > 0) {
        block += remain - kFixedOverheadBlocks;
        ++split_offsets[req + 1];
        ++piece;
        end_req = req;
        end_block = block;
      }
      break;
    }
    part.end_req = end_req;
    part.end_block = end_block;
  }

  // Pass 2: counts -> offsets, then each partition's slots and split counts.
  for (int r = 0; r < batch; ++r) split_offsets[r + 1] += split_offsets[r];
  for (int i = 0; i < num_parts; ++i) {
    SparsePart& part = parts[i];
    if (part.begin_req > part.end_req) {
      part.begin_split = 0;
      part.begin_split_count = 0;
      part.end_split_count = 0;
      continue;
    }
    const int b = part.begin_req;
    const int e = part.end_req;
    part.begin_split += split_offsets[b];
    part.begin_split_count = split_offsets[b + 1] - split_offsets[b];
    part.end_split_count = split_offsets[e + 1] - split_offsets[e];
  }
  return split_offsets[batch];
}

// The slot of request r's piece in `part` (r in begin_req..end_req): every request after
// begin_req starts in this partition, so its piece is its first slot.
DECA_MLA_HD inline int sparse_piece_slot(const SparsePart& part, const int* split_offsets, int r) {
  return r == part.begin_req ? part.begin_split : split_offsets[r];
}

// Blocks [first, last) of request r that `part` processes.
DECA_MLA_HD inline void sparse_piece_blocks(const SparsePart& part, const int* topk_length,
                                            int topk, int r, int& first, int& last) {
  first = r == part.begin_req ? part.begin_block : 0;
  last = r == part.end_req ? part.end_block : sparse_request_blocks(topk_length, topk, r);
}

// The number of partitions: one partition is a column of (q_len x head blocks) CTAs, so this
// many columns fill the SMs once. Fewer would leave SMs idle; more would make every request pay
// the fixed overhead more often without adding parallelism (FlashMLA's choice, seed 001 3.3).
DECA_MLA_HD inline int sparse_num_parts(int sm_count, int q_len, int num_heads) {
  const int head_blocks = (num_heads + 63) / 64;
  const int parts = sm_count / (q_len * head_blocks);
  return parts < 1 ? 1 : parts;
}

}  // namespace deca::mla
