// Plain params structs for MLA decode and the split-KV combine, read by the CPU reference and
// the GPU kernels alike. No includes (host compiler, nvcc and NVRTC). Strides in elements of the
// tensor's own dtype; the last dimension of every tensor is contiguous.
#pragma once

namespace deca {

// How a cache stores a token's 576 dims (V = the first 512). Dense decode reads any of them
// through a block table; sparse decode reads the 656-byte FP8 token through top-k indices.
enum MlaKvFormat : int {
  kMlaKvBF16 = 0,       // 576 bf16 (1152 bytes)
  kMlaKvFP8E4M3 = 1,    // 576 e4m3 (576 bytes), real = stored * kv_scale (one scale per cache)
  kMlaKvFP8Sparse = 2,  // 656 bytes: 512 e4m3, 4 fp32 scales (one per 128 values), 64 bf16 RoPE
  // DeepSeek V4 (MODEL1), sparse only, d_qk 512 = d_v (448 NoPE + 64 RoPE; V is the whole row).
  // 584 bytes a token, laid out per page: every token's 576-byte row (448 e4m3, then 64 bf16
  // RoPE values) at slot * 576, then at page_size * 576 + slot * 8 its 7 ue8m0 scales (one per
  // 64 NoPE values, real = stored * 2^(byte - 127)) and a pad byte; the page padded to a
  // multiple of 576 bytes (kv_stride_block). The tensor is [blocks, page_size, 1, 584] over it.
  kMlaKvModel1 = 3,
};

// What a row without a valid key gets as its final LSE (MlaConfig::lse_of_empty_row).
enum MlaLseEmpty : int {
  kMlaLseEmptyNegInf = 0,  // -inf: the log of an empty sum (deca's convention)
  kMlaLseEmptyPosInf = 1,  // +inf: FlashMLA's convention
};

struct MlaDenseParams {
  int batch;
  int q_len;
  int num_heads;
  int page_size;
  int max_blocks;        // columns of block_table
  int num_blocks;        // blocks in the pool

  const void* q;         // [batch, q_len, num_heads, 576] bf16
  long long q_stride_batch;
  long long q_stride_token;
  long long q_stride_head;
  const void* kv;        // [num_blocks, page_size, 1, 576] bf16 | e4m3, or [.., 656] bytes (kv_format)
  long long kv_stride_block;  // elements of the stored dtype (bytes for the 8-bit formats)
  long long kv_stride_slot;
  int kv_format;         // MlaKvFormat
  float kv_scale;        // kMlaKvFP8E4M3: real = stored * kv_scale; 1 otherwise
  const int* block_table;  // [batch, max_blocks]
  long long block_table_stride;
  const int* seq_lens;   // [batch]

  void* out;             // [batch, q_len, num_heads, 512] bf16
  long long out_stride_batch;
  long long out_stride_token;
  long long out_stride_head;
  float* lse;            // [batch, q_len, num_heads], may be null
  long long lse_stride_batch;
  long long lse_stride_token;
  long long lse_stride_head;

  float softmax_scale;
  int lse_empty;         // MlaLseEmpty, as MlaSparseParams::lse_empty
};

struct MlaSparseParams {
  int batch;
  int q_len;
  int num_heads;
  int page_size;
  int topk;
  int num_blocks;

  const void* q;         // [batch, q_len, num_heads, 576] bf16
  long long q_stride_batch;
  long long q_stride_token;
  long long q_stride_head;
  const unsigned char* kv;  // [num_blocks, page_size, 1, 656] bytes
  long long kv_stride_block;  // bytes
  long long kv_stride_slot;   // bytes
  const int* indices;    // [batch, q_len, topk]; id = block * page_size + slot; -1 = skip
  long long indices_stride_batch;
  long long indices_stride_token;
  const int* topk_length;  // [batch], may be null
  const float* attn_sink;  // [num_heads], may be null

  void* out;             // [batch, q_len, num_heads, 512] bf16
  long long out_stride_batch;
  long long out_stride_token;
  long long out_stride_head;
  float* lse;            // may be null
  long long lse_stride_batch;
  long long lse_stride_token;
  long long lse_stride_head;

  float softmax_scale;

  // The cache's token format: kMlaKvModel1 (d_qk 512: q [.., 512], V the whole 512-dim row), or
  // any other value (zero-initialised params included) for the 656-byte token (d_qk 576: q
  // [.., 576], V the first 512 dims). Dense runs keep their format in DenseSource.
  int kv_format;
  // MODEL1's second cache (extra_topk > 0; null / 0 otherwise): its selected tokens join the same
  // softmax as the first cache's (one LSE); -1 skips, only the first extra_topk_length[b] count.
  int extra_page_size;
  int extra_num_blocks;
  int extra_topk;
  // The final LSE of a row without a valid key (MlaLseEmpty): kMlaLseEmptyNegInf (0, deca's
  // convention) or kMlaLseEmptyPosInf (FlashMLA's). The CPU reference reads it; the GPU kernels
  // compile the plan's choice in (kernels/mla/lse.cuh) and never read this field. It fills the
  // padding before extra_kv, so the struct's layout (the kernels' parameter offsets) is unchanged.
  int lse_empty;
  const unsigned char* extra_kv;  // [extra_num_blocks, extra_page_size, 1, 584] bytes
  long long extra_kv_stride_block;  // bytes
  const int* extra_indices;       // [batch, q_len, extra_topk]; id = block * extra_page_size + slot
  long long extra_indices_stride_batch;
  long long extra_indices_stride_token;
  const int* extra_topk_length;   // [batch], may be null
};

struct CombineParams {
  int num_splits;
  int batch;
  int q_len;
  int num_heads;
  int dim_v;
  int out_dtype;         // deca::DType value

  const float* partial_out;  // [num_splits, batch, q_len, num_heads, dim_v]
  long long po_stride_split;
  long long po_stride_batch;
  long long po_stride_token;
  long long po_stride_head;
  const float* partial_lse;  // [num_splits, batch, q_len, num_heads]
  long long pl_stride_split;
  long long pl_stride_batch;
  long long pl_stride_token;
  long long pl_stride_head;
  const float* attn_sink;    // [num_heads], may be null

  void* out;                 // [batch, q_len, num_heads, dim_v]
  long long out_stride_batch;
  long long out_stride_token;
  long long out_stride_head;
  float* lse;                // may be null
  long long lse_stride_batch;
  long long lse_stride_token;
  long long lse_stride_head;
};

}  // namespace deca
