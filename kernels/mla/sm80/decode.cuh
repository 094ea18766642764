// Portable MLA decode kernel: mma.sync tensor cores, sm_80 and newer (Hopper runs the
// warp-specialized kernels/mla/sm90/ one; this is its reference and fallback). One kernel for
// both token sources: sparse (top-k indices into 656-byte FP8 tokens) and dense (a block table,
// the cache in any MlaKvFormat); kernels/mla/sm80/gather.cuh has everything that differs.
//
// CTA = (block of 64 heads, query token, SM partition of the scheduler,
// kernels/mla/schedule/work.cuh). It walks the partition's (request, block of 64 tokens) work in
// order. Per block: 128 threads turn this block's and the next block's tokens into byte offsets
// (masked: -1 indices, indices past len(r), ids outside the pool; dense: positions the query
// token does not see, block ids outside the pool; the next block's records are prefetched into
// L2 during the math); all 512 threads gather the 64 records with 16-byte loads into bf16 K rows
// in shared memory, dequantizing 8-bit values exactly as the CPU reference rounds (fp32 product,
// then bf16; masked tokens become zero rows, so V never carries garbage into 0 * x); QK^T (64 x
// 64 over 576 dims) is split over the 16 warps, 16 heads x 16 tokens each, into fp32 scores in
// shared memory; then each warp owns 16 heads x 128 value dims: it reads its heads' 64 scores,
// runs the online softmax in exp2 with the scale folded in (the four warps of a head group
// compute the same max and sum), and accumulates P V from the K tile's first 512 dims.
//
// Output: a request whose blocks all sit in this partition is finished here (bf16 out scaled by
// 1 / (l + sink), LSE natural log, sink excluded); a piece of a split request writes O / l and its
// LSE to its slot for the combine kernel. After its last write the CTA lets a PDL-launched
// combine start. A query token that sees no key of its piece writes zeros and LSE -inf.
//
// MODEL1 (kFormat kMlaKvModel1, entry kernels/mla/sm80/model1_entry.cuh): q and K have 512 dims
// (448 dequantized NoPE + 64 RoPE), V is the same 512; a request's blocks come from two caches,
// the first cache's then the extra cache's, all in one online softmax (kernels/mla/sm80/model1.cuh).
//
// Checked mode (kChecked, issue 9; entries kernels/mla/sm80/entry_checked.cuh, dense_entry.cuh):
// an index that is neither -1 nor in [0, num_blocks * page_size) (sparse), a block id outside
// [0, num_blocks) (dense, kCheckPageId), and a length outside [0, topk] (topk_length; dense:
// cache_seqlens outside [0, min(max_seq_len, max_blocks * page_size)], kCheckTopkLength), are
// recorded in the workspace (kernels/common/check_record.cuh); all are skipped or clamped as in
// the unchecked kernel, which compiles without the tests. MODEL1 tests the extra cache's indices
// and extra_topk_length alike (kCheckExtraIndex, kCheckExtraTopkLength).
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "kernels/mla/lse.cuh"
#include "kernels/mla/sm80/gather.cuh"
#include "kernels/mla/sm80/model1.cuh"
#include "kernels/mla/sm80/traits.cuh"

namespace deca::mla::portable {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = __builtin_bit_cast(float, 0xff800000u);

// Q rows of this CTA's heads for query token i of request r; rows past num_heads are zeros.
// kChunks 16-byte chunks a row: 72 (576 dims), or 64 (MODEL1's 512).
template <int kChunks>
__device__ __forceinline__ void load_q(const MlaSparseParams& p, Smem& sm, int r, int i, int head0) {
  const unsigned base = ptx::smem_addr(sm.q);
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int row = c / kChunks;
    const int chunk = c % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (head0 + row < p.num_heads) {
      const auto* src = static_cast<const unsigned char*>(p.q) +
                        2 * (r * p.q_stride_batch + i * p.q_stride_token +
                             (head0 + row) * p.q_stride_head) +
                        16 * chunk;
      v = __ldg(reinterpret_cast<const uint4*>(src));
    }
    sts128(base + swz(row, chunk), v);
  }
}

// Per-thread online-softmax state for rows g and g + 8 of the warp's head group.
struct RowState {
  float m[2];  // running max of scaled logits, log2 units
  float l[2];  // this thread's share of the running sum (reduced over the quad at the end)
};

// kDense: the token source is kp.dense's block table (kp.p.indices is null, topk_length holds
// the cache lengths, topk the plan's max_seq_len) and kFormat its records' MlaKvFormat; sparse
// decode reads kMlaKvFP8Sparse records through kp.p.indices, or kMlaKvModel1 records of two
// caches through kp.p.indices and kp.p.extra_indices (kernels/mla/sm80/model1.cuh).
template <bool kChecked, bool kDense = false, int kFormat = kMlaKvFP8Sparse>
__device__ __forceinline__ void decode(const DecodeKernelParams& kp, unsigned char* smem) {
  constexpr bool kModel1 = kFormat == kMlaKvModel1;
  static_assert(kDense ? !kModel1 : (kFormat == kMlaKvFP8Sparse || kModel1),
                "sparse decode reads the 656-byte FP8 token or MODEL1's");
  Smem& sm = *reinterpret_cast<Smem*>(smem);
  const MlaSparseParams& p = kp.p;
  const SparseRun& run = kp.run;
  if (!schedule_matches<kModel1>(p, run)) {
    // A reused schedule of another call shape: NaN outputs, no attention, and in checked mode a
    // record of what the workspace held.
    fill_nan_outputs(p, static_cast<int>(blockIdx.x) * kRows, kRows, static_cast<int>(blockIdx.y),
                     static_cast<int>(blockIdx.z), static_cast<int>(gridDim.z));
    if constexpr (kChecked) report_schedule_mismatch(run);
    return;
  }
  const SparsePart& part = run.parts[blockIdx.z];  // read in place: registers go to O
  const int i = blockIdx.y;
  const int head0 = blockIdx.x * kRows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int rg = warp % 4;  // head group: rows 16 rg .. 16 rg + 15
  const int cg = warp / 4;  // QK^T: tokens 16 cg ..; PV: value dims 128 cg ..
  const int g = lane / 4;
  const int t = lane % 4;
  const float scale_log2 = p.softmax_scale * kLog2e;
  // ldmatrix addresses: a row base per operand plus the swizzled chunk offsets of one round of
  // 8 chunks (chunk c of a row r sits at (c ^ (r & 7)); r & 7 == lane & 7 for every operand).
  const int x = lane & 7;
  const unsigned qa_row = ptx::smem_addr(sm.q) + (16 * rg + (lane & 15)) * kRowBytes;
  const unsigned kb_row =
      ptx::smem_addr(sm.k) + (16 * cg + (lane & 7) + ((lane >> 4) << 3)) * kRowBytes;
  const unsigned v_row =
      ptx::smem_addr(sm.k) + ((lane & 7) + (((lane >> 3) & 1) << 3)) * kRowBytes + cg * 256;
  unsigned qa_off[4], kb_off[4];  // V's offsets are Q's: both take chunk half lane >> 4
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    qa_off[j] = ((2 * j + (lane >> 4)) ^ x) << 4;
    kb_off[j] = ((2 * j + ((lane >> 3) & 1)) ^ x) << 4;
  }

  for (int r = part.begin_req; r <= part.end_req; ++r) {
    int first, last;
    piece_blocks(part, topk_lists<kModel1>(p), r, first, last);
    const int len = request_len(p.topk_length, p.topk, r);
    TokenList tl;
    if constexpr (kDense) {
      tl.list = kp.dense.block_table + r * kp.dense.block_table_stride;
      tl.len = len - (p.q_len - 1 - i);
    } else {
      tl.list = p.indices + r * p.indices_stride_batch + i * p.indices_stride_token;
      tl.len = len;
    }
    const IndexSite site{r, i, run.check};
    if constexpr (kChecked) {
      // The length was clamped to [0, topk] above (and by the scheduler); report it once per CTA.
      // Dense: the cache length against max_seq_len and the block table's columns (tokens past
      // them are skipped: dense_token_offset).
      if (threadIdx.x == 0 && p.topk_length != nullptr) {
        const int raw = p.topk_length[r];
        if constexpr (kDense) {
          const long long columns = static_cast<long long>(kp.dense.max_blocks) * p.page_size;
          const long long hi = columns < p.topk ? columns : p.topk;
          if (raw < 0 || raw > hi) {
            check_report(static_cast<CheckRecord*>(run.check), kCheckTopkLength, r, 0, 0, raw, hi);
          }
        } else if (raw < 0 || raw > p.topk) {
          check_report(static_cast<CheckRecord*>(run.check), kCheckTopkLength, r, 0, 0, raw, p.topk);
        }
      }
      if constexpr (kModel1) {
        if (threadIdx.x == 0 && p.extra_topk > 0 && p.extra_topk_length != nullptr) {
          const int raw = p.extra_topk_length[r];
          if (raw < 0 || raw > p.extra_topk) {
            check_report(static_cast<CheckRecord*>(run.check), kCheckExtraTopkLength, r, 0, 0, raw,
                         p.extra_topk);
          }
        }
      }
    }

    __syncthreads();  // the previous request's last QK^T is done with Q
    load_q<(kModel1 ? kModel1DimQK : kDimQK) / 8>(p, sm, r, i, head0);

    RowState st;
    st.m[0] = st.m[1] = kNegInf;
    st.l[0] = st.l[1] = 0.f;
    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int blk = first; blk < last; ++blk) {
      __syncthreads();  // PV of the previous block is done with K and the scores
      if constexpr (kModel1) {
        load_model1_offsets<kChecked>(p, sm, blk, last, site);
        __syncthreads();
        gather_model1_block(sm);
      } else {
        load_offsets<kChecked, kDense>(kp, sm, tl, blk, last, site);
        __syncthreads();
        gather_block<kDense, kFormat>(kp, sm);
      }
      __syncthreads();

      // QK^T: 16 heads (rg) x 16 tokens (cg) per warp, 36 k-steps of 16 dims in 9 rounds of 4
      // (MODEL1: 32 in 8).
      // Within a round of 8 chunks the swizzle is a fixed permutation, so four offsets per
      // operand serve every round (computed ones get hoisted 36-fold and spill).
      float s[2][4] = {};
#pragma unroll 1
      for (int round = 0; round < (kModel1 ? kModel1DimQK : kDimQK) / 64; ++round) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          unsigned a[4], b0, b1, b2, b3;
          ptx::ldmatrix_x4(qa_row + round * 128 + qa_off[j], a[0], a[1], a[2], a[3]);
          ptx::ldmatrix_x4(kb_row + round * 128 + kb_off[j], b0, b1, b2, b3);
          ptx::mma_16816<false>(s[0], a, b0, b1);
          ptx::mma_16816<false>(s[1], a, b2, b3);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = 16 * cg + 8 * nt + 2 * t;
        const bool v0 = sm.token_offset[key] >= 0;
        const bool v1 = sm.token_offset[key + 1] >= 0;
        float* row0 = sm.s + (16 * rg + g) * kSStride + key;
        float* row1 = row0 + 8 * kSStride;
        *reinterpret_cast<float2*>(row0) = make_float2(v0 ? s[nt][0] : kNegInf, v1 ? s[nt][1] : kNegInf);
        *reinterpret_cast<float2*>(row1) = make_float2(v0 ? s[nt][2] : kNegInf, v1 ? s[nt][3] : kNegInf);
      }
      __syncthreads();

      // Online softmax over the 64 scores of rows g, g + 8, read twice from shared memory (max,
      // then exp2 straight into mma A fragments) rather than held: registers go to O.
      float alpha[2];
      float m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* row = sm.s + (16 * rg + g + 8 * h) * kSStride + 2 * t;
        float mx = kNegInf;
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
          const float2 lo = *reinterpret_cast<const float2*>(row + 16 * kt);
          const float2 hi = *reinterpret_cast<const float2*>(row + 16 * kt + 8);
          mx = fmaxf(mx, fmaxf(fmaxf(lo.x, lo.y), fmaxf(hi.x, hi.y)));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(st.m[h], mx * scale_log2);
        // -inf guards: no valid key yet keeps the subtrahend finite (every p is then 0), and a
        // state that saw nothing rescales by 0 rather than exp2(-inf + inf).
        m_use[h] = m_new == kNegInf ? 0.f : m_new;
        alpha[h] = st.m[h] == kNegInf ? 0.f : ptx::ex2(st.m[h] - m_use[h]);
        st.m[h] = m_new;
        st.l[h] *= alpha[h];
      }
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
      // PV: 16 heads x 128 value dims per warp; V rows are K's first 512 dims. Each k-step makes
      // its P fragment (exp2 of 16 scores, packed to bf16) right before its eight ldmatrix + 16
      // mma: holding all of P would cost 16 registers next to the 64 accumulators and spill. The
      // loop stays rolled for the same reason (unrolled, ptxas hoists the next step's ldmatrix).
#pragma unroll 1
      for (int kt = 0; kt < 4; ++kt) {
        unsigned a[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float* row = sm.s + (16 * rg + g + 8 * h) * kSStride + 16 * kt + 2 * t;
          const float2 lo = *reinterpret_cast<const float2*>(row);
          const float2 hi = *reinterpret_cast<const float2*>(row + 8);
          const float e0 = ptx::ex2(lo.x * scale_log2 - m_use[h]);
          const float e1 = ptx::ex2(lo.y * scale_log2 - m_use[h]);
          const float e2 = ptx::ex2(hi.x * scale_log2 - m_use[h]);
          const float e3 = ptx::ex2(hi.y * scale_log2 - m_use[h]);
          st.l[h] += (e0 + e1) + (e2 + e3);
          a[h] = ptx::pack2<false>(e0, e1);
          a[2 + h] = ptx::pack2<false>(e2, e3);
        }
        const unsigned v_kt = v_row + kt * 16 * kRowBytes;
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          unsigned b0, b1, b2, b3;
          ptx::ldmatrix_x4_trans(v_kt + (np >> 2) * 128 + qa_off[np & 3], b0, b1, b2, b3);
          ptx::mma_16816<false>(o[2 * np], a, b0, b1);
          ptx::mma_16816<false>(o[2 * np + 1], a, b2, b3);
        }
      }
    }

    // Epilogue: the quad's partial sums, then out (unsplit) or the piece's partial.
    const int count = run.split_offsets[r + 1] - run.split_offsets[r];
    const int slot = piece_slot(part, run.split_offsets, r);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
      st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = head0 + 16 * rg + g + 8 * h;
      if (head >= p.num_heads) continue;
      const bool empty = st.l[h] == 0.f;
      const float lse = empty ? kNegInf : (st.m[h] + ptx::lg2(st.l[h])) * kLn2;
      if (count == 1) {
        float denom = st.l[h];
        if (p.attn_sink != nullptr && !empty) {
          denom += ptx::ex2(__ldg(p.attn_sink + head) * kLog2e - st.m[h]);
        }
        const float inv = empty ? 0.f : __frcp_rn(denom);
        auto* out = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch +
                    i * p.out_stride_token + head * p.out_stride_head;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          const int d = 128 * cg + 8 * n + 2 * t;
          *reinterpret_cast<unsigned*>(out + d) =
              ptx::pack2<false>(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        }
        if (p.lse != nullptr && cg == 0 && t == 0) {
          p.lse[r * p.lse_stride_batch + i * p.lse_stride_token + head * p.lse_stride_head] = final_lse(lse);
        }
      } else {
        const float inv = empty ? 0.f : __frcp_rn(st.l[h]);
        const long long row = (static_cast<long long>(slot) * p.q_len + i) * p.num_heads + head;
        float* po = run.partial_o + row * kDimV;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          const int d = 128 * cg + 8 * n + 2 * t;
          *reinterpret_cast<float2*>(po + d) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        }
        if (cg == 0 && t == 0) run.partial_lse[row] = lse;
      }
    }
  }
  // Every write of this CTA is issued: a PDL-launched combine may start.
  ptx::griddep_launch_dependents();
}

}  // namespace deca::mla::portable
