// The end of a GQA decode CTA, shared by the portable kernel (decode.cuh) and the Hopper one
// (sm90/decode.cuh): the CTA's warps (or warpgroups) have left their partial rows in shared memory
// (MergeArea); this merges them per row, then writes the output and LSE, or, when the unit is cut
// into splits (split-KV), publishes the split's partial result, and the last split of the unit to
// arrive merges every split in a fixed order (bitwise reproducible, whatever the arrival order and
// whatever else is in the batch). Needs of T: kHeadDim, kRows, kWarpsN, kThreads, kGroup,
// kOutDtype, kBeamWidth, kMergeQuads.
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

// (m, l) of every split of the unit's rows into split_ml[r * count + j], all loads of a thread
// issued before its stores (a split's rows are adjacent in the workspace: the loads coalesce).
template <class T>
__device__ __forceinline__ void stage_split_ml(const GqaParams& p, const SplitPieces& pieces, int rows_here,
                                               float2* split_ml) {
  constexpr int kBatch = 8;
  const int n = rows_here * pieces.count;
  for (int i0 = threadIdx.x; i0 < n; i0 += kBatch * T::kThreads) {
    float2 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * T::kThreads;
      if (i < n) {
        const float* ml = p.ws_partial_ml + pieces.slot(i / rows_here) * T::kRows * 2;
        v[k] = __ldcg(reinterpret_cast<const float2*>(ml) + i % rows_here);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * T::kThreads;
      if (i < n) split_ml[(i % rows_here) * pieces.count + i / rows_here] = v[k];
    }
  }
}

// Output quads (r[u], d[u]), u < T::kMergeQuads (one with have[u] false gets weights 0: nothing
// read): splits first, first + step, ... < ns of each, weighted (weights in split_ml[r * ns + j].x)
// and summed in that order, eight splits of every quad in flight at a time (8 or 16 loads: one L2
// trip). The weights first, then every load, then the sums, so the loads leave together whatever
// the adds' predicates. An empty split's partial was never written: weight 0, not read (its term
// adds 0 x 0).
template <class T>
__device__ __forceinline__ void weighted_quads(const GqaParams& p, const SplitPieces& pieces, const float2* split_ml,
                                               int ns, const int (&r)[T::kMergeQuads], const int (&d)[T::kMergeQuads],
                                               const bool (&have)[T::kMergeQuads], int first, int step,
                                               float4 (&acc)[T::kMergeQuads]) {
  constexpr int kQuads = T::kMergeQuads;
  constexpr int kSplits = 8;
  const long long split_floats = static_cast<long long>(T::kRows) * T::kHeadDim;
#pragma unroll
  for (int u = 0; u < kQuads; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int j0 = first; j0 < ns; j0 += kSplits * step) {
    float w[kQuads][kSplits];
    float4 o[kQuads][kSplits];
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
#pragma unroll
      for (int k = 0; k < kSplits; ++k) {
        const int j = j0 + k * step;
        w[u][k] = have[u] && j < ns ? split_ml[r[u] * ns + j].x : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
#pragma unroll
      for (int k = 0; k < kSplits; ++k) {
        const float* from = p.ws_partial_o + pieces.slot(j0 + k * step) * split_floats + r[u] * T::kHeadDim + d[u];
        o[u][k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (w[u][k] != 0.f) o[u][k] = __ldcg(reinterpret_cast<const float4*>(from));
      }
    }
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
#pragma unroll
      for (int k = 0; k < kSplits; ++k) {
        acc[u].x += w[u][k] * o[u][k].x, acc[u].y += w[u][k] * o[u][k].y;
        acc[u].z += w[u][k] * o[u][k].z, acc[u].w += w[u][k] * o[u][k].w;
      }
    }
  }
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

  // ---- The last CTA merges every split, in a fixed order (bitwise reproducible) ----
  // It runs on one CTA while the rest of the GPU may be done: its latency is the launch's tail, so
  // no step is serial in the split count where it need not be. The weights: (m, l) of every
  // piece staged at once, then a group of lanes per row with the splits on its lanes. The outputs:
  // a thread per kMergeQuads output quads with eight partials of each in flight (weighted_quads),
  // and where the rows' quads leave threads idle, the splits of a quad are shared by adjacent
  // lanes whose sums meet by shuffles. (Partials copied by cp.async into shared-memory slots, up
  // to 64 in flight a round, were slower: docs/perf-notes.md, "The split merge, parallel".)
  const int ns = pieces.count;
  float2* split_ml = reinterpret_cast<float2*>(smem);  // [kRows][ns]: (m, l), then (weight, l)
  stage_split_ml<T>(p, pieces, rows_here, split_ml);
  __syncthreads();
  {
    // The lane from %laneid, read here (volatile): derived from tid, the compiler may share it
    // with the main loop's warp and lane indices and keep them live across the loop.
    int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    // A group of g lanes per row (a power of two covering the splits, up to the warp): at 8
    // splits four rows share a warp and their reductions take three shuffles, not five.
    int g = 1;
    while (g < 32 && g < ns) g *= 2;
    const int sub = lane & (g - 1);
    const int rows_per_pass = T::kThreads / g;
    // Every lane runs every pass (the shuffles take the whole warp); a lane past the rows holds
    // m = -inf, l = 0 and touches nothing.
    for (int r0 = (tid - lane) / g; r0 < rows_here; r0 += rows_per_pass) {
      const int r = r0 + lane / g;
      const bool live = r < rows_here;
      float2* ml = split_ml + (live ? r : 0) * ns;
      float m = kNegInf;
      if (live) {
        for (int sp = sub; sp < ns; sp += g) m = fmaxf(m, ml[sp].x);
      }
      for (int o = g / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const float m_use = m == kNegInf ? 0.f : m;  // every split empty: weights 0, not NaN
      float l = 0.f;
      if (live) {
        for (int sp = sub; sp < ns; sp += g) {
          const float ls = ml[sp].y;
          const float w = ls > 0.f ? ptx::ex2(ml[sp].x - m_use) : 0.f;
          ml[sp].x = w;
          l += ls * w;
        }
      }
      // A butterfly: both lanes of a pair add the same two values, so every lane of the group
      // ends with the same bits whatever the order the warp's lanes run in.
      for (int o = g / 2; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);
      float inv = 0.f;
      if (live && sub == 0) inv = finish_row(r, m, l);
      inv = __shfl_sync(0xffffffffu, inv, lane - sub);
      if (live) {
        for (int sp = sub; sp < ns; sp += g) ml[sp].x *= inv;
      }
    }
  }
  __syncthreads();
  stamp(kStampMergeWeights);
  const int quads = rows_here * (D / 4);
  // Lanes per quad: a power of two up to 32 while twice the quads times it fit the CTA's threads.
  int lanes = 1;
  while (lanes < 32 && 2 * lanes * quads <= T::kThreads) lanes *= 2;
  // Lanes 1: quads tid, tid + kThreads, ... (kMergeQuads of them), then on by kMergeQuads x
  // kThreads. Else one pass for every thread (the shuffles need the whole warp; lanes x quads <=
  // kThreads / 2, so no thread has a second quad): quad tid / lanes, past `quads` for the idle ones.
  constexpr int kQuads = T::kMergeQuads;
  const int sub = tid % lanes;
  const int q_step = T::kThreads / lanes;
  for (int q = tid / lanes; q < quads || (lanes > 1 && q < q_step); q += kQuads * q_step) {
    int r[kQuads], d[kQuads];
    bool have[kQuads];
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int qu = q + u * q_step;
      have[u] = qu < quads;
      r[u] = have[u] ? qu / (D / 4) : 0;
      d[u] = have[u] ? (qu % (D / 4)) * 4 : 0;
    }
    float4 acc[kQuads];
    weighted_quads<T>(p, pieces, split_ml, ns, r, d, have, sub, lanes, acc);
    for (int o = lanes / 2; o > 0; o /= 2) {
      acc[0].x += __shfl_xor_sync(0xffffffffu, acc[0].x, o);
      acc[0].y += __shfl_xor_sync(0xffffffffu, acc[0].y, o);
      acc[0].z += __shfl_xor_sync(0xffffffffu, acc[0].z, o);
      acc[0].w += __shfl_xor_sync(0xffffffffu, acc[0].w, o);
    }
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      if (sub == 0 && have[u]) {
        store_out(r[u], d[u], acc[u].x);
        store_out(r[u], d[u] + 1, acc[u].y);
        store_out(r[u], d[u] + 2, acc[u].z);
        store_out(r[u], d[u] + 3, acc[u].w);
      }
    }
  }
  stamp_all(kStampMergeEnd);
}

}  // namespace deca::gqa
