// Checked mode of the sm90a MLA decode kernels (Cfg::kChecked, config.cuh): the record
// (kernels/common/check_record.cuh) of the first id, length or schedule out of range, with the
// portable checked kernel's fields (kernels/mla/sm80/decode.cuh, gather.cuh, model1.cuh), so that
// check_mla_run reads either kernel's record alike.
//
// What is skipped does not change: the unchecked kernels already mask every id outside its pool
// (finish_id: the consumers see -1, the producers read nothing through it); checked mode adds the
// record, and for dense decode the portable kernel's limit of a length to the block table's
// columns (walk.cuh enter_request; unchecked, cache_seqlens within them is the caller's promise). The test rides on finish_id's compare, a block after the id was loaded (the
// load's latency is not waited for): per block one compare and select keep the first block in
// which a thread's id was refused (first_refused, one register across the loop). Nothing else is
// on a block's path: after its last block the thread walks its cursor to that block again, loads
// the entry again and records it (report_refused; one atomicCAS claims the record, so a clean
// run writes nothing and each offending thread tries once). Writing the record where the id is
// refused spilled the producers (56 or 80 registers): the record's address, its six fields and
// the entry's position were live inside the block loop. Lengths are tested by one producer warp
// after its blocks (check_lengths).
//
// In a cluster of 2 both CTAs load the same ids and lengths and test them alike (each CTA's
// producers read only through ids they tested themselves, its consumers mask with its own);
// whichever claims the record first writes the same fields. The record's other words are written
// only by the thread whose atomicCAS claimed it, and read by the host after the stream.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "kernels/mla/schedule/work.cuh"
#include "kernels/mla/sm90/config.cuh"
#include "kernels/mla/sm90/walk.cuh"

namespace deca::mla::sm90 {

// Whether finish_id refused a counted entry: `id` < 0 for a raw id that counts. Not counted:
// sparse entries of -1 (past the list's length, or stored -1: skipped without a record), dense
// ones of slot -1 (past what the query token sees; a stored -1 is a bad block id).
template <class Cfg>
__device__ __forceinline__ bool refused(RawId raw, int id) {
  return id < 0 && (kDense<Cfg> ? raw.slot >= 0 : raw.v != -1);
}

// In the block loop: the first block `it` whose id of this thread was refused, else `first`
// (-1 while none was). One compare and select a block; the record waits for the loop's end.
template <class Cfg>
__device__ __forceinline__ int first_refused(RawId raw, int id, int it, int first) {
  return first < 0 && refused<Cfg>(raw, id) ? it : first;
}

// After the loop: the record of token `k` of the partition's block `bad_it` (first_refused; -1:
// none) for query token `tok`, found again by walking the cursor there and loading its id
// again: sparse indices[r][tok][position] (MODEL1: extra_indices' position in its own list)
// against num_blocks * page_size, dense block_table[r][column] against num_blocks.
template <class Cfg>
__device__ __forceinline__ void report_refused(const DecodeKernelParams& kp, const SparsePart& part, int tok,
                                               int bad_it, int k, unsigned pool, unsigned extra_pool = 0) {
  if (bad_it < 0) return;
  BlockPos<Cfg> at = first_block<Cfg>(kp, part, tok);
  for (int it = 0; it < bad_it; ++it) next_block<Cfg>(kp, part, tok, at);
  const RawId raw = raw_id_at<Cfg>(part, at, k);
  if (!refused<Cfg>(raw, finish_id<Cfg>(kp, raw, pool, extra_pool))) return;  // the entry changed since
  const MlaSparseParams& p = kp.p;
  auto* rec = static_cast<CheckRecord*>(kp.run.check);
  const int pos = at.blk * kTokens + k;
  if constexpr (kDense<Cfg>) {
    check_report(rec, kCheckPageId, at.r, 0, pos / Cfg::kPageSize, raw.v, p.num_blocks);
  } else {
    if constexpr (kModel1<Cfg>) {
      if (raw.slot != 0) {
        check_report(rec, kCheckExtraIndex, at.r, tok, pos - at.n1 * kTokens, raw.v,
                     static_cast<long long>(p.extra_num_blocks) * p.extra_page_size);
        return;
      }
    }
    check_report(rec, kCheckIndex, at.r, tok, pos, raw.v, static_cast<long long>(p.num_blocks) * p.page_size);
  }
}

// The lengths of the partition's requests, lane `lane` of one warp taking every 32nd: topk_length
// outside [0, topk] (dense: cache_seqlens outside [0, min(max_seq_len, max_blocks * page_size)]),
// MODEL1's extra_topk_length outside [0, extra_topk]. The walk clamped them already.
template <class Cfg>
__device__ __forceinline__ void check_lengths(const DecodeKernelParams& kp, const SparsePart& part, int lane) {
  if constexpr (kChecked<Cfg>) {
    const MlaSparseParams& p = kp.p;
    auto* rec = static_cast<CheckRecord*>(kp.run.check);
    long long hi = p.topk;
    if constexpr (kDense<Cfg>) {
      const long long columns = static_cast<long long>(kp.dense.max_blocks) * p.page_size;
      hi = columns < hi ? columns : hi;
    }
    for (int r = part.begin_req + lane; r <= part.end_req; r += 32) {
      if (p.topk_length != nullptr) {
        const int raw = p.topk_length[r];
        if (raw < 0 || raw > hi) check_report(rec, kCheckTopkLength, r, 0, 0, raw, hi);
      }
      if constexpr (kModel1<Cfg>) {
        if (p.extra_topk > 0 && p.extra_topk_length != nullptr) {
          const int raw = p.extra_topk_length[r];
          if (raw < 0 || raw > p.extra_topk) {
            check_report(rec, kCheckExtraTopkLength, r, 0, 0, raw, p.extra_topk);
          }
        }
      }
    }
  }
}

// A reused schedule of another call shape: the record of what the workspace held (checked only).
template <class Cfg>
__device__ __forceinline__ void check_schedule(const DecodeKernelParams& kp) {
  if constexpr (kChecked<Cfg>) report_schedule_mismatch(kp.run);
}

}  // namespace deca::mla::sm90
