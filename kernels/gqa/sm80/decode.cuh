// Portable GQA decode kernel: mma.sync tensor cores and cp.async, sm_80 and newer (runs on
// Hopper too). One CTA = (request, kv head, block of `kRows` query rows, split of the keys).
//
// Rows are (query token, q head of the group) pairs: the whole group shares every K/V tile load,
// which is the point of GQA. Four warps: `kWarpsM` side by side along rows (16 rows each) times
// `kWarpsN` along the tokens of a tile, each with its own online-softmax state; they meet once, at
// the end, in shared memory. All 128 threads stream K and V tiles with cp.async through a
// `kStages`-deep ring; 8-bit caches stay 8-bit in shared memory (twice the tokens per stage) and
// are widened in registers right before the mma (kernels/common/kv_convert.cuh).
//
// Split-KV: CTAs of one (request, kv head, row block) take disjoint tile ranges, write partial
// (max, sum, unnormalised output) to the workspace, and the last to arrive (atomic counter, which
// it resets to zero for the next launch) merges them in split order: bitwise reproducible.
//
// Checked mode (Cfg::kChecked, issue 9): every page id is range-tested where it is read, once per
// page slot per CTA; a bad one is never dereferenced (its keys load as zeros and are masked) and
// is recorded in the workspace (kernels/common/check_record.cuh), as is a sequence length out of
// range (the request is then treated as empty). Unchecked kernels compile to the code without it.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/gqa/epilogue.cuh"
#include "kernels/gqa/request.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::gqa {


template <class T>
struct SharedStorage {
  static __device__ __forceinline__ unsigned k_stage(unsigned base, int s) {
    return base + s * T::kStageBytes;
  }
  static __device__ __forceinline__ unsigned v_stage(unsigned base, int s) {
    return base + (T::kStages + s) * T::kStageBytes;
  }
};

// Output column of accumulator tile `o`, column `col` (0..7) of a warp's 16 x head_dim block. The
// 16-bit path keeps the natural order; the 8-bit V paths take tile pairs per 16-dim block: even
// dims of the block, then odd (their ldmatrix.trans + prmt byte split).
template <class T>
__device__ __forceinline__ int out_dim(int o, int col) {
  if constexpr (T::kVPairs16) {
    return (o / 2) * 16 + 2 * col + (o % 2);
  } else {
    return o * 8 + col;
  }
}

// Two consecutive q values (d, d+1) of a row, as floats.
template <class T>
__device__ __forceinline__ float2 q_pair(const void* q_row, int d) {
  const unsigned raw = *reinterpret_cast<const unsigned*>(
      static_cast<const unsigned short*>(q_row) + d);
  const unsigned short lo = static_cast<unsigned short>(raw & 0xFFFF);
  const unsigned short hi = static_cast<unsigned short>(raw >> 16);
  if constexpr (T::kQDtype == kv::kFP16) {
    return make_float2(ptx::fp16_bits_to_float(lo), ptx::fp16_bits_to_float(hi));
  } else {
    return make_float2(ptx::bf16_bits_to_float(lo), ptx::bf16_bits_to_float(hi));
  }
}

// The int8 two-term path's q scale: 127 / amax, so that the row's largest |q| is the largest
// int8 term (not a power of two: the inverse applied to the logits is rounded, a relative 2^-24
// on every logit of the row, which the softmax does not see). Capped at 2^126 (no inf for
// subnormal rows); 1 for an all-zero row.
__device__ __forceinline__ float q_row_scale_s8(float amax) {
  if (!(amax > 0.f) || amax > 3.0e38f) return 1.f;
  return fminf(127.f / amax, __uint_as_float(253u << 23));
}

// K-dimension order inside a 16-wide k step: the 16-bit path is the mma's own (pairs at 2c and
// 2c+8); the 8-bit K path gets 4 consecutive bytes per thread from ldmatrix (dims 4c..4c+3), so q
// is permuted the same way: the dot product does not care about the order of its terms.
template <class T>
__device__ __forceinline__ int q_dim(int kk, int c, int half) {
  if constexpr (T::kKvKind == kv::kKv16) return kk * 16 + half * 8 + 2 * c;
  return kk * 16 + 4 * c + 2 * half;
}

template <class Cfg>
__device__ __forceinline__ void gqa_decode_kernel(const GqaParams& p, unsigned char* smem) {
  using T = Traits<Cfg>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(!T::kPvTwoTerm, "the two-term e4m3 path needs sm_89+ (e4m3 mma.sync)");
#endif
  constexpr int D = T::kHeadDim;
  constexpr int kQTop = T::kTwoTerm ? 7 : 14;
  auto q_scale = [](float amax) { return T::kTwoTermI8 ? q_row_scale_s8(amax) : q_row_scale(amax, kQTop); };
  // Four scaled q values -> the two terms of the cache's type (once per CTA).
  auto split_q = [](float x0, float x1, float x2, float x3, unsigned& hi, unsigned& lo) {
    if constexpr (T::kTwoTermI8) {
      kv::split_s8_f32(x0, x1, x2, x3, hi, lo);
    } else {
      kv::split_e4m3_f32(x0, x1, x2, x3, hi, lo);
    }
  };
  constexpr int kKSteps = D / 16;
  constexpr int kOTiles = D / 8;
  constexpr bool kFp16 = T::kComputeFp16;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma group: row (A/C) or column (B) within an 8-slice
  const int c = lane % 4;  // thread in group
  const int warp_m = warp / T::kWarpsN;
  const int warp_n = warp % T::kWarpsN;

  const int split = blockIdx.x;
  const int row_blocks = gridDim.y / p.num_kv_heads;
  const int kv_head = blockIdx.y / row_blocks;
  const int row_block = blockIdx.y % row_blocks;
  // Beam search: the B beams of a request (adjacent batch entries) share a CTA, rows ordered
  // (beam, token, head), so pages the beams share are read once for all of them.
  constexpr int kBeams = T::kBeamWidth;
  const int request = blockIdx.z;
  const int batch = request * kBeams;  // the first beam's batch entry
  const int q_len = p.q_len;
  const int rows_per_beam = q_len * T::kGroup;
  const int rows_total = kBeams * rows_per_beam;
  auto row_batch = [&](int row) { return kBeams == 1 ? batch : batch + row / rows_per_beam; };
  auto row_tok = [&](int row) { return (kBeams == 1 ? row : row % rows_per_beam) / T::kGroup; };
  int seq_len = load_seq_len<T>(p, batch);
  int seq_min = seq_len;
  if constexpr (kBeams > 1) {
#pragma unroll
    for (int j = 1; j < kBeams; ++j) {
      const int l = load_seq_len<T>(p, batch + j);
      seq_len = l > seq_len ? l : seq_len;
      seq_min = l < seq_min ? l : seq_min;
    }
  }
  const int row0 = row_block * T::kRows;  // first row of this CTA
  // Row blocks are sized from the plan's max q_len; with a shorter q_len the tail blocks have no
  // rows. All CTAs of such a block leave together, so its split counter stays untouched.
  if (row0 >= rows_total) return;
  // Checked mode: bad_item[item % (kStages + 1)] == item when a page id of work item `item` was out
  // of range, so that the warps mask its keys. An item's ids are read kStages iterations before it
  // is consumed; with kStages + 1 slots that write never lands on a slot still being read (the
  // item kStages + 1 earlier was consumed before the __syncthreads that precedes the write).
  int* bad_item = nullptr;
  if constexpr (T::kChecked) {
    bad_item = checked_item_slots<T::kStages + 1>();
    if (tid <= T::kStages) bad_item[tid] = -1;
    __syncthreads();  // initialised before the prologue's first page reads
  }
  const KeyRange range = split_range<T>(p, seq_min, seq_len, split);
  const int num_tiles = range.end > range.begin ? (range.end - range.begin + T::kTile - 1) / T::kTile : 0;

  // Work items: one per tile, except that with beams a tile whose pages differ between beams (or
  // that reaches past the shortest beam) is one item per beam, its keys masked for the other
  // beams' rows. The beams' shared prefix (tiles 0 .. shared_tiles-1) is found once, in parallel.
  int shared_tiles = num_tiles;
  if constexpr (kBeams > 1) {
    __shared__ int first_diverged;
    if (threadIdx.x == 0) first_diverged = num_tiles;
    __syncthreads();
    const int* table0 = p.page_table + batch * p.page_table_stride;
    const int page_lo = range.begin / T::kPageSize;
    const int full_tiles = seq_min > range.begin ? (seq_min - range.begin) / T::kTile : 0;
    const int check_tiles = full_tiles < num_tiles ? full_tiles : num_tiles;
    const int page_hi = check_tiles > 0 ? (range.begin + check_tiles * T::kTile - 1) / T::kPageSize : page_lo - 1;
    for (int pg = page_lo + static_cast<int>(threadIdx.x); pg <= page_hi; pg += T::kThreads) {
      const int id = __ldg(table0 + pg);
      bool same = true;
#pragma unroll
      for (int j = 1; j < kBeams; ++j) same = same && __ldg(table0 + j * p.page_table_stride + pg) == id;
      if (!same) atomicMin(&first_diverged, (pg * T::kPageSize - range.begin) / T::kTile);
    }
    __syncthreads();
    shared_tiles = first_diverged < check_tiles ? first_diverged : check_tiles;
  }
  const int num_items = shared_tiles + (num_tiles - shared_tiles) * kBeams;
  // Item -> (tile, beam); beam -1: all beams.
  auto item_tile = [&](int item) {
    return item < shared_tiles ? item : shared_tiles + (item - shared_tiles) / kBeams;
  };
  auto item_beam = [&](int item) { return item < shared_tiles ? -1 : (item - shared_tiles) % kBeams; };

  constexpr float kWiden = kv::widen_factor<T::kKvKind>();
  const float k_scale = (p.k_scales ? p.k_scales[kv_head] : p.k_scale) * kWiden;
  const float v_scale = (p.v_scales ? p.v_scales[kv_head] : p.v_scale) * kWiden;
  // Logits in log2 units: the softmax runs on ex2.
  const float qk_scale = p.softmax_scale * k_scale;
  const float log2_scale = qk_scale * kLog2e;

  const unsigned smem_base = ptx::smem_addr(smem);
  // Q (head_dim > 128 only) sits after the pipeline / merge area, which it outlives.
  const unsigned q_smem =
      smem_base + (T::kPipeBytes > T::kMergeBytes ? T::kPipeBytes : T::kMergeBytes);

  // ---- Q: this warp's 16 rows as A fragments (or staged in shared memory for head_dim > 128) ----
  const int my_row_lo = row0 + warp_m * 16 + g;  // rows g and g+8 of the warp's slice
  const int my_row_hi = my_row_lo + 8;
  auto q_row_ptr = [&](int row) -> const void* {
    const int head = kv_head * T::kGroup + row % T::kGroup;
    return static_cast<const unsigned short*>(p.q) + row_batch(row) * p.q_stride_batch +
           row_tok(row) * p.q_stride_token + head * p.q_stride_head;
  };
  // row_inv[h]: the inverse of the power of two q row h was scaled by (8-bit caches), applied
  // to that row's logits.
  float row_inv[2] = {1.f, 1.f};
  unsigned q_frag[T::kQInRegs && !T::kTwoTerm ? kKSteps : 1][4] = {};  // unused by two-term
  // Two-term: per 32-dim k step, the hi and lo terms of the A fragment (rows g / g+8, dims
  // 4c..4c+3 and 16 + 4c..), natural dim order; dims past head_dim are zero.
  unsigned q8_frag[T::kQInRegs && T::kTwoTerm ? T::kK32Steps : 1][2][4];
  if constexpr (T::kQInRegs && T::kTwoTerm) {
    const bool lo_ok = my_row_lo < rows_total;
    const bool hi_ok = my_row_hi < rows_total;
    const void* q_lo = lo_ok ? q_row_ptr(my_row_lo) : nullptr;
    const void* q_hi = hi_ok ? q_row_ptr(my_row_hi) : nullptr;
    float4 f[T::kK32Steps][4];
    float amax[2] = {0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < T::kK32Steps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int d = kk * 32 + (j / 2) * 16 + 4 * c;
        const bool ok = ((j % 2) ? hi_ok : lo_ok) && d < D;
        const void* qr = (j % 2) ? q_hi : q_lo;
        const float2 a = ok ? q_pair<T>(qr, d) : make_float2(0.f, 0.f);
        const float2 b = ok ? q_pair<T>(qr, d + 2) : make_float2(0.f, 0.f);
        f[kk][j] = make_float4(a.x, a.y, b.x, b.y);
        amax[j % 2] = fmaxf(amax[j % 2], fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y))));
      }
    }
    float sc[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
      amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
      sc[h] = q_scale(amax[h]);
      row_inv[h] = 1.f / sc[h];  // exact for e4m3 (a power of two); int8: see q_row_scale_s8
    }
#pragma unroll
    for (int kk = 0; kk < T::kK32Steps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float s = sc[j % 2];
        split_q(f[kk][j].x * s, f[kk][j].y * s, f[kk][j].z * s, f[kk][j].w * s,
                           q8_frag[kk][0][j], q8_frag[kk][1][j]);
      }
    }
  } else if constexpr (T::kQInRegs) {
    const bool lo_ok = my_row_lo < rows_total;
    const bool hi_ok = my_row_hi < rows_total;
    const void* q_lo = lo_ok ? q_row_ptr(my_row_lo) : nullptr;
    const void* q_hi = hi_ok ? q_row_ptr(my_row_hi) : nullptr;
    float2 f[kKSteps][4];
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = (j % 2) ? hi_ok : lo_ok;
        f[kk][j] = ok ? q_pair<T>((j % 2) ? q_hi : q_lo, q_dim<T>(kk, c, j / 2)) : make_float2(0.f, 0.f);
      }
    }
    float sc[2] = {1.f, 1.f};
    if constexpr (T::kScaleQRows) {
      float amax[2] = {0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          amax[j % 2] = fmaxf(amax[j % 2], fmaxf(fabsf(f[kk][j].x), fabsf(f[kk][j].y)));
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        sc[h] = q_row_scale(amax[h], kQTop);
        row_inv[h] = 1.f / sc[h];  // exact: a power of two
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        q_frag[kk][j] = ptx::pack2<kFp16>(f[kk][j].x * sc[j % 2], f[kk][j].y * sc[j % 2]);
      }
    }
  } else {
    // Natural order, compute type, one row per kQRowStride bytes, each row at its own scale.
    __shared__ float q_scale_smem[T::kRows];
    for (int r = tid; r < T::kRows; r += T::kThreads) {
      float amax = 0.f;
      if (T::kScaleQRows && row0 + r < rows_total) {
        const void* qr = q_row_ptr(row0 + r);
        for (int d = 0; d < D; d += 2) {
          const float2 v = q_pair<T>(qr, d);
          amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
        }
      }
      q_scale_smem[r] = T::kScaleQRows ? q_scale(amax) : 1.f;
    }
    __syncthreads();
    if constexpr (T::kTwoTerm) {
      // Two-term: per row the hi bytes of every dim, then the lo bytes (2 * head_dim bytes fit
      // the 16-bit row stride).
      for (int i = tid; i < T::kRows * (D / 4); i += T::kThreads) {
        const int r = i / (D / 4);
        const int d = (i % (D / 4)) * 4;
        const int row = row0 + r;
        const bool ok = row < rows_total;
        const float2 a = ok ? q_pair<T>(q_row_ptr(row), d) : make_float2(0.f, 0.f);
        const float2 b = ok ? q_pair<T>(q_row_ptr(row), d + 2) : make_float2(0.f, 0.f);
        const float sc = q_scale_smem[r];
        unsigned hi, lo;
        split_q(a.x * sc, a.y * sc, b.x * sc, b.y * sc, hi, lo);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + d), "r"(hi));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + D + d), "r"(lo));
      }
    } else {
      for (int i = tid; i < T::kRows * (D / 2); i += T::kThreads) {
        const int r = i / (D / 2);
        const int d = (i % (D / 2)) * 2;
        const int row = row0 + r;
        const float2 v = row < rows_total ? q_pair<T>(q_row_ptr(row), d) : make_float2(0.f, 0.f);
        const float sc = q_scale_smem[r];
        const unsigned packed = ptx::pack2<kFp16>(v.x * sc, v.y * sc);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + d * 2), "r"(packed));
      }
    }
    __syncthreads();
    row_inv[0] = 1.f / q_scale_smem[warp_m * 16 + g];
    row_inv[1] = 1.f / q_scale_smem[warp_m * 16 + g + 8];
  }
  auto load_q = [&](int kk, unsigned (&a)[4]) {
    if constexpr (T::kQInRegs) {
      a[0] = q_frag[kk][0];
      a[1] = q_frag[kk][1];
      a[2] = q_frag[kk][2];
      a[3] = q_frag[kk][3];
    } else {
      const unsigned lo = q_smem + (warp_m * 16 + g) * T::kQRowStride;
      const unsigned hi = lo + 8 * T::kQRowStride;
      a[0] = ptx::lds32(lo + q_dim<T>(kk, c, 0) * 2);
      a[1] = ptx::lds32(hi + q_dim<T>(kk, c, 0) * 2);
      a[2] = ptx::lds32(lo + q_dim<T>(kk, c, 1) * 2);
      a[3] = ptx::lds32(hi + q_dim<T>(kk, c, 1) * 2);
    }
  };
  // Two-term q, 32-dim step kk, term 0 (hi) or 1 (lo).
  auto load_q8 = [&](int kk, int term, unsigned (&a)[4]) {
    if constexpr (T::kQInRegs) {
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = q8_frag[kk][term][j];
    } else {
      const unsigned lo = q_smem + (warp_m * 16 + g) * T::kQRowStride + term * D + kk * 32 + 4 * c;
      const unsigned hi = lo + 8 * T::kQRowStride;
      a[0] = ptx::lds32(lo);
      a[1] = ptx::lds32(hi);
      const bool full = kk * 32 + 16 < D;  // compile-time after unrolling
      a[2] = full ? ptx::lds32(lo + 16) : 0u;
      a[3] = full ? ptx::lds32(hi + 16) : 0u;
    }
  };

  // ---- Per-row masking facts (rows g and g+8 of this warp) ----
  // Keys below causal_start are visible to every row (window aside).
  const int causal_start = seq_min - q_len;
  int row_pos[2];
  int row_len[2];   // the row's own sequence length (its beam's)
  int row_beam[2];
  int row_drafts[2];  // first draft key of the row's beam
  const unsigned* row_tree[2] = {nullptr, nullptr};
  float sink_log2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h ? my_row_hi : my_row_lo;
    const int rr = row < rows_total ? row : 0;
    const int tok = row_tok(rr);
    row_beam[h] = kBeams == 1 ? 0 : rr / rows_per_beam;
    row_len[h] = kBeams == 1 ? seq_len : load_seq_len<T>(p, row_batch(rr));
    row_drafts[h] = row_len[h] - q_len;
    row_pos[h] = row_drafts[h] + tok;
    if constexpr (T::kTree) {
      row_tree[h] = p.tree_mask + row_batch(rr) * p.mask_stride_batch + tok * p.mask_stride_token;
    }
    const int head = kv_head * T::kGroup + (row < rows_total ? row % T::kGroup : 0);
    sink_log2[h] = p.sinks ? p.sinks[head] * kLog2e : kNegInf;
  }

  const float row_qk_scale[2] = {qk_scale * row_inv[0], qk_scale * row_inv[1]};
  // P comes out of ex2 times 2^kPShift (see the softmax): 256 for e4m3 terms.
  constexpr float kPShift = T::kPvTwoTerm ? 8.f : 0.f;
  const float row_log2_scale[2] = {log2_scale * row_inv[0], log2_scale * row_inv[1]};

  // ---- Softmax state and output accumulators ----
  float m_run[2] = {kNegInf, kNegInf};
  float l_run[2] = {0.f, 0.f};
  float o_acc[kOTiles][4];
#pragma unroll
  for (int o = 0; o < kOTiles; ++o) o_acc[o][0] = o_acc[o][1] = o_acc[o][2] = o_acc[o][3] = 0.f;

  // ---- Loader: each thread copies fixed (row, 16-byte chunk) slots of every tile ----
  const unsigned char* k_base = static_cast<const unsigned char*>(p.k_cache) +
                                static_cast<long long>(kv_head) * p.k_stride_head * T::kKvBytes;
  const unsigned char* v_base = static_cast<const unsigned char*>(p.v_cache) +
                                static_cast<long long>(kv_head) * p.v_stride_head * T::kKvBytes;
  const int* page_rows = p.page_table + batch * p.page_table_stride;
  // Byte strides fit 32 bits (the backend checks before launch); only page * page_bytes needs 64
  // bits, which one wide multiply-add gives. Unsigned token math: / and % by the constant page
  // size are shifts and masks for powers of two.
  const unsigned k_page_bytes = static_cast<unsigned>(p.k_stride_page * T::kKvBytes);
  const unsigned k_slot_bytes = static_cast<unsigned>(p.k_stride_slot * T::kKvBytes);
  const unsigned v_page_bytes = static_cast<unsigned>(p.v_stride_page * T::kKvBytes);
  const unsigned v_slot_bytes = static_cast<unsigned>(p.v_stride_slot * T::kKvBytes);
  // This thread's slots in every tile: rows row0_ld + i * kRowStep, one 16-byte chunk each.
  constexpr bool kEvenLoads = T::kThreads % T::kChunksPerRow == 0;
  const unsigned chunk_ld = static_cast<unsigned>(tid % T::kChunksPerRow);
  const unsigned row0_ld = static_cast<unsigned>(tid / T::kChunksPerRow);
  constexpr unsigned kRowStep = T::kThreads / T::kChunksPerRow;
  auto load_row = [&](int i) -> unsigned {
    if constexpr (kEvenLoads) return row0_ld + i * kRowStep;
    return static_cast<unsigned>((tid + i * T::kThreads) / T::kChunksPerRow);
  };
  auto load_chunk = [&](int i) -> unsigned {
    if constexpr (kEvenLoads) return chunk_ld;
    return static_cast<unsigned>((tid + i * T::kThreads) % T::kChunksPerRow);
  };

  int pages_next[T::kLoadsPerThread];
  // The kChunksPerRow threads that copy one row sit side by side in a warp when that count divides
  // 32: one of them reads the page id and passes it on, an eighth (fp8) or a sixteenth (bf16) of
  // the table reads. The hand-over waits for the read, so it happens when the tile is issued, an
  // iteration after the read (a shuffle right after the load stalled every tile on it: -9% fp8).
  constexpr bool kShareRows = kEvenLoads && (32 % T::kChunksPerRow == 0);
  // The page id of token `tok` in `page_row` (beam `beam`'s row, -1: all beams'). Checked mode: an
  // id outside [0, num_pages) is recorded, flagged for the item's masking and replaced by -1 (the
  // loads then zero-fill), so it is never dereferenced: one compare and a not-taken branch.
  auto read_page = [&](const int* page_row, unsigned tok, int item, int beam) -> int {
    const int id = __ldg(page_row + tok / T::kPageSize);
    if constexpr (T::kChecked) {
      if (static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) {
        check_report(static_cast<CheckRecord*>(p.check), kCheckPageId, batch + (beam > 0 ? beam : 0),
                     0, static_cast<int>(tok / T::kPageSize), id, p.num_pages);
        bad_item[item % (T::kStages + 1)] = item;
        return -1;
      }
    }
    return id;
  };
  auto fetch_pages = [&](int item) {
    const bool tile_ok = item < num_items;
    const int tile = item_tile(item);
    const int beam = item_beam(item);
    const unsigned t0 = static_cast<unsigned>(range.begin + tile * T::kTile);
    const int* page_row = page_rows + (beam > 0 ? beam * p.page_table_stride : 0);
    int end = range.end;
    if (kBeams > 1 && beam >= 0) {
      const int own = load_seq_len<T>(p, batch + beam);
      end = own < end ? own : end;
    }
#pragma unroll
    for (int i = 0; i < T::kLoadsPerThread; ++i) {
      const unsigned row = load_row(i);
      const unsigned tok = t0 + row;
      // Pages past the request's last key are never read: their table entries may be anything.
      const bool needed = row < T::kTile && tile_ok && tok < static_cast<unsigned>(end);
      if constexpr (kShareRows) {
        pages_next[i] = (needed && chunk_ld == 0) ? read_page(page_row, tok, item, beam) : -1;
      } else {
        pages_next[i] = needed ? read_page(page_row, tok, item, beam) : -1;
      }
    }
  };
  auto issue_tile = [&](int item, int stage) {
    const unsigned t0 = static_cast<unsigned>(range.begin + item_tile(item) * T::kTile);
    const unsigned ks = SharedStorage<T>::k_stage(smem_base, stage);
    const unsigned vs = SharedStorage<T>::v_stage(smem_base, stage);
#pragma unroll
    for (int i = 0; i < T::kLoadsPerThread; ++i) {
      const unsigned row = load_row(i);
      const unsigned chunk = load_chunk(i);
      int page = pages_next[i];
      if constexpr (kShareRows) page = __shfl_sync(0xffffffffu, page, lane - static_cast<int>(chunk_ld));
      if (T::kTile * T::kChunksPerRow % T::kThreads == 0 || row < T::kTile) {
        const bool valid = page >= 0;
        const unsigned slot = (t0 + row) % T::kPageSize;
        const unsigned upage = valid ? static_cast<unsigned>(page) : 0u;
        const unsigned char* ksrc = k_base + (static_cast<unsigned long long>(upage) * k_page_bytes +
                                              (slot * k_slot_bytes + chunk * 16));
        const unsigned char* vsrc = v_base + (static_cast<unsigned long long>(upage) * v_page_bytes +
                                              (slot * v_slot_bytes + chunk * 16));
        const unsigned off = row * T::kRowStride + chunk * 16;
        ptx::cp_async_16(ks + off, ksrc, valid);
        ptx::cp_async_16(vs + off, vsrc, valid);
      }
    }
  };

  // ---- Prologue: fill kStages - 1 stages ----
  fetch_pages(0);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < num_items) issue_tile(s, s);
    ptx::cp_async_commit();
    fetch_pages(s + 1);
  }

  // ---- Main loop ----
  for (int item = 0; item < num_items; ++item) {
    ptx::cp_async_wait<T::kStages - 2>();
    __syncthreads();  // item `item` landed for everyone; stage (item - 1) % kStages is free
    {
      const int next = item + T::kStages - 1;
      if (next < num_items) issue_tile(next, next % T::kStages);
      ptx::cp_async_commit();
      fetch_pages(next + 1);
    }
    const int stage = item % T::kStages;
    const unsigned ks = SharedStorage<T>::k_stage(smem_base, stage);
    const unsigned vs = SharedStorage<T>::v_stage(smem_base, stage);
    const int tile_t0 = range.begin + item_tile(item) * T::kTile;
    const int beam_only = kBeams == 1 ? -1 : item_beam(item);  // >= 0: keys of that beam only
    // Checked mode: a page id of this item was out of range. Its keys loaded as zeros; they are
    // masked below by testing each key's page id again (only on this rare path).
    bool bad_tile = false;
    if constexpr (T::kChecked) bad_tile = bad_item[item % (T::kStages + 1)] == item;
    auto page_ok = [&](int t) {
      const int* row = page_rows + (beam_only > 0 ? beam_only * p.page_table_stride : 0);
      return static_cast<unsigned>(__ldg(row + t / T::kPageSize)) < static_cast<unsigned>(p.num_pages);
    };

#pragma unroll 1
    for (int ch = 0; ch < T::kWarpTokens / T::kChunk; ++ch) {
      const int local0 = warp_n * T::kWarpTokens + ch * T::kChunk;  // first token row in the stage
      const int t0 = tile_t0 + local0;
      if (t0 >= range.end) break;  // warp-uniform

      // S = Q K^T for kChunk tokens: kChunk / 8 n8 tiles.
      constexpr int kN8 = T::kChunk / 8;
      float s_acc[kN8][4];
#pragma unroll
      for (int j = 0; j < kN8; ++j) s_acc[j][0] = s_acc[j][1] = s_acc[j][2] = s_acc[j][3] = 0.f;
      // Two-term paths: the m16n8k32 B fragments of n8 tiles j and j + 1 at k step kk, K bytes
      // straight from shared memory (ldmatrix on 8-bit rows gives thread (g, c) bytes 4c..4c+3 of
      // row g, dims in natural order).
      auto load_k8 = [&](int j, int kk, unsigned& b0, unsigned& b1, unsigned& b2, unsigned& b3) {
        const int m = lane / 8;
        if (kk * 32 + 16 < D) {
          // x4: (tokens 0-7, dims 0-15), (tokens 0-7, dims 16-31), (tokens 8-15, ...) x2.
          const int tok = local0 + j * 8 + (m / 2) * 8 + lane % 8;
          ptx::ldmatrix_x4(ks + tok * T::kRowStride + kk * 32 + (m % 2) * 16, b0, b1, b2, b3);
        } else {
          // 16 dims left: (tokens 0-7), (tokens 8-15); the upper k half is zero on both sides
          // (padding bytes of the row could hold anything, NaN codes included).
          const int tok = local0 + j * 8 + (m % 2) * 8 + lane % 8;
          ptx::ldmatrix_x2(ks + tok * T::kRowStride + kk * 32, b0, b2);
          b1 = b3 = 0u;
        }
      };

      if constexpr (T::kTwoTermI8) {
        // The fp8 two-term loop below with the loops swapped: per pair of n8 tiles, every k step,
        // so that only this pair's int32 sums are live (16 registers, not 2 * kN8 * 4): one per
        // q term, each starting at its bias (kv_convert.cuh kMagicBits); the low one is shifted
        // into the high one after the last step. q is in registers, or (head_dim > 128) the
        // chunk is 16 tokens: one pair, so nothing is loaded twice.
#pragma unroll
        for (int j = 0; j < kN8; j += 2) {
          int s_hi[2][4], s_lo[2][4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s_hi[0][e] = s_hi[1][e] = kv::kMagicBits;
            s_lo[0][e] = s_lo[1][e] = 64;
          }
#pragma unroll
          for (int kk = 0; kk < T::kK32Steps; ++kk) {
            unsigned qh[4], ql[4];
            load_q8(kk, 0, qh);
            load_q8(kk, 1, ql);
            unsigned b0, b1, b2, b3;
            load_k8(j, kk, b0, b1, b2, b3);
            ptx::mma_s8_16832(s_hi[0], qh, b0, b1);
            ptx::mma_s8_16832(s_lo[0], ql, b0, b1);
            ptx::mma_s8_16832(s_hi[1], qh, b2, b3);
            ptx::mma_s8_16832(s_lo[1], ql, b2, b3);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s_acc[j][e] = kv::magic_to_float(s_hi[0][e] + (s_lo[0][e] >> 7));
            s_acc[j + 1][e] = kv::magic_to_float(s_hi[1][e] + (s_lo[1][e] >> 7));
          }
        }
      } else if constexpr (T::kTwoTerm) {
        // Both q terms share every K fragment (load_k8).
#pragma unroll
        for (int kk = 0; kk < T::kK32Steps; ++kk) {
          unsigned qh[4], ql[4];
          load_q8(kk, 0, qh);
          load_q8(kk, 1, ql);
#pragma unroll
          for (int j = 0; j < kN8; j += 2) {
            unsigned b0, b1, b2, b3;
            load_k8(j, kk, b0, b1, b2, b3);
            ptx::mma_e4m3_16832(s_acc[j], qh, b0, b1);
            ptx::mma_e4m3_16832(s_acc[j], ql, b0, b1);
            ptx::mma_e4m3_16832(s_acc[j + 1], qh, b2, b3);
            ptx::mma_e4m3_16832(s_acc[j + 1], ql, b2, b3);
          }
        }
      } else if constexpr (T::kLdsm8) {
        // ldmatrix on 8-bit rows: thread (g, c) gets bytes 4c..4c+3 of token g per matrix, what
        // a 32-bit load per tile and 16-dim step gave; one x4 feeds two tiles x two k steps.
#pragma unroll
        for (int kk = 0; kk < kKSteps; kk += 2) {
          const bool pair = kk + 1 < kKSteps;  // compile-time after unrolling
          unsigned a0[4], a1[4];
          load_q(kk, a0);
          if (pair) load_q(kk + 1, a1);
#pragma unroll
          for (int j = 0; j < kN8; j += 2) {
            const int m = lane / 8;
            unsigned w0, w1, w2, w3;
            if (pair) {
              // x4: (tokens 0-7, step kk), (tokens 0-7, kk + 1), (tokens 8-15, kk), (8-15, kk + 1).
              const int tok = local0 + j * 8 + (m / 2) * 8 + lane % 8;
              ptx::ldmatrix_x4(ks + tok * T::kRowStride + kk * 16 + (m % 2) * 16, w0, w1, w2, w3);
            } else {
              const int tok = local0 + j * 8 + (m % 2) * 8 + lane % 8;
              ptx::ldmatrix_x2(ks + tok * T::kRowStride + kk * 16, w0, w2);
              w1 = w3 = 0u;
            }
            unsigned b0, b1;
            kv::widen4<T::kKvKind>(w0, b0, b1);
            ptx::mma_16816<kFp16>(s_acc[j], a0, b0, b1);
            kv::widen4<T::kKvKind>(w2, b0, b1);
            ptx::mma_16816<kFp16>(s_acc[j + 1], a0, b0, b1);
            if (pair) {
              kv::widen4<T::kKvKind>(w1, b0, b1);
              ptx::mma_16816<kFp16>(s_acc[j], a1, b0, b1);
              kv::widen4<T::kKvKind>(w3, b0, b1);
              ptx::mma_16816<kFp16>(s_acc[j + 1], a1, b0, b1);
            }
          }
        }
      } else {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        unsigned a[4];
        load_q(kk, a);
#pragma unroll
        for (int j = 0; j < kN8; j += 2) {
          // x4: (tokens 0-7, dims 0-7), (tokens 0-7, dims 8-15), (tokens 8-15, ...) x2.
          const int m = lane / 8;
          const int tok = local0 + j * 8 + (m / 2) * 8 + lane % 8;
          const unsigned addr = ks + tok * T::kRowStride + (kk * 16 + (m % 2) * 8) * 2;
          unsigned b0, b1, b2, b3;
          ptx::ldmatrix_x4(addr, b0, b1, b2, b3);
          ptx::mma_16816<kFp16>(s_acc[j], a, b0, b1);
          ptx::mma_16816<kFp16>(s_acc[j + 1], a, b2, b3);
        }
      }
      }

      // Scale (log2 units), soft-cap, mask.
      const bool need_mask = (kBeams > 1 && beam_only >= 0) || (t0 + T::kChunk > causal_start) ||
                             (T::kWindow && t0 < seq_len - p.window) || (T::kChecked && bad_tile);
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s_acc[j][e];
          if constexpr (T::kSoftcap) {
            x = p.softcap * tanhf(x * row_qk_scale[e / 2] / p.softcap) * kLog2e;
          } else {
            x *= row_log2_scale[e / 2];
          }
          if (need_mask) {
            const int h = e / 2;
            const int t = t0 + j * 8 + 2 * c + (e % 2);
            bool visible = t < range.end;
            if constexpr (kBeams > 1) {
              visible = visible && t < row_len[h] && (beam_only < 0 || beam_only == row_beam[h]);
            }
            visible = visible && row_sees_key<T>(p, t, row_pos[h], row_drafts[h], row_tree[h]);
            if constexpr (T::kChecked) {
              // t < range.end here, so its page_table entry is one the request's length uses.
              if (bad_tile && visible) visible = page_ok(t);
            }
            if (!visible) x = kNegInf;
          }
          s_acc[j][e] = x;
        }
      }

      // Online softmax, per row (h = 0: row g, 1: row g+8); the four threads of a group share a row.
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = kNegInf;
#pragma unroll
        for (int j = 0; j < kN8; ++j) mx = fmaxf(mx, fmaxf(s_acc[j][2 * h], s_acc[j][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[h], mx);
        // A row that has seen nothing yet keeps m = -inf; subtracting 0 then keeps exp2 at 0
        // instead of NaN (-inf - -inf).
        const float m_use = m_new == kNegInf ? 0.f : m_new;
        alpha[h] = ptx::ex2(m_run[h] - m_use);
        m_run[h] = m_new;
        // Two-term PV: P comes out times 2^kPShift (in [0, 256], e4m3 range); l and O carry the
        // same factor, and the max this warp reports is lowered by it, so the merge, the sink,
        // LSE and the splits see consistent (m, l, o) with no extra multiply.
        const float m_p = m_use - kPShift;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kN8; ++j) {
          s_acc[j][2 * h] = ptx::ex2(s_acc[j][2 * h] - m_p);
          s_acc[j][2 * h + 1] = ptx::ex2(s_acc[j][2 * h + 1] - m_p);
          sum += s_acc[j][2 * h] + s_acc[j][2 * h + 1];
        }
        l_run[h] = l_run[h] * alpha[h] + sum;  // per-thread partial; summed over the group at the end
      }
      // Once a row's max settles (the common case after the first tiles) alpha is exactly 1:
      // skip the head_dim / 2 multiplies when no row of the warp moved.
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int o = 0; o < kOTiles; ++o) {
          o_acc[o][0] *= alpha[0];
          o_acc[o][1] *= alpha[0];
          o_acc[o][2] *= alpha[1];
          o_acc[o][3] *= alpha[1];
        }
      }

      if constexpr (T::kPvTwoTerm) {
        // O += (P_hi + P_lo) V, 32 tokens per m16n8k32 (16 when a warp's chunk is 16: the upper
        // k half is zero on both sides). A's k order is the S fragment's own: k 4c..4c+3 holds
        // tokens 2c, 2c+1 of n8 tiles 0 and 1 (k + 16: tiles 2 and 3), so P needs no shuffle.
        // V: ldmatrix.trans on 8-bit rows gives thread (g, c), per 8-token matrix, the bytes
        // (2g, 2g+1) of tokens 2c and 2c+1; one prmt per B register picks one dim of four tokens.
#pragma unroll
        for (int st = 0; st < (T::kChunk + 31) / 32; ++st) {
          constexpr bool kHalf = T::kChunk % 32 != 0;
          const int j0 = 4 * st;
          unsigned ph[4], pl[4];
          auto split_p = [](float x0, float x1, float x2, float x3, unsigned& hi, unsigned& lo) {
            kv::split_e4m3_f16(x0, x1, x2, x3, hi, lo);
          };
          split_p(s_acc[j0][0], s_acc[j0][1], s_acc[j0 + 1][0], s_acc[j0 + 1][1], ph[0], pl[0]);
          split_p(s_acc[j0][2], s_acc[j0][3], s_acc[j0 + 1][2], s_acc[j0 + 1][3], ph[1], pl[1]);
          if constexpr (kHalf) {
            ph[2] = ph[3] = pl[2] = pl[3] = 0u;
          } else {
            split_p(s_acc[j0 + 2][0], s_acc[j0 + 2][1], s_acc[j0 + 3][0], s_acc[j0 + 3][1], ph[2], pl[2]);
            split_p(s_acc[j0 + 2][2], s_acc[j0 + 2][3], s_acc[j0 + 3][2], s_acc[j0 + 3][3], ph[3], pl[3]);
          }
          const int tok0 = local0 + st * 32;
#pragma unroll
          for (int blk = 0; blk < D / 16; ++blk) {
            unsigned r0, r1, r2 = 0u, r3 = 0u;
            if constexpr (kHalf) {
              const int tok = tok0 + ((lane / 8) % 2) * 8 + lane % 8;
              ptx::ldmatrix_x2_trans(vs + tok * T::kRowStride + blk * 16, r0, r1);
            } else {
              const int tok = tok0 + lane;  // matrix lane / 8 = tokens 8 (lane / 8) ..
              ptx::ldmatrix_x4_trans(vs + tok * T::kRowStride + blk * 16, r0, r1, r2, r3);
            }
            const unsigned even0 = ptx::prmt(r0, r1, 0x6420u), odd0 = ptx::prmt(r0, r1, 0x7531u);
            const unsigned even1 = kHalf ? 0u : ptx::prmt(r2, r3, 0x6420u);
            const unsigned odd1 = kHalf ? 0u : ptx::prmt(r2, r3, 0x7531u);
            ptx::mma_e4m3_16832(o_acc[2 * blk], ph, even0, even1);
            ptx::mma_e4m3_16832(o_acc[2 * blk], pl, even0, even1);
            ptx::mma_e4m3_16832(o_acc[2 * blk + 1], ph, odd0, odd1);
            ptx::mma_e4m3_16832(o_acc[2 * blk + 1], pl, odd0, odd1);
          }
        }
      } else if constexpr (T::kLdsm8) {
        // O += P V, two 16-token k steps per ldmatrix.x4.trans (one when the chunk is 16): per
        // 8-token matrix thread (g, c) gets bytes (2g, 2g+1) of tokens 2c, 2c+1; one prmt per
        // register gives one dim of tokens 2c, 2c+1, 2c+8, 2c+9, which widen to the k16 B pair.
#pragma unroll
        for (int st = 0; st < T::kChunk / 16; st += 2) {
          const bool pair = st + 1 < T::kChunk / 16;
          unsigned a0[4], a1[4];
          a0[0] = ptx::pack2<kFp16>(s_acc[2 * st][0], s_acc[2 * st][1]);
          a0[1] = ptx::pack2<kFp16>(s_acc[2 * st][2], s_acc[2 * st][3]);
          a0[2] = ptx::pack2<kFp16>(s_acc[2 * st + 1][0], s_acc[2 * st + 1][1]);
          a0[3] = ptx::pack2<kFp16>(s_acc[2 * st + 1][2], s_acc[2 * st + 1][3]);
          if (pair) {
            a1[0] = ptx::pack2<kFp16>(s_acc[2 * st + 2][0], s_acc[2 * st + 2][1]);
            a1[1] = ptx::pack2<kFp16>(s_acc[2 * st + 2][2], s_acc[2 * st + 2][3]);
            a1[2] = ptx::pack2<kFp16>(s_acc[2 * st + 3][0], s_acc[2 * st + 3][1]);
            a1[3] = ptx::pack2<kFp16>(s_acc[2 * st + 3][2], s_acc[2 * st + 3][3]);
          }
          const int tok0 = local0 + st * 16;
#pragma unroll
          for (int blk = 0; blk < D / 16; ++blk) {
            unsigned r0, r1, r2 = 0u, r3 = 0u;
            if (pair) {
              ptx::ldmatrix_x4_trans(vs + (tok0 + lane) * T::kRowStride + blk * 16, r0, r1, r2, r3);
            } else {
              const int tok = tok0 + ((lane / 8) % 2) * 8 + lane % 8;
              ptx::ldmatrix_x2_trans(vs + tok * T::kRowStride + blk * 16, r0, r1);
            }
            unsigned b0, b1;
            kv::widen4<T::kKvKind>(ptx::prmt(r0, r1, 0x6420u), b0, b1);
            ptx::mma_16816<kFp16>(o_acc[2 * blk], a0, b0, b1);
            kv::widen4<T::kKvKind>(ptx::prmt(r0, r1, 0x7531u), b0, b1);
            ptx::mma_16816<kFp16>(o_acc[2 * blk + 1], a0, b0, b1);
            if (pair) {
              kv::widen4<T::kKvKind>(ptx::prmt(r2, r3, 0x6420u), b0, b1);
              ptx::mma_16816<kFp16>(o_acc[2 * blk], a1, b0, b1);
              kv::widen4<T::kKvKind>(ptx::prmt(r2, r3, 0x7531u), b0, b1);
              ptx::mma_16816<kFp16>(o_acc[2 * blk + 1], a1, b0, b1);
            }
          }
        }
      } else {
      // O += P V, 16 tokens per k step.
#pragma unroll
      for (int st = 0; st < T::kChunk / 16; ++st) {
        unsigned a[4];
        a[0] = ptx::pack2<kFp16>(s_acc[2 * st][0], s_acc[2 * st][1]);
        a[1] = ptx::pack2<kFp16>(s_acc[2 * st][2], s_acc[2 * st][3]);
        a[2] = ptx::pack2<kFp16>(s_acc[2 * st + 1][0], s_acc[2 * st + 1][1]);
        a[3] = ptx::pack2<kFp16>(s_acc[2 * st + 1][2], s_acc[2 * st + 1][3]);
        const int tok0 = local0 + st * 16;
#pragma unroll
        for (int o = 0; o < kOTiles; o += 2) {
          // x4.trans: (tokens 0-7, dims o*8..), (tokens 8-15, same), then dims +8.
          const int m = lane / 8;
          const int tok = tok0 + (m % 2) * 8 + lane % 8;
          const unsigned addr = vs + tok * T::kRowStride + (o * 8 + (m / 2) * 8) * 2;
          unsigned b0, b1, b2, b3;
          ptx::ldmatrix_x4_trans(addr, b0, b1, b2, b3);
          ptx::mma_16816<kFp16>(o_acc[o], a, b0, b1);
          ptx::mma_16816<kFp16>(o_acc[o + 1], a, b2, b3);
        }
      }
      }
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // pipeline buffers are now free for the merge

  // ---- Merge the kWarpsN token slices of each row in shared memory ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  const MergeArea<T> area(smem);
  float* merge_o = area.o;
  float* merge_ml = area.ml;
  {
    const int lrow_lo = warp_m * 16 + g;
#pragma unroll
    for (int o = 0; o < kOTiles; ++o) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int lrow = lrow_lo + (e / 2) * 8;
        const int d = out_dim<T>(o, 2 * c + (e % 2));
        merge_o[(warp_n * T::kRows + lrow) * D + d] = o_acc[o][e];
      }
    }
    if (c == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int lrow = lrow_lo + h * 8;
        merge_ml[(warp_n * T::kRows + lrow) * 2 + 0] = m_run[h] - kPShift;  // P's scale, see above
        merge_ml[(warp_n * T::kRows + lrow) * 2 + 1] = l_run[h];
      }
    }
  }
  __syncthreads();

  const CtaRows cta{batch, request, kv_head, row_blocks, row_block, split, row0, rows_total, rows_per_beam};
  finish_cta<T>(p, smem, cta, v_scale);
}

}  // namespace deca::gqa
