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
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/common/kv_convert.cuh"
#include "kernels/gqa/traits.cuh"

namespace deca::gqa {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = __builtin_bit_cast(float, 0xff800000u);  // -inf, no include needed

// Where this CTA's keys start and end: tile-aligned ranges so that only the request's last tile is
// partial (and zero-filled past the end).
struct KeyRange {
  int begin;  // first key (tile aligned), inclusive
  int end;    // one past the last key
};

template <class T>
__device__ __forceinline__ KeyRange split_range(const GqaParams& p, int seq_len, int split) {
  // First key any row of the request can see: the window bounds it from below.
  int first = 0;
  if constexpr (T::kWindow) {
    const int p0 = seq_len - p.q_len;  // position of the first new token
    first = p0 - p.window + 1;
    if (first < 0) first = 0;
  }
  first = (first / T::kTile) * T::kTile;
  KeyRange r;
  if (p.split_tokens > 0) {
    // Fixed split size from key 0: a request's partition depends on its own length only.
    r.begin = split * p.split_tokens;
    r.end = r.begin + p.split_tokens;
    if (r.begin < first) r.begin = first;
  } else {
    const int tiles = (seq_len - first + T::kTile - 1) / T::kTile;
    const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
    r.begin = first + split * per_split * T::kTile;
    r.end = r.begin + per_split * T::kTile;
  }
  if (r.end > seq_len) r.end = seq_len;
  return r;
}

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
// 16-bit path keeps the natural order; the 8-bit V path interleaves dims so that one 32-bit shared
// load per row feeds four n8 tiles (see pv_chunk).
template <class T>
__device__ __forceinline__ int out_dim(int o, int col) {
  if constexpr (T::kKvKind == kv::kKv16) {
    return o * 8 + col;
  } else {
    const int group = o / 4;
    if (group < T::kVGroups32) return group * 32 + col * 4 + (o % 4);
    return T::kVGroups32 * 32 + col * 2 + (o % 4);  // the 16-dim tail: two tiles
  }
}

template <class T>
__device__ __forceinline__ unsigned q_pair_from(const void* q_row, int d) {
  // Two consecutive q values (d, d+1) as a packed pair of the compute type.
  const unsigned raw = *reinterpret_cast<const unsigned*>(
      static_cast<const unsigned short*>(q_row) + d);
  if constexpr ((T::kQDtype == kv::kFP16) == T::kComputeFp16) {
    return raw;
  } else if constexpr (T::kQDtype == kv::kFP16) {  // fp16 q, bf16 compute
    float lo = ptx::fp16_bits_to_float(static_cast<unsigned short>(raw & 0xFFFF));
    float hi = ptx::fp16_bits_to_float(static_cast<unsigned short>(raw >> 16));
    return ptx::pack2<false>(lo, hi);
  } else {  // bf16 q, fp16 compute
    float lo = ptx::bf16_bits_to_float(static_cast<unsigned short>(raw & 0xFFFF));
    float hi = ptx::bf16_bits_to_float(static_cast<unsigned short>(raw >> 16));
    return ptx::pack2<true>(lo, hi);
  }
}

// K-dimension order inside a 16-wide k step: the 16-bit path is the mma's own (pairs at 2c and
// 2c+8); the 8-bit K path reads 4 consecutive bytes per thread (dims 4c..4c+3), so q is permuted
// the same way: the dot product does not care about the order of its terms.
template <class T>
__device__ __forceinline__ int q_dim(int kk, int c, int half) {
  if constexpr (T::kKvKind == kv::kKv16) return kk * 16 + half * 8 + 2 * c;
  return kk * 16 + 4 * c + 2 * half;
}

template <class Cfg>
__device__ __forceinline__ void gqa_decode_kernel(const GqaParams& p, unsigned char* smem) {
  using T = Traits<Cfg>;
  constexpr int D = T::kHeadDim;
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
  const int batch = blockIdx.z;

  const int seq_len = p.seq_lens[batch];
  const int q_len = p.q_len;
  const int rows_total = q_len * T::kGroup;
  const int row0 = row_block * T::kRows;  // first row of this CTA
  // Row blocks are sized from the plan's max q_len; with a shorter q_len the tail blocks have no
  // rows. All CTAs of such a block leave together, so its split counter stays untouched.
  if (row0 >= rows_total) return;
  const KeyRange range = split_range<T>(p, seq_len, split);
  const int num_tiles = range.end > range.begin ? (range.end - range.begin + T::kTile - 1) / T::kTile : 0;

  const float k_scale = (p.k_scales ? p.k_scales[kv_head] : p.k_scale) * T::kKvFactor;
  const float v_scale = (p.v_scales ? p.v_scales[kv_head] : p.v_scale) * T::kKvFactor;
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
    const int tok = row / T::kGroup;
    const int head = kv_head * T::kGroup + row % T::kGroup;
    return static_cast<const unsigned short*>(p.q) + batch * p.q_stride_batch +
           tok * p.q_stride_token + head * p.q_stride_head;
  };
  unsigned q_frag[T::kQInRegs ? kKSteps : 1][4];
  if constexpr (T::kQInRegs) {
    const bool lo_ok = my_row_lo < rows_total;
    const bool hi_ok = my_row_hi < rows_total;
    const void* q_lo = lo_ok ? q_row_ptr(my_row_lo) : nullptr;
    const void* q_hi = hi_ok ? q_row_ptr(my_row_hi) : nullptr;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      q_frag[kk][0] = lo_ok ? q_pair_from<T>(q_lo, q_dim<T>(kk, c, 0)) : 0u;
      q_frag[kk][1] = hi_ok ? q_pair_from<T>(q_hi, q_dim<T>(kk, c, 0)) : 0u;
      q_frag[kk][2] = lo_ok ? q_pair_from<T>(q_lo, q_dim<T>(kk, c, 1)) : 0u;
      q_frag[kk][3] = hi_ok ? q_pair_from<T>(q_hi, q_dim<T>(kk, c, 1)) : 0u;
    }
  } else {
    // Natural order, compute type, one row per kQRowStride bytes.
    for (int i = tid; i < T::kRows * (D / 2); i += T::kThreads) {
      const int r = i / (D / 2);
      const int d = (i % (D / 2)) * 2;
      const int row = row0 + r;
      const unsigned v = row < rows_total ? q_pair_from<T>(q_row_ptr(row), d) : 0u;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(q_smem + r * T::kQRowStride + d * 2), "r"(v));
    }
    __syncthreads();
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

  // ---- Per-row masking facts (rows g and g+8 of this warp) ----
  const int causal_start = seq_len - q_len;  // keys below are visible to every row (window aside)
  int row_pos[2];
  const unsigned* row_tree[2] = {nullptr, nullptr};
  float sink_log2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h ? my_row_hi : my_row_lo;
    const int tok = row < rows_total ? row / T::kGroup : 0;
    row_pos[h] = causal_start + tok;
    if constexpr (T::kTree) {
      row_tree[h] = p.tree_mask + batch * p.mask_stride_batch + tok * p.mask_stride_token;
    }
    const int head = kv_head * T::kGroup + (row < rows_total ? row % T::kGroup : 0);
    sink_log2[h] = p.sinks ? p.sinks[head] * kLog2e : kNegInf;
  }

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
  const int* page_row = p.page_table + batch * p.page_table_stride;
  const long long k_page_bytes = p.k_stride_page * T::kKvBytes;
  const long long k_slot_bytes = p.k_stride_slot * T::kKvBytes;
  const long long v_page_bytes = p.v_stride_page * T::kKvBytes;
  const long long v_slot_bytes = p.v_stride_slot * T::kKvBytes;

  int pages_next[T::kLoadsPerThread];
  auto fetch_pages = [&](int tile) {
    const int t0 = range.begin + tile * T::kTile;
#pragma unroll
    for (int i = 0; i < T::kLoadsPerThread; ++i) {
      const int idx = tid + i * T::kThreads;
      const int row = idx / T::kChunksPerRow;
      const int tok = t0 + row;
      // Pages past the request's last key are never read: their table entries may be anything.
      pages_next[i] = (row < T::kTile && tok < range.end && tile < num_tiles)
                          ? __ldg(page_row + tok / T::kPageSize)
                          : -1;
    }
  };
  auto issue_tile = [&](int tile, int stage) {
    const int t0 = range.begin + tile * T::kTile;
    const unsigned ks = SharedStorage<T>::k_stage(smem_base, stage);
    const unsigned vs = SharedStorage<T>::v_stage(smem_base, stage);
#pragma unroll
    for (int i = 0; i < T::kLoadsPerThread; ++i) {
      const int idx = tid + i * T::kThreads;
      const int row = idx / T::kChunksPerRow;
      const int chunk = idx % T::kChunksPerRow;
      if (T::kTile * T::kChunksPerRow % T::kThreads == 0 || row < T::kTile) {
        const int tok = t0 + row;
        const int page = pages_next[i];
        const bool valid = page >= 0;
        const int slot = tok % T::kPageSize;
        const long long page_l = valid ? page : 0;
        const unsigned char* ksrc = k_base + page_l * k_page_bytes + slot * k_slot_bytes + chunk * 16;
        const unsigned char* vsrc = v_base + page_l * v_page_bytes + slot * v_slot_bytes + chunk * 16;
        const unsigned off = row * T::kRowStride + chunk * 16;
        ptx::cp_async_16(ks + off, valid ? ksrc : k_base, valid);
        ptx::cp_async_16(vs + off, valid ? vsrc : v_base, valid);
      }
    }
  };

  // ---- Prologue: fill kStages - 1 stages ----
  fetch_pages(0);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < num_tiles) issue_tile(s, s);
    ptx::cp_async_commit();
    fetch_pages(s + 1);
  }

  // ---- Main loop ----
  for (int tile = 0; tile < num_tiles; ++tile) {
    ptx::cp_async_wait<T::kStages - 2>();
    __syncthreads();  // tile `tile` landed for everyone; stage (tile - 1) % kStages is free
    {
      const int next = tile + T::kStages - 1;
      if (next < num_tiles) issue_tile(next, next % T::kStages);
      ptx::cp_async_commit();
      fetch_pages(next + 1);
    }
    const int stage = tile % T::kStages;
    const unsigned ks = SharedStorage<T>::k_stage(smem_base, stage);
    const unsigned vs = SharedStorage<T>::v_stage(smem_base, stage);
    const int tile_t0 = range.begin + tile * T::kTile;

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

#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        unsigned a[4];
        load_q(kk, a);
        if constexpr (T::kKvKind == kv::kKv16) {
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
        } else {
#pragma unroll
          for (int j = 0; j < kN8; ++j) {
            const int tok = local0 + j * 8 + g;
            const unsigned w = ptx::lds32(ks + tok * T::kRowStride + kk * 16 + 4 * c);
            const unsigned b0 = kv::pair<T::kKvKind, kFp16>(w, 0u, 0, 1);
            const unsigned b1 = kv::pair<T::kKvKind, kFp16>(w, 0u, 2, 3);
            ptx::mma_16816<kFp16>(s_acc[j], a, b0, b1);
          }
        }
      }

      // Scale (log2 units), soft-cap, mask.
      const bool need_mask = (t0 + T::kChunk > causal_start) ||
                             (T::kWindow && t0 < seq_len - p.window);
#pragma unroll
      for (int j = 0; j < kN8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s_acc[j][e];
          if constexpr (T::kSoftcap) {
            x = p.softcap * tanhf(x * qk_scale / p.softcap) * kLog2e;
          } else {
            x *= log2_scale;
          }
          if (need_mask) {
            const int h = e / 2;
            const int t = t0 + j * 8 + 2 * c + (e % 2);
            bool visible = t < range.end;
            const int pos = row_pos[h];
            if constexpr (T::kTree) {
              if (t >= causal_start) {
                const int jd = t - causal_start;
                visible = visible && ((row_tree[h][jd / 32] >> (jd % 32)) & 1u);
              }
            } else {
              visible = visible && t <= pos;
            }
            if constexpr (T::kWindow) visible = visible && t > pos - p.window;
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
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kN8; ++j) {
          s_acc[j][2 * h] = ptx::ex2(s_acc[j][2 * h] - m_use);
          s_acc[j][2 * h + 1] = ptx::ex2(s_acc[j][2 * h + 1] - m_use);
          sum += s_acc[j][2 * h] + s_acc[j][2 * h + 1];
        }
        l_run[h] = l_run[h] * alpha[h] + sum;  // per-thread partial; summed over the group at the end
      }
#pragma unroll
      for (int o = 0; o < kOTiles; ++o) {
        o_acc[o][0] *= alpha[0];
        o_acc[o][1] *= alpha[0];
        o_acc[o][2] *= alpha[1];
        o_acc[o][3] *= alpha[1];
      }

      // O += P V, 16 tokens per k step.
#pragma unroll
      for (int st = 0; st < T::kChunk / 16; ++st) {
        unsigned a[4];
        a[0] = ptx::pack2<kFp16>(s_acc[2 * st][0], s_acc[2 * st][1]);
        a[1] = ptx::pack2<kFp16>(s_acc[2 * st][2], s_acc[2 * st][3]);
        a[2] = ptx::pack2<kFp16>(s_acc[2 * st + 1][0], s_acc[2 * st + 1][1]);
        a[3] = ptx::pack2<kFp16>(s_acc[2 * st + 1][2], s_acc[2 * st + 1][3]);
        const int tok0 = local0 + st * 16;
        if constexpr (T::kKvKind == kv::kKv16) {
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
        } else {
          // Rows (tokens) 2c, 2c+1, 2c+8, 2c+9; one 32-bit load per row feeds four n8 tiles.
          const unsigned r0 = vs + (tok0 + 2 * c) * T::kRowStride;
          const unsigned r1 = r0 + T::kRowStride;
          const unsigned r2 = r0 + 8 * T::kRowStride;
          const unsigned r3 = r2 + T::kRowStride;
#pragma unroll
          for (int grp = 0; grp < T::kVGroups32; ++grp) {
            const unsigned off = grp * 32 + 4 * g;
            const unsigned w0 = ptx::lds32(r0 + off), w1 = ptx::lds32(r1 + off);
            const unsigned w2 = ptx::lds32(r2 + off), w3 = ptx::lds32(r3 + off);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const unsigned b0 = kv::pair<T::kKvKind, kFp16>(w0, w1, i, 4 + i);
              const unsigned b1 = kv::pair<T::kKvKind, kFp16>(w2, w3, i, 4 + i);
              ptx::mma_16816<kFp16>(o_acc[grp * 4 + i], a, b0, b1);
            }
          }
          if constexpr (T::kVTail16) {
            const unsigned off = T::kVGroups32 * 32 + 2 * g;
            const unsigned w0 = ptx::lds16(r0 + off), w1 = ptx::lds16(r1 + off);
            const unsigned w2 = ptx::lds16(r2 + off), w3 = ptx::lds16(r3 + off);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const unsigned b0 = kv::pair<T::kKvKind, kFp16>(w0, w1, i, 4 + i);
              const unsigned b1 = kv::pair<T::kKvKind, kFp16>(w2, w3, i, 4 + i);
              ptx::mma_16816<kFp16>(o_acc[T::kVGroups32 * 4 + i], a, b0, b1);
            }
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
  float* merge_o = reinterpret_cast<float*>(smem);                    // [kWarpsN][kRows][D]
  float* merge_ml = merge_o + T::kWarpsN * T::kRows * D;              // [kWarpsN][kRows][2]
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
        merge_ml[(warp_n * T::kRows + lrow) * 2 + 0] = m_run[h];
        merge_ml[(warp_n * T::kRows + lrow) * 2 + 1] = l_run[h];
      }
    }
  }
  __syncthreads();

  const int rows_here = rows_total - row0 < T::kRows ? rows_total - row0 : T::kRows;
  const bool split_mode = p.num_splits > 1;
  const long long unit = (static_cast<long long>(batch) * p.num_kv_heads + kv_head) * row_blocks + row_block;
  float* ws_o = split_mode ? p.ws_partial_o + (unit * p.num_splits + split) * T::kRows * D : nullptr;
  float* ws_ml = split_mode ? p.ws_partial_ml + (unit * p.num_splits + split) * T::kRows * 2 : nullptr;

  // Row results of this CTA: m (log2 units), l, and unnormalised o.
  auto cta_row = [&](int lrow, float& m, float& l) {
    m = kNegInf;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) m = fmaxf(m, merge_ml[(w * T::kRows + lrow) * 2]);
    const float m_use = m == kNegInf ? 0.f : m;
    l = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      l += merge_ml[(w * T::kRows + lrow) * 2 + 1] * ptx::ex2(merge_ml[(w * T::kRows + lrow) * 2] - m_use);
    }
  };
  auto cta_o = [&](int lrow, int d, float m) {
    const float m_use = m == kNegInf ? 0.f : m;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      acc += merge_o[(w * T::kRows + lrow) * D + d] * ptx::ex2(merge_ml[(w * T::kRows + lrow) * 2] - m_use);
    }
    return acc;
  };

  auto write_final = [&](int lrow, int d, float o, float m, float l) {
    const int row = row0 + lrow;
    const int tok = row / T::kGroup;
    const int head = kv_head * T::kGroup + row % T::kGroup;
    float denom = l;
    if (p.sinks) {
      const float m_use = m == kNegInf ? 0.f : m;
      denom += ptx::ex2(p.sinks[head] * kLog2e - m_use);
    }
    const float val = denom > 0.f ? o * v_scale / denom : 0.f;
    const long long off = batch * p.out_stride_batch + tok * p.out_stride_token + head * p.out_stride_head + d;
    if constexpr (T::kOutDtype == kv::kFP8) {
      static_cast<unsigned char*>(p.out)[off] = ptx::float_to_fp8_bits(val / p.out_scale);
    } else if constexpr (T::kOutDtype == kv::kFP16) {
      static_cast<unsigned short*>(p.out)[off] = ptx::float_to_fp16_bits(val);
    } else {
      static_cast<unsigned short*>(p.out)[off] = ptx::float_to_bf16_bits(val);
    }
    if (d == 0 && p.lse) {
      p.lse[batch * p.lse_stride_batch + tok * p.lse_stride_token + head * p.lse_stride_head] =
          l > 0.f ? (m + ptx::lg2(l)) * kLn2 : kNegInf;
    }
  };

  if (!split_mode) {
    for (int i = tid; i < rows_here * D; i += T::kThreads) {
      const int lrow = i / D;
      const int d = i % D;
      float m, l;
      cta_row(lrow, m, l);
      write_final(lrow, d, cta_o(lrow, d, m), m, l);
    }
    return;
  }

  // ---- Split-KV: publish this split's partial result ----
  for (int i = tid; i < rows_here * D; i += T::kThreads) {
    const int lrow = i / D;
    const int d = i % D;
    float m, l;
    cta_row(lrow, m, l);
    if (l > 0.f) ws_o[lrow * D + d] = cta_o(lrow, d, m);  // empty rows are never read back
    if (d == 0) {
      ws_ml[lrow * 2] = m;
      ws_ml[lrow * 2 + 1] = l;
    }
  }
  __threadfence();  // partials visible device-wide before the arrival is counted
  __syncthreads();
  __shared__ unsigned is_last;
  if (tid == 0) {
    const unsigned prev = atomicAdd(p.ws_counters + unit, 1u);
    is_last = prev == static_cast<unsigned>(p.num_splits - 1);
    if (is_last) p.ws_counters[unit] = 0u;  // ready for the next launch: no memset between calls
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // acquire side: the other splits' partials are read after their arrivals

  // ---- The last CTA merges every split, in split order (deterministic) ----
  const float* unit_o = p.ws_partial_o + unit * p.num_splits * T::kRows * D;
  const float* unit_ml = p.ws_partial_ml + unit * p.num_splits * T::kRows * 2;
  for (int i = tid; i < rows_here * D; i += T::kThreads) {
    const int lrow = i / D;
    const int d = i % D;
    float m = kNegInf;
    for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, __ldcg(unit_ml + (s * T::kRows + lrow) * 2));
    const float m_use = m == kNegInf ? 0.f : m;
    float l = 0.f, o = 0.f;
    for (int s = 0; s < p.num_splits; ++s) {
      const float ls = __ldcg(unit_ml + (s * T::kRows + lrow) * 2 + 1);
      if (ls > 0.f) {
        const float w = ptx::ex2(__ldcg(unit_ml + (s * T::kRows + lrow) * 2) - m_use);
        l += ls * w;
        o += __ldcg(unit_o + (s * T::kRows + lrow) * D + d) * w;
      }
    }
    write_final(lrow, d, o, m, l);
  }
}

}  // namespace deca::gqa
