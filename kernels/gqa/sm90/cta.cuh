// What both Hopper GQA kernels (decode.cuh, decode_rows.cuh) set up first: their shared
// memory's base, stages and wgmma descriptors, the checked mode's ring slots, and split-KV's unit
// of the CTA.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/common/sm90_ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {

// The CTA's unit of work: one request and kv head, the keys [first, end) of its split.
struct Unit {
  int request;
  int kv_head;
  int seq_len;  // the request's length (causal positions)
  int first;    // first key (tile aligned)
  int end;      // one past the last key
  int tiles;
};

// Whether a tile needs its logits masked: it reaches past the first row's causal start or the
// unit's end, starts before the window, or holds a page id the checked build refused.
template <class T>
__device__ __forceinline__ bool tile_needs_mask(const GqaParams& p, const Unit& u, int tile_t0, bool bad_tile,
                                                int causal_start, int seq_len) {
  return tile_t0 + T::kTile > causal_start || tile_t0 + T::kTile > u.end ||
         (T::kWindow && tile_t0 < seq_len - p.window) || bad_tile;
}

// The loader's walk over the unit's tiles (tile_loader.cuh): tile i of u, the end of its tiles,
// and whether it is past them.
struct TileCursor {
  Unit u;
  int i;
  int hi;
  bool done;
};

// The dynamic buffer's base rounded up to 1024 (the 128-byte swizzle's atoms start there, so the
// descriptors' base offset is 0), the ring's K and V stages from it, and the wgmma descriptor of
// an operand at a byte offset from it: desc0 + offset / 16 (the start address field is the low 14
// bits, and every offset stays below 256 KB).
struct CtaSmem {
  unsigned base;        // shared-window address
  unsigned char* smem;  // the same byte, generic
  unsigned long long desc0;
  __device__ __forceinline__ explicit CtaSmem(unsigned char* raw) {
    const unsigned r = ptx::smem_addr(raw);
    base = (r + 1023u) & ~1023u;
    smem = raw + (base - r);
    desc0 = ::deca::sm90::smem_desc_sw128(base, 16, 1024);
  }
  __device__ __forceinline__ unsigned k_stage(int s) const { return base + s * 2 * kStageBytes; }
  __device__ __forceinline__ unsigned v_stage(int s) const { return k_stage(s) + kStageBytes; }
  __device__ __forceinline__ unsigned long long desc(unsigned offset) const { return desc0 + (offset >> 4); }
};

// Checked mode: the ring items whose page ids failed the range test (TileLoader), kStages + 1
// slots set to -1 before the first page read; null unchecked (no shared memory declared).
template <class T>
__device__ __forceinline__ int* checked_ring_items() {
  if constexpr (T::kChecked) {
    int* items = checked_item_slots<T::kStages + 1>();
    if (threadIdx.x <= T::kStages) items[threadIdx.x] = -1;
    __syncthreads();
    return items;
  } else {
    return nullptr;
  }
}

// Split-KV's CTA: request blockIdx.z, kv head and block of `rows` query rows from blockIdx.y, the
// keys of split blockIdx.x. False for a row block past this call's q_len (the grid is sized for
// the plan's max_q_len): the whole CTA returns.
struct SplitCta {
  Unit unit;
  int row_blocks;
  int row_block;
  int split;
};
// The coordinates of split_cta without its length read: false for a row block past this call's
// q_len.
template <class T>
__device__ __forceinline__ bool split_cta_coords(const GqaParams& p, int rows, SplitCta& c) {
  c.split = blockIdx.x;
  c.row_blocks = gridDim.y / p.num_kv_heads;
  c.row_block = blockIdx.y % c.row_blocks;
  c.unit = Unit{};
  c.unit.kv_head = blockIdx.y / c.row_blocks;
  c.unit.request = blockIdx.z;
  return c.row_block * rows < p.q_len * T::kGroup;
}

// c's unit for a request of length seq_len: the keys of split c.split.
template <class T>
__device__ __forceinline__ Unit unit_of_length(const GqaParams& p, const SplitCta& c, int seq_len) {
  Unit u = c.unit;
  u.seq_len = seq_len;
  const KeyRange range = split_range<T>(p, seq_len, seq_len, c.split);
  u.first = range.begin;
  u.end = range.end;
  u.tiles = range.end > range.begin ? (range.end - range.begin + T::kTile - 1) / T::kTile : 0;
  return u;
}

template <class T>
__device__ __forceinline__ bool split_cta(const GqaParams& p, int rows, SplitCta& c) {
  if (!split_cta_coords<T>(p, rows, c)) return false;
  c.unit = unit_of_length<T>(p, c, load_seq_len<T>(p, c.unit.request));
  return true;
}

}  // namespace deca::gqa::sm90
