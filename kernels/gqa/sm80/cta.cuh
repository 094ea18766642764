// The portable GQA kernel's first phase (decode.cuh): where this thread sits in the CTA and the
// mma fragments, which rows and keys the CTA takes, and its work items (one per tile, or per beam
// where beams part ways).
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {

// This thread's warp and lane, and its place in the mma fragments.
struct Lane {
  int tid;
  int warp;
  int lane;
  int g;       // mma group: row (A/C) or column (B) within an 8-slice
  int c;       // thread in group
  int warp_m;  // the warp's 16-row slice
  int warp_n;  // the warp's slice of each tile's tokens
};

template <class T>
__device__ __forceinline__ Lane lane_of_thread() {
  Lane ln;
  ln.tid = threadIdx.x;
  ln.warp = ln.tid / 32;
  ln.lane = ln.tid % 32;
  ln.g = ln.lane / 4;
  ln.c = ln.lane % 4;
  ln.warp_m = ln.warp / T::kWarpsN;
  ln.warp_n = ln.warp % T::kWarpsN;
  return ln;
}

// The CTA: split blockIdx.x, (kv head, row block) from blockIdx.y, request blockIdx.z. Beam
// search: the B beams of a request (adjacent batch entries) share a CTA, rows ordered (beam,
// token, head), so pages the beams share are read once for all of them.
template <class T>
struct CtaCoords {
  int split;
  int row_blocks;  // row blocks per kv head
  int kv_head;
  int row_block;
  int request;
  int batch;  // the first beam's batch entry
  int q_len;
  int rows_per_beam;  // q_len x group
  int rows_total;     // beams x q_len x group
  int seq_len;        // the longest beam's length
  int seq_min;        // the shortest beam's
  int row0;           // first row of this CTA

  __device__ __forceinline__ int row_batch(int row) const {
    return T::kBeamWidth == 1 ? batch : batch + row / rows_per_beam;
  }
  __device__ __forceinline__ int row_tok(int row) const {
    return (T::kBeamWidth == 1 ? row : row % rows_per_beam) / T::kGroup;
  }
  // The q row of CTA row `row` (its beam's batch entry, token, and head of the kv head's group).
  __device__ __forceinline__ const void* q_src(const GqaParams& p, int row) const {
    const int head = kv_head * T::kGroup + row % T::kGroup;
    return static_cast<const unsigned short*>(p.q) + row_batch(row) * p.q_stride_batch +
           row_tok(row) * p.q_stride_token + head * p.q_stride_head;
  }
  // Where the kernel reads it: the fused step's rotated copy in shared memory (append.cuh), else
  // the caller's q.
  __device__ __forceinline__ const void* q_row(const GqaParams& p, int row) const {
    if constexpr (T::kFused) {
      extern __shared__ __align__(128) unsigned char deca_fused_smem[];
      return reinterpret_cast<const unsigned short*>(deca_fused_smem) + (row - row0) * T::kHeadDim;
    } else {
      return q_src(p, row);
    }
  }
};

template <class T>
__device__ __forceinline__ CtaCoords<T> cta_coords(const GqaParams& p) {
  CtaCoords<T> cta;
  cta.split = blockIdx.x;
  cta.row_blocks = gridDim.y / p.num_kv_heads;
  cta.kv_head = blockIdx.y / cta.row_blocks;
  cta.row_block = blockIdx.y % cta.row_blocks;
  cta.request = blockIdx.z;
  cta.batch = cta.request * T::kBeamWidth;
  cta.q_len = p.q_len;
  cta.rows_per_beam = cta.q_len * T::kGroup;
  cta.rows_total = T::kBeamWidth * cta.rows_per_beam;
  cta.seq_len = load_seq_len<T>(p, cta.batch);
  cta.seq_min = cta.seq_len;
  if constexpr (T::kBeamWidth > 1) {
#pragma unroll
    for (int j = 1; j < T::kBeamWidth; ++j) {
      const int l = load_seq_len<T>(p, cta.batch + j);
      cta.seq_len = l > cta.seq_len ? l : cta.seq_len;
      cta.seq_min = l < cta.seq_min ? l : cta.seq_min;
    }
  }
  cta.row0 = cta.row_block * T::kRows;
  return cta;
}

// Checked mode: bad_item[item % kBadItemSlots] == item when a page id of work item `item` was out
// of range, so that the warps mask its keys. An item's ids are read kStages iterations before it
// is consumed; with kStages + 1 slots that write never lands on a slot still being read (the
// item kStages + 1 earlier was consumed before the __syncthreads that precedes the write). Null
// unchecked (no shared memory declared).
template <class T>
__device__ __forceinline__ int* checked_items(int tid) {
  int* bad_item = nullptr;
  if constexpr (T::kChecked) {
    bad_item = checked_item_slots<T::kBadItemSlots>();
    if (tid < T::kBadItemSlots) bad_item[tid] = -1;
    __syncthreads();  // initialised before the prologue's first page reads
  }
  return bad_item;
}

// Work items: one per tile, except that with beams a tile whose pages differ between beams (or
// that reaches past the shortest beam) is one item per beam, its keys masked for the other beams'
// rows. Items 0 .. shared_tiles - 1 are the beams' shared prefix.
template <class T>
struct WorkItems {
  int shared_tiles;
  int num_items;
  __device__ __forceinline__ int tile(int item) const {
    return item < shared_tiles ? item : shared_tiles + (item - shared_tiles) / T::kBeamWidth;
  }
  // The item's beam; -1: all beams.
  __device__ __forceinline__ int beam(int item) const {
    return item < shared_tiles ? -1 : (item - shared_tiles) % T::kBeamWidth;
  }
};

// The beams' shared prefix: the tiles of `range` before the first page that differs between the
// beams or the shortest beam's end, found by every thread at once (`first_diverged`: a shared int
// of the kernel's). A page longer than a tile can start before range.begin by a tile or more (a
// split or window boundary inside the page): when it differs, the prefix is empty (0), not a
// negative count that would map the first items to tiles before the range.
template <class T>
__device__ __forceinline__ int beams_shared_tiles(const GqaParams& p, const CtaCoords<T>& cta,
                                                  const KeyRange& range, int num_tiles,
                                                  int& first_diverged) {
  if (threadIdx.x == 0) first_diverged = num_tiles;
  __syncthreads();
  const int* table0 = p.page_table + cta.batch * p.page_table_stride;
  const int page_lo = range.begin / T::kPageSize;
  const int full_tiles = cta.seq_min > range.begin ? (cta.seq_min - range.begin) / T::kTile : 0;
  const int check_tiles = full_tiles < num_tiles ? full_tiles : num_tiles;
  const int page_hi = check_tiles > 0 ? (range.begin + check_tiles * T::kTile - 1) / T::kPageSize : page_lo - 1;
  for (int pg = page_lo + static_cast<int>(threadIdx.x); pg <= page_hi; pg += T::kThreads) {
    const int id = __ldg(table0 + pg);
    bool same = true;
#pragma unroll
    for (int j = 1; j < T::kBeamWidth; ++j) same = same && __ldg(table0 + j * p.page_table_stride + pg) == id;
    const int from_begin = pg * T::kPageSize - range.begin;
    if (!same) atomicMin(&first_diverged, from_begin > 0 ? from_begin / T::kTile : 0);
  }
  __syncthreads();
  return first_diverged < check_tiles ? first_diverged : check_tiles;
}

// The kv head's K and V scales with the widening's factor (kv_convert.cuh widen_factor), and the
// logit scale: logits in log2 units, the softmax runs on ex2.
struct KvScales {
  float k;
  float v;
  float qk;    // softmax_scale x k
  float log2;  // qk x log2(e)
};

template <class T>
__device__ __forceinline__ KvScales kv_scales(const GqaParams& p, int kv_head) {
  constexpr float kWiden = kv::widen_factor<T::kKvKind>();
  KvScales s;
  s.k = (p.k_scales ? p.k_scales[kv_head] : p.k_scale) * kWiden;
  s.v = (p.v_scales ? p.v_scales[kv_head] : p.v_scale) * kWiden;
  s.qk = p.softmax_scale * s.k;
  s.log2 = s.qk * kLog2e;
  return s;
}

}  // namespace deca::gqa
