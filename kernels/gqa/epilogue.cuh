// The end of a GQA decode CTA, shared by the portable kernel (decode.cuh) and the Hopper one
// (sm90/decode.cuh): the CTA's warps (or warpgroups) have left their partial rows in shared memory
// (MergeArea); this merges them per row, then writes the output and LSE, or, when the unit is cut
// into splits (split-KV), publishes the split's partial result, and the last split of the unit to
// arrive merges every split in order (bitwise reproducible). Needs of T: kHeadDim, kRows, kWarpsN, kThreads, kGroup,
// kOutDtype, kBeamWidth.
#pragma once

#include "kernels/common/kv_kind.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/gqa/stamps.cuh"

namespace deca::gqa {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = __builtin_bit_cast(float, 0xff800000u);  // -inf, no include needed

// Where the CTA's kWarpsN slices leave their rows: partial outputs [kWarpsN][kRows][D], unnormalised
// and relative to the slice's max; (max in log2 units, sum) [kWarpsN][kRows][2]; then the epilogue's
// own per-row max, sum and slice weights.
template <class T>
struct MergeArea {
  float* o;      // [kWarpsN][kRows][D]
  float* ml;     // [kWarpsN][kRows][2]
  float* row_m;  // [kRows] (log2 units)
  float* row_l;  // [kRows]
  float* row_w;  // [kRows][kWarpsN]
  __device__ __forceinline__ explicit MergeArea(unsigned char* smem) {
    o = reinterpret_cast<float*>(smem);
    ml = o + T::kWarpsN * T::kRows * T::kHeadDim;
    row_m = ml + T::kWarpsN * T::kRows * 2;
    row_l = row_m + T::kRows;
    row_w = row_l + T::kRows;
  }
};

// Which rows and which split a CTA holds.
struct CtaRows {
  int batch;          // the first beam's batch entry
  int request;        // blockIdx.z
  int kv_head;
  int row_blocks;     // row blocks per kv head
  int row_block;
  int split;          // blockIdx.x
  int row0;           // first row of the CTA
  int rows_total;     // rows of the request (beams x q_len x group)
  int rows_per_beam;  // q_len x group
};

// A unit (request, kv head, row block) cut into splits: how many, which one this CTA holds, where
// each leaves its partial result (split j in slot unit * num_splits + j: [kRows][D] of
// ws_partial_o, [kRows][2] of ws_partial_ml) and the unit's arrival counter. The count is
// bounded (max_merge_splits), so the merge stages every split's weights at once.
struct SplitPieces {
  int count;
  int index;
  long long unit;
  __device__ __forceinline__ long long slot(int j) const { return unit * count + j; }
};

__device__ __forceinline__ SplitPieces split_pieces(const GqaParams& p, const CtaRows& cta) {
  const long long unit =
      (static_cast<long long>(cta.request) * p.num_kv_heads + cta.kv_head) * cta.row_blocks + cta.row_block;
  return SplitPieces{p.num_splits, cta.split, unit};
}

template <class T>
__device__ __forceinline__ void finish_cta(const GqaParams& p, unsigned char* smem, const CtaRows& cta,
                                           float v_scale) {
  const SplitPieces pieces = split_pieces(p, cta);
  constexpr int D = T::kHeadDim;
  constexpr int kBeams = T::kBeamWidth;
  const int tid = threadIdx.x;
  const int row0 = cta.row0;
  const int rows_total = cta.rows_total;
  const int kv_head = cta.kv_head;
  auto row_batch = [&](int row) { return kBeams == 1 ? cta.batch : cta.batch + row / cta.rows_per_beam; };
  auto row_tok = [&](int row) { return (kBeams == 1 ? row : row % cta.rows_per_beam) / T::kGroup; };
  const MergeArea<T> area(smem);
  float* merge_o = area.o;
  float* merge_ml = area.ml;
  float* row_m = area.row_m;
  float* row_l = area.row_l;
  float* row_w = area.row_w;
  const int rows_here = rows_total - row0 < T::kRows ? rows_total - row0 : T::kRows;
  // Per row: the CTA's max and sum over its warps, and each warp's weight.
  for (int r = tid; r < rows_here; r += T::kThreads) {
    float m = kNegInf;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) m = fmaxf(m, merge_ml[(w * T::kRows + r) * 2]);
    const float m_use = m == kNegInf ? 0.f : m;  // empty row: weights 0, not NaN
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) {
      const float wt = ptx::ex2(merge_ml[(w * T::kRows + r) * 2] - m_use);
      row_w[r * T::kWarpsN + w] = wt;
      l += merge_ml[(w * T::kRows + r) * 2 + 1] * wt;
    }
    row_m[r] = m;
    row_l[r] = l;
  }
  __syncthreads();
  // Programmatic dependent launch: the next grid in the stream may start placing its CTAs once
  // every CTA of this one has come here or exited. Not before the main loop ends: the next
  // grid's CTAs hold shared memory and registers from then on, and the next kernel need not be a
  // decode whose first act is its wait (an o-projection GEMM may stream its weights before its
  // wait, competing with this grid's cache reads). From here on this grid is latency-bound (the
  // output writes, the split publish, the last CTA's merge, the grid's completion), which the
  // next launch and its set-up then overlap; right after this barrier, so that the compiler
  // schedules the code around it as without it. The next grid's griddepcontrol.wait still waits
  // for every write of this one.
  ptx::griddep_launch_dependents();
  auto cta_o = [&](int r, int d) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < T::kWarpsN; ++w) acc += merge_o[(w * T::kRows + r) * D + d] * row_w[r * T::kWarpsN + w];
    return acc;
  };

  // Output element: real value = o * v_scale / (l + the sink's share), then the output dtype.
  auto store_out = [&](int r, int d, float val) {
    const int row = row0 + r;
    const int tok = row_tok(row);
    const int head = kv_head * T::kGroup + row % T::kGroup;
    const long long off = row_batch(row) * p.out_stride_batch + tok * p.out_stride_token +
                          head * p.out_stride_head + d;
    if constexpr (T::kOutDtype == kv::kFP8) {
      static_cast<unsigned char*>(p.out)[off] = ptx::float_to_fp8_bits(val / p.out_scale);
    } else if constexpr (T::kOutDtype == kv::kFP16) {
      static_cast<unsigned short*>(p.out)[off] = ptx::float_to_fp16_bits(val);
    } else {
      static_cast<unsigned short*>(p.out)[off] = ptx::float_to_bf16_bits(val);
    }
  };
  // 1 / denominator (with the sink) times v_scale, for row r with max m and sum l; writes LSE.
  auto finish_row = [&](int r, float m, float l) {
    const int row = row0 + r;
    const int tok = row_tok(row);
    const int head = kv_head * T::kGroup + row % T::kGroup;
    float denom = l;
    if (p.sinks) denom += ptx::ex2(p.sinks[head] * kLog2e - (m == kNegInf ? 0.f : m));
    if (p.lse) {
      p.lse[row_batch(row) * p.lse_stride_batch + tok * p.lse_stride_token + head * p.lse_stride_head] =
          l > 0.f ? (m + ptx::lg2(l)) * kLn2 : kNegInf;
    }
    return denom > 0.f ? v_scale / denom : 0.f;
  };

  if (pieces.count <= 1) {
    for (int r = tid; r < rows_here; r += T::kThreads) row_l[r] = finish_row(r, row_m[r], row_l[r]);
    __syncthreads();
    for (int i = tid; i < rows_here * D; i += T::kThreads) {
      const int r = i / D, d = i % D;
      store_out(r, d, cta_o(r, d) * row_l[r]);
    }
    stamp_all(kStampOut);  // the stamp build only (stamps.cuh): every thread's stores issued
    return;
  }

  // ---- Split: publish this piece's partial result (o unnormalised, relative to m) ----
  auto slot_o = [&](int j) { return p.ws_partial_o + pieces.slot(j) * T::kRows * D; };
  auto slot_ml = [&](int j) { return p.ws_partial_ml + pieces.slot(j) * T::kRows * 2; };
  float* own_o = slot_o(pieces.index);
  float* own_ml = slot_ml(pieces.index);
  for (int i = tid; i < rows_here * D; i += T::kThreads) {
    const int r = i / D, d = i % D;
    if (row_l[r] > 0.f) own_o[r * D + d] = cta_o(r, d);  // empty: never read
  }
  for (int r = tid; r < rows_here; r += T::kThreads) {
    own_ml[r * 2] = row_m[r];
    own_ml[r * 2 + 1] = row_l[r];
  }
  // One fence per CTA, not one per thread: the barrier puts every thread's partial stores before
  // thread 0's arrival in causality order, and the arrival (atom.acq_rel.gpu) is the release that
  // makes them visible to the CTA whose arrival reads its count or a later one (the arrivals form
  // one chain of atomics on the counter: observation order). In the last CTA the same atomic is the
  // acquire of every other piece's release, and the barrier after it orders the other threads'
  // reads of their partials after it (PTX ISA, Memory Consistency Model: "Memory
  // synchronization", "Causality order", the "Causality" axiom; ptx.cuh).
  __syncthreads();
  __shared__ unsigned is_last;
  if (tid == 0) {
    const unsigned prev = ptx::atom_add_acq_rel_gpu(p.ws_counters + pieces.unit, 1u);
    is_last = prev == static_cast<unsigned>(pieces.count - 1);
    if (is_last) p.ws_counters[pieces.unit] = 0u;  // ready for the next launch: no memset between calls
  }
  __syncthreads();
  stamp(kStampOut);  // the stamp build only: the partial published, the arrival counted
  if (!is_last) return;

  // ---- The last CTA merges every split, in split order (bitwise reproducible) ----
  const int ns = pieces.count;
  // a + sum of w[j] * (split c0 + j's quad d of row r) over j < k, in j order. The merge runs on
  // one CTA while the rest of the GPU may be done: its latency is the launch's tail, so eight
  // splits' loads are in flight at a time instead of one (an empty split's partial was never
  // written: weight 0, not read).
  constexpr int kInFlight = 8;
  auto weighted_sum = [&](float4 a, const float* w, int c0, int k, int r, int d) {
    for (int j0 = 0; j0 < k; j0 += kInFlight) {
      float wj[kInFlight];
      float4 o[kInFlight];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        wj[j] = j0 + j < k ? w[j0 + j] : 0.f;
        o[j] = wj[j] != 0.f ? __ldcg(reinterpret_cast<const float4*>(slot_o(c0 + j0 + j) + r * D + d))
                            : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        if (wj[j] != 0.f) a.x += wj[j] * o[j].x, a.y += wj[j] * o[j].y, a.z += wj[j] * o[j].z, a.w += wj[j] * o[j].w;
      }
    }
    return a;
  };
  // Stage (m, l) of all pieces in shared memory, turn them into weights per row, then stream
  // the partial outputs with independent 16-byte loads.
  float* split_w = reinterpret_cast<float*>(smem);  // [kRows][ns]: weight of piece s for row r
  float* split_l = split_w + T::kRows * ns;         // [kRows][ns]
  for (int i = tid; i < rows_here * ns; i += T::kThreads) {
    const int r = i / ns, sp = i % ns;
    split_w[i] = __ldcg(slot_ml(sp) + r * 2);
    split_l[i] = __ldcg(slot_ml(sp) + r * 2 + 1);
  }
  __syncthreads();
  for (int r = tid; r < rows_here; r += T::kThreads) {
    float m = kNegInf;
    for (int sp = 0; sp < ns; ++sp) m = fmaxf(m, split_w[r * ns + sp]);
    const float m_use = m == kNegInf ? 0.f : m;
    float l = 0.f;
    for (int sp = 0; sp < ns; ++sp) {
      const float ls = split_l[r * ns + sp];
      const float w = ls > 0.f ? ptx::ex2(split_w[r * ns + sp] - m_use) : 0.f;
      split_w[r * ns + sp] = w;
      l += ls * w;
    }
    const float inv = finish_row(r, m, l);
    for (int sp = 0; sp < ns; ++sp) split_w[r * ns + sp] *= inv;
  }
  __syncthreads();
  stamp(kStampMergeWeights);
  for (int i = tid; i < rows_here * (D / 4); i += T::kThreads) {
    const int r = i / (D / 4), d = (i % (D / 4)) * 4;
    const float4 acc = weighted_sum(make_float4(0.f, 0.f, 0.f, 0.f), split_w + r * ns, 0, ns, r, d);
    store_out(r, d, acc.x);
    store_out(r, d + 1, acc.y);
    store_out(r, d + 2, acc.z);
    store_out(r, d + 3, acc.w);
  }
  stamp_all(kStampMergeEnd);
}

}  // namespace deca::gqa
