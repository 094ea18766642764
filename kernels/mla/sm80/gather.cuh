// The portable MLA decode kernel's token side (kernels/mla/sm80/decode.cuh): where each of a
// block's 64 tokens lives in the cache (the token source: sparse top-k indices or a dense block
// table), the L2 prefetch of their records, and the gather of the records into the bf16 K tile
// (the record format: the 656-byte FP8 token dequantized, bf16 rows copied as they are, e4m3 rows
// dequantized with the cache's one scale).
//
// Every source gives a token's byte offset in the cache or -1 for a token that does not count
// (a -1 index, an index past the request's length, an id outside the pool; for a dense request a
// position past what this CTA's query token sees, or a block id outside the pool): a token of -1
// becomes a zero row of K and a -inf score, so neither V nor 0 * x carries garbage.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/mla/schedule/work.cuh"
#include "kernels/mla/sm80/traits.cuh"

namespace deca::mla::portable {

__device__ __forceinline__ unsigned swz(int row, int chunk) {
  return static_cast<unsigned>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// 16 e4m3 values and their group's scale -> 16 bf16 values in two 16-byte chunks. e4m3 -> fp16 is
// exact (sm_89+ cvt; below, the bit trick with its 2^8 folded into the scale), fp16 -> fp32 too,
// so bf16(fp32(value * scale)) is the CPU reference's rounding bit for bit.
__device__ __forceinline__ void dequant16(const uint4& raw, float scale, uint4& lo, uint4& hi) {
  const float s = scale * kv::widen_factor<kv::kKvFp8>();
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  unsigned out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned a, b;
    kv::widen4<kv::kKvFp8>(w[i], a, b);
    const float f0 = ptx::fp16_bits_to_float(static_cast<unsigned short>(a & 0xFFFFu));
    const float f1 = ptx::fp16_bits_to_float(static_cast<unsigned short>(a >> 16));
    const float f2 = ptx::fp16_bits_to_float(static_cast<unsigned short>(b & 0xFFFFu));
    const float f3 = ptx::fp16_bits_to_float(static_cast<unsigned short>(b >> 16));
    out[2 * i] = ptx::pack2<false>(__fmul_rn(f0, s), __fmul_rn(f1, s));
    out[2 * i + 1] = ptx::pack2<false>(__fmul_rn(f2, s), __fmul_rn(f3, s));
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

__device__ __forceinline__ void sts128(unsigned addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}

// Where a checked kernel reports a bad entry: request r, query token i, and the record.
struct IndexSite {
  int r;
  int i;
  void* check;
};

// ---- Token sources -------------------------------------------------------------------------

// Sparse: byte offset of entry k of the request's list in kv; -1 where the entry does not count.
// Checked: an entry that counts and is neither -1 nor in the pool is recorded (then skipped).
template <bool kChecked>
__device__ __forceinline__ long long token_offset(const MlaSparseParams& p, const int* ids, int len,
                                                  int k, const IndexSite& site) {
  const int id = k < len ? __ldg(ids + k) : -1;
  const long long pool = static_cast<long long>(p.num_blocks) * p.page_size;
  if (id < 0 || id >= pool) {
    if constexpr (kChecked) {
      if (id != -1) {
        check_report(static_cast<CheckRecord*>(site.check), kCheckIndex, site.r, site.i, k, id,
                     pool);
      }
    }
    return -1;
  }
  return static_cast<long long>(id / p.page_size) * p.kv_stride_block +
         static_cast<long long>(id % p.page_size) * p.kv_stride_slot;
}

// Dense: byte offset of token j of the request whose block-table row is `table`, -1 past
// `visible` (the tokens this CTA's query token sees) or past the table's columns. Checked: a
// block id outside [0, num_blocks) is recorded as block_table[r][j / page_size] (then skipped).
template <bool kChecked>
__device__ __forceinline__ long long dense_token_offset(const MlaSparseParams& p, const DenseSource& d,
                                                        const int* table, int visible, int j,
                                                        const IndexSite& site) {
  if (j >= visible) return -1;
  const int column = j / p.page_size;
  if (column >= d.max_blocks) return -1;
  const int block = __ldg(table + column);
  if (block < 0 || block >= p.num_blocks) {
    if constexpr (kChecked) {
      check_report(static_cast<CheckRecord*>(site.check), kCheckPageId, site.r, 0, column, block,
                   p.num_blocks);
    }
    return -1;
  }
  return static_cast<long long>(block) * p.kv_stride_block +
         static_cast<long long>(j - column * p.page_size) * p.kv_stride_slot;
}

// A request's tokens as one query token's CTA walks them. Sparse: `list` = its row of indices,
// `len` = the entries that count. Dense: `list` = its block-table row, `len` = the tokens query
// token i sees (len(r) - (q_len - 1 - i): causal among the new tokens; may be <= 0).
struct TokenList {
  const int* list;
  int len;
};

// Threads 0..63: offsets of block `blk`; threads 64..127: those of block `blk + 1` when this
// partition processes it (-1 otherwise), for the L2 prefetch of the next block.
template <bool kChecked, bool kDense>
__device__ __forceinline__ void load_offsets(const DecodeKernelParams& kp, Smem& sm, const TokenList& tl,
                                             int blk, int last, const IndexSite& site) {
  const MlaSparseParams& p = kp.p;
  const int tid = static_cast<int>(threadIdx.x);
  auto offset = [&](int k) {
    if constexpr (kDense) {
      return dense_token_offset<kChecked>(p, kp.dense, tl.list, tl.len, k, site);
    } else {
      return token_offset<kChecked>(p, tl.list, tl.len, k, site);
    }
  };
  if (tid < kKeys) {
    sm.token_offset[tid] = offset(blk * kKeys + tid);
  } else if (tid < 2 * kKeys) {
    const int k = (blk + 1) * kKeys + tid - kKeys;
    sm.next_offset[tid - kKeys] = blk + 1 < last ? offset(k) : -1;
  }
}

// ---- Prefetch ------------------------------------------------------------------------------

// Byte offset inside a 656-byte token of gather chunk `part` (0..31 NoPE, 32..39 RoPE).
__device__ __forceinline__ int chunk_byte(int part) {
  return part < kNopeChunks ? 16 * part : 528 + 16 * (part - kNopeChunks);
}

// L2 prefetch of the chunks (and each token's scales) this thread gathers from `offsets` (656-byte
// tokens, through either source). For the next block, issued before QK^T and PV: the lines land
// while the tensor cores work, so the next gather waits for L2 rather than DRAM, at no register
// cost across the math (a register double buffer would spill the accumulators). For the current
// block, issued before its loads: the gather loop stays rolled (registers again), and this keeps
// its five loads from each paying a DRAM round trip in turn.
__device__ __forceinline__ void prefetch(const MlaSparseParams& p, const long long* offsets) {
#pragma unroll 1
  for (int n = 0; n < 5; ++n) {
    const int c = threadIdx.x + n * kThreads;
    const long long off = offsets[c / kChunksPerToken];
    const int part = c % kChunksPerToken;
    if (off < 0) continue;
    ptx::prefetch_l2(p.kv + off + chunk_byte(part));
    if (part == 0) ptx::prefetch_l2(p.kv + off + 512);
  }
}

// Bytes of one token's row in a cache of format kFormat (kMlaKvBF16 or kMlaKvFP8E4M3).
template <int kFormat>
__device__ constexpr int record_bytes() {
  return kFormat == kMlaKvBF16 ? 2 * kDimQK : kDimQK;
}

// The prefetch of bf16 and e4m3 rows, for the same reasons: every 128-byte line of each record,
// one prefetch per line (its first byte, then every 128 bytes, and its last byte, so that a record
// at any 16-byte alignment is covered).
template <int kFormat>
__device__ __forceinline__ void prefetch_lines(const MlaSparseParams& p, const long long* offsets) {
  constexpr int kBytes = record_bytes<kFormat>();
  constexpr int kLines = (kBytes + 127) / 128 + 1;
#pragma unroll 1
  for (int c = threadIdx.x; c < kKeys * kLines; c += kThreads) {
    const long long off = offsets[c / kLines];
    const int line = c % kLines;
    if (off < 0) continue;
    ptx::prefetch_l2(p.kv + off + (128 * line < kBytes ? 128 * line : kBytes - 1));
  }
}

// ---- Gathers into the K tile (bf16 [64 tokens][576], swizzled rows) ---------------------------

// Chunk c of the block's records, kChunks per token: its token, its index in the token and the
// token's record offset (-1: the token does not count).
struct TokenChunk {
  int token;
  int part;
  long long off;
};

template <int kChunks>
__device__ __forceinline__ TokenChunk token_chunk(const Smem& sm, int c) {
  const int token = c / kChunks;
  return {token, c % kChunks, sm.token_offset[token]};
}

// The 656-byte FP8 token: five 16-byte chunks per thread, consecutive threads on consecutive
// chunks of one token; e4m3 * the group's scale -> bf16, the RoPE part copied.
__device__ __forceinline__ void gather_fp8_tokens(const MlaSparseParams& p, Smem& sm) {
  const unsigned base = ptx::smem_addr(sm.k);
  // Rolled: the O accumulators stay live across the gather, and an unrolled loop's registers
  // would push them into local memory.
#pragma unroll 1
  for (int n = 0; n < 5; ++n) {
    const auto [token, part, off] = token_chunk<kChunksPerToken>(sm, threadIdx.x + n * kThreads);
    const unsigned char* src = p.kv + (off < 0 ? 0 : off);
    if (part < kNopeChunks) {
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (off >= 0) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src + 16 * part));
        const float scale = __ldg(reinterpret_cast<const float*>(src + 512 + 4 * (part >> 3)));
        dequant16(raw, scale, lo, hi);
      }
      sts128(base + swz(token, 2 * part), lo);
      sts128(base + swz(token, 2 * part + 1), hi);
    } else {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (off >= 0) v = __ldg(reinterpret_cast<const uint4*>(src + chunk_byte(part)));
      sts128(base + swz(token, 64 + part - kNopeChunks), v);
    }
  }
}

// bf16 rows, 72 chunks each: nine asynchronous 16-byte copies per thread straight into the tile
// (a masked token's are zero-filled: nothing read), no registers held across them. Issued and
// committed here; the caller waits (cp_async_wait) and its __syncthreads publishes them.
__device__ __forceinline__ void gather_bf16_rows(const MlaSparseParams& p, Smem& sm) {
  constexpr int kChunks = kRowBytes / 16;
  static_assert(kKeys * kChunks == 9 * kThreads, "bf16 gather: nine chunks per thread");
  const unsigned base = ptx::smem_addr(sm.k);
#pragma unroll 1
  for (int n = 0; n < 9; ++n) {
    const auto [token, part, off] = token_chunk<kChunks>(sm, threadIdx.x + n * kThreads);
    ptx::cp_async_16(base + swz(token, part), p.kv + (off < 0 ? 0 : off) + 16 * part, off >= 0);
  }
  ptx::cp_async_commit();
}

// e4m3 rows, 36 chunks of 16 values each, all 576 dims scaled by the cache's one scale -> bf16
// (the RoPE part too): four or five chunks per thread, each two chunks of the tile.
__device__ __forceinline__ void gather_e4m3_rows(const MlaSparseParams& p, Smem& sm, float kv_scale) {
  constexpr int kChunks = kDimQK / 16;
  const unsigned base = ptx::smem_addr(sm.k);
#pragma unroll 1
  for (int c = threadIdx.x; c < kKeys * kChunks; c += kThreads) {
    const auto [token, part, off] = token_chunk<kChunks>(sm, c);
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (off >= 0) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p.kv + off + 16 * part));
      dequant16(raw, kv_scale, lo, hi);
    }
    sts128(base + swz(token, 2 * part), lo);
    sts128(base + swz(token, 2 * part + 1), hi);
  }
}

// The current block's records into K (sm.token_offset), with the L2 prefetch of the next block's
// (sm.next_offset) issued right after, before the math.
template <bool kDense, int kFormat>
__device__ __forceinline__ void gather_block(const DecodeKernelParams& kp, Smem& sm) {
  const MlaSparseParams& p = kp.p;
  if constexpr (kFormat == kMlaKvFP8Sparse) {
    prefetch(p, sm.token_offset);
    gather_fp8_tokens(p, sm);
    prefetch(p, sm.next_offset);
  } else if constexpr (kFormat == kMlaKvBF16) {
    // No prefetch of the current block: its copies are all in flight at once already.
    gather_bf16_rows(p, sm);
    prefetch_lines<kFormat>(p, sm.next_offset);
    ptx::cp_async_wait<0>();
  } else {
    static_assert(kFormat == kMlaKvFP8E4M3, "an MlaKvFormat");
    prefetch_lines<kFormat>(p, sm.token_offset);
    gather_e4m3_rows(p, sm, kp.dense.kv_scale);
    prefetch_lines<kFormat>(p, sm.next_offset);
  }
}

}  // namespace deca::mla::portable
