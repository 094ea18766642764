// The portable MLA decode kernel's token side for MODEL1 (kMlaKvModel1, kernels/mla/params.cuh):
// a request's work list is the first cache's blocks of 64 indices, then the extra cache's
// (kernels/mla/schedule/schedule.cuh, TopkLists), each block from one cache. Per token: its row's
// address in its cache (448 e4m3 then 64 bf16 RoPE, 576 bytes at slot * 576 of its page) and the
// distance from the row to its 7 ue8m0 scales (page_size * 576 + slot * 8 of the page), or -1 for
// a token that does not count (as for V3.2: a -1 index, an entry past the list's length, an id
// outside its pool). Addresses rather than offsets: the two caches are two allocations.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/mla/model1.cuh"
#include "kernels/mla/schedule/work.cuh"
#include "kernels/mla/sm80/gather.cuh"
#include "kernels/mla/sm80/traits.cuh"

namespace deca::mla::portable {

// One query token's lists of a request: the first cache's row of indices, the entries that count
// and its block count (the extra cache's blocks follow), then the extra cache's.
struct Model1Lists {
  const int* list;
  int len;
  int blocks;
  const int* extra;
  int extra_len;
};

__device__ __forceinline__ Model1Lists model1_lists(const MlaSparseParams& p, int r, int i) {
  Model1Lists l;
  l.list = p.indices + r * p.indices_stride_batch + i * p.indices_stride_token;
  l.len = request_len(p.topk_length, p.topk, r);
  l.blocks = (l.len + kKeys - 1) / kKeys;
  l.extra = p.extra_indices + r * p.extra_indices_stride_batch + i * p.extra_indices_stride_token;
  l.extra_len = p.extra_topk > 0 ? request_len(p.extra_topk_length, p.extra_topk, r) : 0;
  return l;
}

// One cache of MODEL1 tokens as the offsets read it.
struct Model1Cache {
  const unsigned char* kv;
  long long stride_block;
  int page_size;
  int num_blocks;
  unsigned bad_index;  // the CheckKind of an index outside this pool
};

// Entry k of `ids` (len entries count): the row's address, or -1; `scale_delta` gets the bytes
// from the row to its scales. Checked: an entry that counts and is neither -1 nor in the pool is
// recorded (then skipped).
template <bool kChecked>
__device__ __forceinline__ long long model1_token(const Model1Cache& c, const int* ids, int len, int k,
                                                  const IndexSite& site, int& scale_delta) {
  const int id = k < len ? __ldg(ids + k) : -1;
  const long long pool = static_cast<long long>(c.num_blocks) * c.page_size;
  if (id < 0 || id >= pool) {
    if constexpr (kChecked) {
      if (id != -1) check_report(static_cast<CheckRecord*>(site.check), c.bad_index, site.r, site.i, k, id, pool);
    }
    scale_delta = 0;
    return -1;
  }
  const int slot = id % c.page_size;
  scale_delta = static_cast<int>(model1_scale_offset(c.page_size, slot) - model1_row_offset(slot));
  const unsigned char* row =
      c.kv + static_cast<long long>(id / c.page_size) * c.stride_block + model1_row_offset(slot);
  return reinterpret_cast<long long>(row);
}

// Token t of block `blk` of the request's work list (either cache).
template <bool kChecked>
__device__ __forceinline__ long long model1_block_token(const MlaSparseParams& p, const Model1Lists& l, int blk,
                                                        int t, const IndexSite& site, int& scale_delta) {
  if (blk < l.blocks) {
    const Model1Cache c{p.kv, p.kv_stride_block, p.page_size, p.num_blocks, kCheckIndex};
    return model1_token<kChecked>(c, l.list, l.len, blk * kKeys + t, site, scale_delta);
  }
  const Model1Cache c{p.extra_kv, p.extra_kv_stride_block, p.extra_page_size, p.extra_num_blocks,
                      kCheckExtraIndex};
  return model1_token<kChecked>(c, l.extra, l.extra_len, (blk - l.blocks) * kKeys + t, site, scale_delta);
}

// Threads 0..63: block `blk`'s rows; threads 64..127: block `blk + 1`'s when this partition
// processes it (-1 otherwise), for the L2 prefetch. The lists of request site.r for query token
// site.i are found again per block rather than held across the math (registers go to O).
template <bool kChecked>
__device__ __forceinline__ void load_model1_offsets(const MlaSparseParams& p, Smem& sm, int blk, int last,
                                                    const IndexSite& site) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid >= 2 * kKeys) return;
  const Model1Lists l = model1_lists(p, site.r, site.i);
  int delta = 0;
  if (tid < kKeys) {
    sm.token_offset[tid] = model1_block_token<kChecked>(p, l, blk, tid, site, delta);
    sm.scale_delta[tid] = delta;
  } else if (tid < 2 * kKeys) {
    const int t = tid - kKeys;
    sm.next_offset[t] = blk + 1 < last ? model1_block_token<kChecked>(p, l, blk + 1, t, site, delta) : -1;
    sm.next_scale_delta[t] = delta;
  }
}

// L2 prefetch of a block's rows and scales: seven lines per token (five 128-byte steps and the
// row's last byte cover a row at any 16-byte alignment; then its scales), one per thread.
__device__ __forceinline__ void prefetch_model1(const long long* rows, const int* deltas) {
  constexpr int kLines = 7;
  static_assert(kKeys * kLines <= kThreads, "one prefetch per thread");
  const int c = static_cast<int>(threadIdx.x);
  if (c >= kKeys * kLines) return;
  const long long a = rows[c / kLines];
  if (a < 0) return;
  const int line = c % kLines;
  const auto* row = reinterpret_cast<const unsigned char*>(a);
  ptx::prefetch_l2(line < 5 ? row + 128 * line : (line == 5 ? row + kModel1RowBytes - 1 : row + deltas[c / kLines]));
}

// The block's rows into K: chunk c of a row is its bytes 16c..16c+15; chunks 0..27 (e4m3, tile
// c / 4's scale) become K chunks 2c and 2c + 1, chunks 28..35 (bf16 RoPE) K chunks 56..63.
__device__ __forceinline__ void gather_model1_tokens(Smem& sm) {
  const unsigned base = ptx::smem_addr(sm.k);
  // Rolled, as the V3.2 gather (the O accumulators stay live across it).
#pragma unroll 1
  for (int c = static_cast<int>(threadIdx.x); c < kKeys * kModel1Chunks; c += kThreads) {
    const int token = c / kModel1Chunks;
    const int part = c % kModel1Chunks;
    const long long a = sm.token_offset[token];
    const auto* row = reinterpret_cast<const unsigned char*>(a < 0 ? 0 : a);
    if (part < kModel1NopeChunks) {
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (a >= 0) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + 16 * part));
        const float scale = e8m0_to_float(__ldg(row + sm.scale_delta[token] + part / 4));
        dequant16(raw, scale, lo, hi);
      }
      sts128(base + swz(token, 2 * part), lo);
      sts128(base + swz(token, 2 * part + 1), hi);
    } else {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (a >= 0) v = __ldg(reinterpret_cast<const uint4*>(row + 16 * part));
      sts128(base + swz(token, part + kModel1NopeChunks), v);
    }
  }
}

// The current block's rows into K, the next block's prefetch issued right after (as gather_block).
__device__ __forceinline__ void gather_model1_block(Smem& sm) {
  prefetch_model1(sm.token_offset, sm.scale_delta);
  gather_model1_tokens(sm);
  prefetch_model1(sm.next_offset, sm.next_scale_delta);
}

}  // namespace deca::mla::portable
