// MLA dense decode on the GPU: the sparse run's scheduler, partitions and combine
// (src/cuda/mla_run.hpp) with the block table as the decode kernel's token source. A dense run
// is a sparse run whose "index" j of request r is its cached token j: the scheduler cuts the
// requests by their cache lengths (topk_length = cache_seqlens, capped at max_seq_len), so a
// small batch or one long request is spread over every SM partition like a sparse one.
#include <string>

#include "cuda/backend.hpp"
#include "cuda/mla_run.hpp"
#include "cuda/mla_spec.hpp"
#include "deca/error.hpp"
#include "kernels/mla/schedule/work.cuh"

namespace deca::cuda {

void plan_mla_dense(MlaPlan& plan) { plan_mla_run(plan); }

void mla_dense_decode(const MlaPlan& plan, const MlaDenseParams& d, void* workspace, void* stream,
                      bool reuse_schedule) {
  constexpr const char* fn = "mla_decode_dense";
  const int format = mla_kv_format(plan.config);
  if (d.kv_format != format) {
    // src/api/ checks the cache against the plan first; a mismatch here would read the records
    // in another layout than the kernel was compiled for.
    throw Error(std::string(fn) + ": kv_cache: expected the plan's format (MlaKvFormat " +
                std::to_string(format) + "), got MlaKvFormat " + std::to_string(d.kv_format));
  }
  mla::DecodeKernelParams kp{};
  MlaSparseParams& p = kp.p;
  p.batch = d.batch;
  p.q_len = d.q_len;
  p.num_heads = d.num_heads;
  p.page_size = d.page_size;
  p.topk = plan.config.max_seq_len;
  p.num_blocks = d.num_blocks;
  p.q = d.q;
  p.q_stride_batch = d.q_stride_batch;
  p.q_stride_token = d.q_stride_token;
  p.q_stride_head = d.q_stride_head;
  // The kernels address the cache in bytes; MlaDenseParams counts elements of the stored dtype.
  const long long element_bytes = d.kv_format == kMlaKvBF16 ? 2 : 1;
  p.kv = static_cast<const unsigned char*>(d.kv);
  p.kv_stride_block = d.kv_stride_block * element_bytes;
  p.kv_stride_slot = d.kv_stride_slot * element_bytes;
  p.indices = nullptr;
  p.topk_length = d.seq_lens;
  p.attn_sink = nullptr;
  p.out = d.out;
  p.out_stride_batch = d.out_stride_batch;
  p.out_stride_token = d.out_stride_token;
  p.out_stride_head = d.out_stride_head;
  p.lse = d.lse;
  p.lse_stride_batch = d.lse_stride_batch;
  p.lse_stride_token = d.lse_stride_token;
  p.lse_stride_head = d.lse_stride_head;
  p.softmax_scale = d.softmax_scale;
  kp.dense.block_table = d.block_table;
  kp.dense.block_table_stride = d.block_table_stride;
  kp.dense.max_blocks = d.max_blocks;
  kp.dense.kv_format = d.kv_format;
  kp.dense.kv_scale = d.kv_format == kMlaKvFP8E4M3 ? d.kv_scale : 1.f;
  // The combine always runs: with the lengths in device memory the schedule may cut any request.
  run_mla_decode(plan, kp, workspace, stream, reuse_schedule, /*combine=*/true, fn);
}

}  // namespace deca::cuda
