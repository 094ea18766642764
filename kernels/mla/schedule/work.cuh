// MLA sparse decode on the GPU: how the work is split, and what every sparse decode kernel reads
// besides MlaSparseParams. This is the contract between the scheduler, the decode kernels (the
// portable one and the sm90a warp-specialized one) and the combine kernel. Plain structs only
// (host compiler, nvcc and NVRTC alike).
//
// Units of work. Request r lists len(r) indices per query token (len = topk, or
// min(max(topk_length[r], 0), topk) when topk_length is given); they are processed in blocks of
// kTopkBlock = 64 indices, n(r) = ceil(len(r) / 64) blocks (0 for an empty request). A request
// costs n(r) + kFixedOverheadBlocks units (loading q, softmax state, the write-back): the
// scheduler walks the requests in order and fills num_parts SM partitions with about
// ceil(sum of costs / num_parts) + kFixedOverheadBlocks units each, cutting a request between two
// partitions where a partition fills (FlashMLA's scheme, seed 001 step 3). MODEL1's second cache
// (MlaSparseParams::extra_*) appends its blocks to the request's list: n(r) = ceil(len(r) / 64) +
// ceil(extra_len(r) / 64), every block from one cache (TopkLists, schedule.cuh).
//
// Splits. A request whose blocks all sit in one partition is unsplit: that partition writes its
// final bf16 output and LSE (the attention sink applied). A request cut into k pieces has k
// split slots, split_offsets[r] .. split_offsets[r + 1] - 1 (every request owns at least one slot,
// so the slot count is at most batch + num_parts); piece j writes its normalised partial output
// (fp32, O / l of its own keys) and its natural-log LSE (-inf when it saw no valid key) to slot
// split_offsets[r] + j, and the combine kernel merges the pieces by LSE (and the sink).
// An empty request (n(r) = 0) still gets one partition, which writes zeros and LSE = -inf.
//
// Grid of a decode kernel: x = head blocks of 64 heads (num_heads padded inside; a cluster of 2
// along x may share dequantized tokens), y = query token (q_len), z = partition.
//
// kernels/mla/schedule/schedule.cuh fills this (schedule_requests) and has the readers' helpers: a
// request's length and block count, a piece's blocks and its slot.
#pragma once

#include "kernels/common/check_record.cuh"
#include "kernels/mla/params.cuh"

namespace deca::mla {

inline constexpr int kTopkBlock = 64;
inline constexpr int kFixedOverheadBlocks = 5;

// One SM partition's work: requests begin_req..end_req (inclusive); blocks [begin_block, n) of
// begin_req, every block of the requests between, and blocks [0, end_block) of end_req (when
// begin_req == end_req: blocks [begin_block, end_block)). begin_req > end_req: nothing to do.
struct SparsePart {
  int begin_req;
  int begin_block;
  int end_req;
  int end_block;
  int begin_split;  // the slot of begin_req's piece in this partition (a global slot index)
  int begin_split_count;  // how many pieces begin_req has in all (1 = unsplit)
  int end_split_count;    // how many pieces end_req has in all (1 = unsplit)
  int pad;
};

// The call shape a schedule was made for, written by the scheduler beside its output. A run that
// reuses the workspace's schedule (MlaSparseArgs::reuse_schedule: the other layers of a decode
// step) has its decode and combine kernels compare it with their own call first: on a mismatch
// the decode kernel writes nothing and the combine kernel fills out and lse with NaN, so that a
// schedule of another shape can neither send a partition past this call's tensors nor pass
// unnoticed. (Equal shapes with other topk_length contents are the caller's contract, as the
// contents of indices are.)
// MODEL1's extra cache adds its extra_topk and whether extra_topk_length was given (0 for one
// cache: the one-cache kernels neither write nor compare them).
struct ScheduleStamp {
  int batch;
  int q_len;
  int topk;
  int num_parts;
  int has_topk_length;
  int extra_topk;
  int has_extra_topk_length;
  int pad;
};

// What the decode and combine kernels read besides MlaSparseParams (all in the workspace).
struct SparseRun {
  const SparsePart* parts;   // [num_parts]
  const int* split_offsets;  // [batch + 1]: slots of request r are [split_offsets[r], split_offsets[r + 1])
  float* partial_o;          // [slots, q_len, num_heads, 512] fp32, normalised per piece
  float* partial_lse;        // [slots, q_len, num_heads] fp32, natural log, -inf = no valid key
  int num_parts;
  int max_slots;             // capacity of partial_o / partial_lse in slots (checked by the scheduler)
  // Checked decode kernels only (kernels/common/check_record.cuh): the CheckRecord in the
  // workspace's last bytes; null for unchecked plans.
  void* check;
  ScheduleStamp* stamp;  // written by the scheduler, compared by the readers (schedule_matches)
};

// The stamp of a call: what the scheduler writes (schedule_matches compares the same fields).
// kExtra: the MODEL1 kernels' (both caches' lists).
template <bool kExtra = false>
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__host__ __device__
#endif
inline ScheduleStamp schedule_stamp(const MlaSparseParams& p, int num_parts) {
  ScheduleStamp s{};
  s.batch = p.batch;
  s.q_len = p.q_len;
  s.topk = p.topk;
  s.num_parts = num_parts;
  s.has_topk_length = p.topk_length != nullptr ? 1 : 0;
  if constexpr (kExtra) {
    s.extra_topk = p.extra_topk;
    s.has_extra_topk_length = p.extra_topk_length != nullptr ? 1 : 0;
  }
  return s;
}

// Whether the workspace's schedule was made for this call (see ScheduleStamp).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
template <bool kExtra = false>
__device__ __forceinline__ bool schedule_matches(const MlaSparseParams& p, const SparseRun& run) {
  const ScheduleStamp s = *run.stamp;
  const bool one = s.batch == p.batch && s.q_len == p.q_len && s.topk == p.topk &&
                   s.num_parts == run.num_parts && s.has_topk_length == (p.topk_length != nullptr ? 1 : 0);
  if constexpr (kExtra) {
    return one && s.extra_topk == p.extra_topk &&
           s.has_extra_topk_length == (p.extra_topk_length != nullptr ? 1 : 0);
  }
  return one;
}

// A checked decode kernel's record of a schedule that schedule_matches refused: what the
// workspace held (kCheckSchedule), by one thread of the grid.
__device__ __forceinline__ void report_schedule_mismatch(const SparseRun& run) {
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0) {
    const ScheduleStamp st = *run.stamp;
    check_report(static_cast<CheckRecord*>(run.check), kCheckSchedule, st.batch, st.q_len, st.topk, st.num_parts,
                 st.has_topk_length);
  }
}

// What a decode kernel writes instead of attention when the schedule is another call shape's:
// NaN in every output value and LSE of heads head0 .. head0 + rows - 1 of query token `tok`, for
// requests first, first + stride, ... (the CTAs of the grid's z share the requests). The combine
// kernel writes the same when it runs; the backend leaves it out when no request is cut, so the
// decode kernels must not rely on it for this.
__device__ __noinline__ void fill_nan_outputs(const MlaSparseParams& p, int head0, int rows, int tok, int first,
                                        int stride) {
  const int heads = p.num_heads - head0 < rows ? p.num_heads - head0 : rows;
  const uint2 nan2 = make_uint2(0x7FC07FC0u, 0x7FC07FC0u);  // bf16 NaN pairs
  for (int r = first; r < p.batch; r += stride) {
    // 128 eight-byte units per head row of 512 bf16.
    for (int e = static_cast<int>(threadIdx.x); e < heads * 128; e += static_cast<int>(blockDim.x)) {
      auto* out = static_cast<unsigned short*>(p.out) + r * p.out_stride_batch + tok * p.out_stride_token +
                  (head0 + e / 128) * p.out_stride_head + 4 * (e % 128);
      *reinterpret_cast<uint2*>(out) = nan2;
    }
    if (p.lse != nullptr) {
      for (int h = static_cast<int>(threadIdx.x); h < heads; h += static_cast<int>(blockDim.x)) {
        p.lse[r * p.lse_stride_batch + tok * p.lse_stride_token + (head0 + h) * p.lse_stride_head] =
            __int_as_float(0x7FC00000);
      }
    }
  }
}
#endif

// Dense decode on the GPU reads its tokens through a block table. Its kernels take the same
// MlaSparseParams as sparse decode, filled from MlaDenseParams with indices = nullptr, topk = the
// plan's max_seq_len (the cap on a request's length), topk_length = seq_lens and attn_sink =
// nullptr, so that the scheduler, the walk over a partition and the combine are the sparse ones:
// "index" j of request r is its token j, id block_table[r][j / page_size] * page_size +
// j % page_size, visible to query token i iff j < len(r) - (q_len - 1 - i) (causal among the
// new tokens). The kv strides are bytes, as for the sparse cache.
struct DenseSource {
  const int* block_table;  // [batch, max_blocks] int32; null for sparse decode
  long long block_table_stride;
  int max_blocks;
  int kv_format;   // MlaKvFormat
  float kv_scale;  // kMlaKvFP8E4M3: real = stored * kv_scale
  // The TMA rows' kernels (kernels/mla/sm90/rows.cuh, Cfg::kTma): 1 when their second parameter
  // holds the cache's tensor map, 0 when the cache's address or strides admit none (the kernel
  // then takes the register producers). Read by no other kernel.
  int use_map;
};

// The one parameter of every MLA decode kernel entry (passed as const __grid_constant__). `dense`
// comes last so that the sparse kernels' parameter offsets do not depend on it.
struct DecodeKernelParams {
  MlaSparseParams p;
  SparseRun run;
  DenseSource dense;
};

// A CUtensorMap (cuda.h: 128 bytes, 128-byte aligned; the copy unit needs 64), opaque to the
// kernels: encoded on the host by the driver (src/cuda/mla_tma.cpp), read by the copy unit from
// the second kernel parameter of the TMA rows' kernels (kernels/mla/sm90/entry.cuh). A separate
// parameter, not a field of DecodeKernelParams: its alignment would move every kernel's
// parameter, and with it the constant-bank offsets of their machine code.
struct alignas(128) TensorMapBytes {
  unsigned long long words[16];
};

}  // namespace deca::mla
