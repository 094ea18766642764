// GqaParams: the one plain struct that both the CPU reference (src/cpu/) and the GPU kernels
// (kernels/gqa/) read. Built from validated GqaDecodeArgs by src/api/. No includes: it is
// compiled by the host compiler, nvcc and NVRTC alike. Strides are in elements; the last
// (head_dim) dimension of every tensor is contiguous.
#pragma once

namespace deca {

struct GqaParams {
  // Sizes.
  int batch;         // requests * beam_width
  int q_len;         // new tokens per request (>1: speculative decoding)
  int num_q_heads;
  int num_kv_heads;
  int head_dim;
  int page_size;
  int max_pages;     // columns of page_table
  int num_pages;     // pages in the pool (page ids are < num_pages)
  int beam_width;    // beams of one request are adjacent batch entries

  // DType values (deca::DType); the GPU kernels have them as compile-time constants instead.
  int q_dtype;
  int kv_dtype;
  int out_dtype;

  const void* q;               // [batch, q_len, num_q_heads, head_dim]
  long long q_stride_batch;
  long long q_stride_token;
  long long q_stride_head;

  // Cache element (page, slot, kv_head, d) lives at cache + page * stride_page
  // + slot * stride_slot + kv_head * stride_head + d: NHD and HND are just two stride orders.
  const void* k_cache;
  long long k_stride_page;
  long long k_stride_slot;
  long long k_stride_head;
  const void* v_cache;
  long long v_stride_page;
  long long v_stride_slot;
  long long v_stride_head;

  const int* page_table;       // [batch, max_pages]
  long long page_table_stride;
  const int* seq_lens;         // [batch]

  void* out;                   // [batch, q_len, num_q_heads, head_dim]
  long long out_stride_batch;
  long long out_stride_token;
  long long out_stride_head;

  float* lse;                  // [batch, q_len, num_q_heads], may be null
  long long lse_stride_batch;
  long long lse_stride_token;
  long long lse_stride_head;

  const unsigned* tree_mask;   // [batch, q_len, ceil(q_len / 32)], may be null
  long long mask_stride_batch;
  long long mask_stride_token;

  const float* sinks;          // [num_q_heads] logits, may be null
  const float* k_scales;       // [num_kv_heads], may be null (then k_scale)
  const float* v_scales;       // [num_kv_heads], may be null (then v_scale)
  float k_scale;
  float v_scale;

  float softmax_scale;         // applied to q.k before the soft-cap
  float softcap;               // 0 = off
  float out_scale;             // fp8 output stores real / out_scale
  int window;                  // 0 = off; else key t visible to query at p iff t > p - window

  // Split-KV (GPU only). split_tokens > 0: split s covers keys [s * split_tokens, ...) of the
  // visible range; 0: the visible range is divided evenly (tile aligned) into num_splits parts.
  int num_splits;
  int split_tokens;
  float* ws_partial_o;         // [batch, num_kv_heads, num_splits, rows, head_dim]
  float* ws_partial_ml;        // [batch, num_kv_heads, num_splits, rows, 2] (max, sum)
  unsigned* ws_counters;       // [batch, num_kv_heads]: arrivals; the last CTA resets it to 0

  // Checked mode (Cfg::kChecked, kernels/common/check_record.cuh); unchecked kernels never read
  // these. Set by the backend with the workspace (carve_gqa_workspace).
  int max_seq_len;             // the plan's promise: a longer seq_lens entry is reported
  void* check;                 // the CheckRecord in the workspace's last bytes

  // Skip-softmax (GqaConfig::skip_softmax_factor; 0 = off). Read only by the "_skip" kernels
  // (Cfg::kSkip) and, when > 0, by the CPU reference.
  float skip_softmax_factor;
  // Measurement (deca-bench --skip-softmax, the GPU tests; the public API leaves it null): when
  // set, each "_skip" CTA adds to [0] the V rows (tokens) it copied and to [1] the V rows the
  // exact kernel would have copied for the same keys.
  unsigned long long* skip_counts;
  // Fused decode step (GqaConfig::rope_style; the kernels: Cfg::kRopeStyle). q is then before
  // rotary embedding; k_new / v_new are this step's keys / values in q's dtype, written to the
  // cache at position seq_lens[b] - q_len + i. Null k_new: a plain decode.
  int rope_style;              // deca::RopeStyle value (0 = none)
  int rotary_dim;
  const void* k_new;           // [batch, q_len, num_kv_heads, head_dim]
  long long k_new_stride_batch;
  long long k_new_stride_token;
  long long k_new_stride_head;
  const void* v_new;
  long long v_new_stride_batch;
  long long v_new_stride_token;
  long long v_new_stride_head;
  const void* cos_sin;         // [max_position, rotary_dim]: cos then sin
  long long cos_sin_stride;
  int cos_sin_dtype;           // deca::DType value: fp32 | bf16 | fp16
  int max_position;
  const int* positions;        // [batch, q_len], may be null (then seq_lens[b] - q_len + i)
  long long positions_stride_batch;
};

}  // namespace deca
