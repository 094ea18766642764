// The sparse decode scheduler: plain functions, compiled for the host (table tests, the bench's
// expectations) and for the device (a one-CTA kernel runs the same phases per call, reading
// topk_length from device memory, so a captured graph replays it with the lengths of the replay).
// Deterministic: the same lengths give the same bytes.
//
// Greedy split (seed 001 step 3, the contract in kernels/mla/schedule/work.cuh): request r costs
// n(r) + kFixedOverheadBlocks units; every partition gets at most
//   payload = ceil(total cost / num_parts) + kFixedOverheadBlocks
// units. Walking the requests in order, a partition takes a whole remainder of a request when
// remainder + overhead fits, else remain - overhead blocks of it (cutting the request) when that
// is at least one block. Each partition consumes at least payload - overhead = ceil(total /
// num_parts) units of the original cost, so num_parts partitions always cover every request;
// cutting adds one piece per partition at most, so slots <= batch + num_parts - 1.
#pragma once

#include "kernels/mla/schedule/work.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_MLA_HD __host__ __device__
#else
#define DECA_MLA_HD
#endif

namespace deca::mla {

// Indices of request r that count: topk, or topk_length[r] clamped to [0, topk].
DECA_MLA_HD inline int request_len(const int* topk_length, int topk, int r) {
  if (topk_length == nullptr) return topk;
  const int len = topk_length[r];
  return len < 0 ? 0 : (len > topk ? topk : len);
}

DECA_MLA_HD inline int request_blocks(const int* topk_length, int topk, int r) {
  return (request_len(topk_length, topk, r) + kTopkBlock - 1) / kTopkBlock;
}

// The index lists of a call: the first cache's and, for MODEL1 (kMlaKvModel1), the extra
// cache's (extra_topk > 0). Request r's work list is the first cache's blocks of 64 indices, then
// the extra cache's (each block from one cache), so that the scheduler's costs and cuts spread
// both selections over the partitions alike.
struct TopkLists {
  const int* topk_length;
  int topk;
  const int* extra_topk_length;
  int extra_topk;  // 0: one cache
};

// One cache's lists (V3.2, dense).
DECA_MLA_HD inline TopkLists one_cache(const int* topk_length, int topk) {
  return TopkLists{topk_length, topk, nullptr, 0};
}

// The lists of a call; kExtra (MODEL1 kernels only) adds the extra cache's. Without it the extra
// fields are constants, so the one-cache kernels compile as they did before the second cache.
template <bool kExtra>
DECA_MLA_HD inline TopkLists topk_lists(const MlaSparseParams& p) {
  if constexpr (kExtra) return TopkLists{p.topk_length, p.topk, p.extra_topk_length, p.extra_topk};
  return one_cache(p.topk_length, p.topk);
}

// Blocks of request r in both caches: the first cache's come first.
DECA_MLA_HD inline int request_blocks(const TopkLists& l, int r) {
  const int n = request_blocks(l.topk_length, l.topk, r);
  return l.extra_topk > 0 ? n + request_blocks(l.extra_topk_length, l.extra_topk, r) : n;
}

// Every request's block count when no length is given (the uniform walk), else -1.
DECA_MLA_HD inline int uniform_blocks(const TopkLists& l) {
  if (l.topk_length != nullptr || (l.extra_topk > 0 && l.extra_topk_length != nullptr)) return -1;
  return request_blocks(l, 0);
}

// The scheduler in phases, so that the GPU runs every phase but the walk across its threads (the
// walk is the only serial part, and it touches nothing but registers and one load per request).
// `first` / `stride` pick a thread's share of a parallel phase; the host runs them with 0 / 1.
// split_offsets carries the block counts n(r) (phase 1) until the walk is done, then the piece
// counts (phase 3), then the offsets (phase 4).

// Phase 1, per request: n(r) into split_offsets[r + 1]; returns this share's sum of costs.
DECA_MLA_HD inline int schedule_stage_blocks(int batch, const TopkLists& lists, int* split_offsets,
                                             int first, int stride) {
  int cost = 0;  // batch * (512 + 5) at most per cache: no overflow below two million requests
  for (int r = first; r < batch; r += stride) {
    const int n = request_blocks(lists, r);
    split_offsets[r + 1] = n;
    cost += n + kFixedOverheadBlocks;
  }
  return cost;
}

// Phase 2, one thread: the greedy walk (file comment), bounds only. `uniform_blocks` >= 0: every
// request has that many blocks (no topk_length) and `blocks` is not read; a partition is then a
// few integer operations (the whole requests it takes are one division), not a step per request.
// Ragged: one step per request, the next request's count loaded a step ahead so that the chain
// is the compare, not the shared-memory latency.
// The units every partition may take: ceil(total cost / num_parts) + the fixed overhead.
DECA_MLA_HD inline int schedule_payload(int total, int num_parts) {
  return (total + num_parts - 1) / num_parts + kFixedOverheadBlocks;
}

// One partition of the walk when every request has n blocks, from request `req`, block `block`:
// a few integer operations (the whole requests it takes are one division). Returns the
// partition and moves req / block past it.
DECA_MLA_HD inline SparsePart schedule_uniform_part(int batch, int n, int payload, int& req, int& block) {
  constexpr int kOver = kFixedOverheadBlocks;
  const int cost = n + kOver;
  SparsePart part{req, block, req - 1, 0, 0, 0, 0, 0};
  if (req < batch) {
    int remain = payload;
    if (n - block + kOver <= remain) {
      remain -= n - block + kOver;
      int take = remain / cost;
      if (take > batch - req - 1) take = batch - req - 1;
      remain -= take * cost;
      req += take + 1;
      block = 0;
      part.end_req = req - 1;
      part.end_block = n;
      if (req < batch && remain - kOver > 0) {
        block = remain - kOver;
        part.end_req = req;
        part.end_block = block;
      }
    } else if (remain - kOver > 0) {
      block += remain - kOver;
      part.end_req = req;
      part.end_block = block;
    }
  }
  return part;
}

DECA_MLA_HD inline void schedule_walk(int batch, int uniform_blocks, const int* blocks, int total,
                                      int num_parts, SparsePart* parts) {
  constexpr int kOver = kFixedOverheadBlocks;
  const int payload = schedule_payload(total, num_parts);
  int req = 0;
  int block = 0;
  if (uniform_blocks >= 0) {
    for (int i = 0; i < num_parts; ++i) parts[i] = schedule_uniform_part(batch, uniform_blocks, payload, req, block);
    return;
  }
  int n = batch > 0 ? blocks[1] : 0;
  int n_next = batch > 1 ? blocks[2] : 0;
  for (int i = 0; i < num_parts; ++i) {
    SparsePart part{req, block, req - 1, 0, 0, 0, 0, 0};
    int remain = payload;
    while (req < batch) {
      const int rest = n - block;
      if (rest + kOver <= remain) {
        remain -= rest + kOver;
        part.end_req = req;
        part.end_block = n;
        ++req;
        block = 0;
        n = n_next;
        n_next = req + 1 < batch ? blocks[req + 2] : 0;
        continue;
      }
      if (remain - kOver > 0) {
        block += remain - kOver;
        part.end_req = req;
        part.end_block = block;
      }
      break;
    }
    parts[i] = part;
  }
}

// A partition that starts inside a request (begin_block > 0) adds a piece to it; every request
// has one piece besides (the partition holding its block 0, or its empty piece).
DECA_MLA_HD inline bool part_cuts_in(const SparsePart& part) {
  return part.begin_req <= part.end_req && part.begin_block > 0;
}

// Phase 5, per partition (after the offsets are final): slot and split counts. A partition that
// starts inside request b is piece 1 + (the partitions right before it that also start inside b).
DECA_MLA_HD inline void schedule_fill_slots(int num_parts, const int* split_offsets,
                                            SparsePart* parts, int first, int stride) {
  for (int i = first; i < num_parts; i += stride) {
    SparsePart& part = parts[i];
    if (part.begin_req > part.end_req) {
      part.begin_split = 0;
      part.begin_split_count = 0;
      part.end_split_count = 0;
      continue;
    }
    const int b = part.begin_req;
    const int e = part.end_req;
    int piece = 0;
    if (part.begin_block > 0) {
      piece = 1;
      for (int j = i - 1; j >= 0 && parts[j].begin_req == b && parts[j].begin_block > 0; --j) ++piece;
    }
    part.begin_split = split_offsets[b] + piece;
    part.begin_split_count = split_offsets[b + 1] - split_offsets[b];
    part.end_split_count = split_offsets[e + 1] - split_offsets[e];
  }
}

// Fills parts[0 .. num_parts) and split_offsets[0 .. batch]; returns the slot count
// (split_offsets[batch]). The host's serial run of the phases the scheduler kernel runs.
DECA_MLA_HD inline int schedule_requests(int batch, const TopkLists& lists, int num_parts,
                                       SparsePart* parts, int* split_offsets) {
  const int uniform = uniform_blocks(lists);
  const int total = schedule_stage_blocks(batch, lists, split_offsets, 0, 1);
  schedule_walk(batch, uniform, split_offsets, total, num_parts, parts);
  for (int r = 0; r < batch; ++r) split_offsets[r + 1] = 1;                       // phase 3
  for (int i = 0; i < num_parts; ++i) {
    if (part_cuts_in(parts[i])) ++split_offsets[parts[i].begin_req + 1];
  }
  split_offsets[0] = 0;                                                            // phase 4
  for (int r = 0; r < batch; ++r) split_offsets[r + 1] += split_offsets[r];
  schedule_fill_slots(num_parts, split_offsets, parts, 0, 1);
  return split_offsets[batch];
}

// The slot of request r's piece in `part` (r in begin_req..end_req): every request after
// begin_req starts in this partition, so its piece is its first slot.
DECA_MLA_HD inline int piece_slot(const SparsePart& part, const int* split_offsets, int r) {
  return r == part.begin_req ? part.begin_split : split_offsets[r];
}

// Blocks [first, last) of request r that `part` processes.
DECA_MLA_HD inline void piece_blocks(const SparsePart& part, const TopkLists& lists, int r, int& first,
                                    int& last) {
  first = r == part.begin_req ? part.begin_block : 0;
  last = r == part.end_req ? part.end_block : request_blocks(lists, r);
}

// The number of partitions: one partition is a column of (q_len x head blocks) CTAs, so this
// many columns fill the SMs once. Fewer would leave SMs idle; more would make every request pay
// the fixed overhead more often without adding parallelism (FlashMLA's choice, seed 001 3.3).
// Whether the schedule of a call without lengths (every request topk (+ extra_topk) indices) cuts a
// request, i.e. whether the combine kernel has pieces to merge: the backend leaves it out when
// not (at b128 / b64 x 128 heads on 66 partitions it would only launch 2048 / 1024 CTAs that
// return at once). The walk's first partition decides: one that ends on a request boundary is
// followed by partitions starting at block 0 with the same payload, which take the same whole
// requests (or, clamped at the batch's end, the rest). O(1): the backend asks on every call.
DECA_MLA_HD inline bool schedule_cuts_requests(int batch, const TopkLists& lists, int num_parts) {
  const int n = uniform_blocks(lists);
  const int payload = schedule_payload(batch * (n + kFixedOverheadBlocks), num_parts);
  int req = 0;
  int block = 0;
  schedule_uniform_part(batch, n, payload, req, block);
  return block > 0;
}

DECA_MLA_HD inline int decode_num_parts(int sm_count, int q_len, int num_heads) {
  const int head_blocks = (num_heads + 63) / 64;
  const int parts = sm_count / (q_len * head_blocks);
  return parts < 1 ? 1 : parts;
}

}  // namespace deca::mla
