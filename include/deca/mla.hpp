// MLA decode (DeepSeek): one shared latent KV head of 576 dims (512 "NoPE" + 64 RoPE); V is the
// first 512 dims of each cached row. Dense (every cached token of a request, through a block
// table; bf16, e4m3 or 656-byte FP8 caches) and sparse (656-byte FP8 tokens chosen by top-k
// indices), and the combine step that merges split-KV partial results by LSE. Sparse decode also
// reads DeepSeek V4's cache (MlaCacheFormat::kModel1: 512-dim rows of 448 NoPE + 64 RoPE values,
// V the whole row, 584-byte tokens) with an optional second cache whose selected tokens join the
// same softmax.
//
//   plan = deca::plan_mla_decode(config);        // once per decode shape (host only, no launch)
//   deca::mla_decode_dense(plan, args);          // once per layer; CUDA-graph safe on the GPU
//
// Semantics: docs/semantics.md, "MLA decode"; the CPU backend is the executable specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "deca/checked.hpp"
#include "deca/tensor.hpp"

namespace deca {

inline constexpr int kMlaDimQK = 576;
inline constexpr int kMlaDimV = 512;
inline constexpr int kMlaDimNope = 512;
inline constexpr int kMlaDimRope = 64;
inline constexpr int kMlaFp8TokenBytes = 656;  // 512 e4m3 + 4 fp32 scales + 64 bf16

// MODEL1 (DeepSeek V4): q, K and V are 512 dims (448 NoPE + 64 RoPE); a token is 584 bytes.
inline constexpr int kMlaModel1DimQK = 512;
inline constexpr int kMlaModel1DimNope = 448;
inline constexpr int kMlaModel1TokenBytes = 584;  // 448 e4m3 + 64 bf16 + 7 ue8m0 scales + 1 pad
inline constexpr int kMlaModel1RowBytes = 576;    // the e4m3 + bf16 part, at slot * 576
inline constexpr int kMlaModel1ScaleBytes = 8;    // the scales + pad, at page * 576 + slot * 8

// Bytes of one packed MODEL1 page of `page_size` tokens: page_size * 584 rounded up to a multiple
// of 576 (the smallest block stride a MODEL1 cache may have). 0 for page_size <= 0.
inline constexpr std::size_t mla_model1_page_bytes(int page_size) {
  if (page_size <= 0) return 0;
  const std::size_t raw = static_cast<std::size_t>(page_size) * kMlaModel1TokenBytes;
  return (raw + kMlaModel1RowBytes - 1) / kMlaModel1RowBytes * kMlaModel1RowBytes;
}

// How the cache stores one token's 576 values (MlaConfig::kv_format). Every format is
// [num_blocks, page_size, 1, row] with the row's last dimension contiguous:
// - kBF16: 576 bf16 (row 576, DType::kBF16). Dense only.
// - kFP8E4M3: 576 e4m3 (row 576, DType::kFP8E4M3) with one fp32 scale for the whole cache,
//   MlaDenseArgs::kv_scale: real value = stored * kv_scale. Dense only. quantize_mla_fp8_e4m3
//   (deca/quant.hpp) makes one from bf16.
// - kFP8Sparse: the 656-byte token (row 656, DType::kUINT8): 512 e4m3 NoPE values, 4 fp32 scales
//   (one per 128 values), 64 bf16 RoPE values (pack_mla_fp8 makes one). Sparse, or dense: every
//   token of a request read through the block table, no index list.
// - kModel1: DeepSeek V4's 584-byte token (DType::kUINT8), sparse only, laid out per page
//   rather than per token: in a block, token `slot`'s 576-byte row (448 e4m3 NoPE values, then
//   64 bf16 RoPE values) at byte slot * 576; after the page_size rows, at byte
//   page_size * 576 + slot * 8, its 7 ue8m0 scales (one per 64 NoPE values, real = stored *
//   2^(byte - 127); byte 255 is NaN) and one pad byte that nothing reads; the block padded to
//   mla_model1_page_bytes(page_size). The tensor is a [num_blocks, page_size, 1, 584] view over
//   those bytes: slot stride 584 (the view's shape, not an address: no token lives at
//   slot * 584), block stride >= mla_model1_page_bytes(page_size). q is 512 dims; K = V = the
//   token's 512 real values. pack_mla_fp8 (deca/quant.hpp) makes one.
// - kDefault: kBF16 for dense decode, kFP8Sparse for sparse decode.
// The reference computes on each element's real value rounded to bf16 (the 8-bit formats: the
// stored value times its scale, in fp32, then rounded to bf16; exact for power-of-two scales,
// which deca's packers choose), with double accumulation.
enum class MlaCacheFormat : int {
  kDefault = 0,
  kBF16 = 1,
  kFP8E4M3 = 2,
  kFP8Sparse = 3,
  kModel1 = 4,
};

// "default", "bf16", "fp8_e4m3", "fp8_sparse", "model1" (messages, bindings); "?" outside the
// enum.
const char* mla_cache_format_name(MlaCacheFormat format);

// The LSE a row without a valid key gets (MlaConfig::lse_of_empty_row). Its output row is zeros
// either way. kNegInf is the log of the empty sum (deca's convention, and what `combine` reads
// as "no key"); kPosInf is FlashMLA's (its compat layer asks for it, so that no extra kernel maps
// the LSE afterwards). Rows with keys, and NaN LSEs (NaN inputs), are the same under both.
enum class MlaLseOfEmptyRow : int {
  kNegInf = 0,
  kPosInf = 1,
};

struct MlaConfig {
  int num_heads = 0;
  int page_size = 64;
  bool sparse = false;   // sparse (top-k indices) or dense (block table)
  // The cache's format (MlaCacheFormat). Sparse decode reads kFP8Sparse (kDefault) or kModel1.
  MlaCacheFormat kv_format = MlaCacheFormat::kDefault;
  int max_batch = 1;
  int max_q_len = 1;
  // Dense: the longest cache_seqlens entry any run may pass (>= 1; the CUDA kernels size their
  // schedule by it, a checked plan tests every entry against it). Sparse: >= 0, unused.
  int max_seq_len = 0;
  int topk = 0;          // sparse: indices per query token
  bool lse = true;
  // The LSE written for a row without a valid key (an empty request, a query token whose keys
  // are all masked, indices all -1): -inf (default) or +inf. On CUDA it is compiled into the
  // decode and combine kernels ("_lsepinf" in MlaPlan::kernel_name); only the final LSE is
  // affected, never a split piece's. Refused (plan_mla_decode, config.lse_of_empty_row) outside
  // the enum.
  MlaLseOfEmptyRow lse_of_empty_row = MlaLseOfEmptyRow::kNegInf;
  bool attn_sink = false;    // sparse: args.attn_sink given
  bool topk_length = false;  // sparse: args.topk_length given
  // kModel1 only: a second cache (MlaSparseArgs::extra_*), in the same 584-byte format with its
  // own page size. extra_topk: its indices per query token (0 = no second cache; > 0 only with
  // kModel1). extra_page_size: its page size (>= 1; read only when extra_topk > 0).
  // extra_topk_length: args.extra_topk_length given (only with extra_topk > 0).
  int extra_topk = 0;
  int extra_page_size = 64;
  bool extra_topk_length = false;
  // Checked mode (deca/checked.hpp; CUDA only, the CPU backend checks on the host): the sparse
  // decode kernel tests every index it reads against -1 or [0, num_blocks * page_size) and every
  // topk_length entry against [0, topk]; the dense one every block_table entry it reads against
  // [0, num_blocks) and every cache_seqlens entry against [0, max_seq_len]. The first offender is
  // recorded in the workspace (kCheckBytes more of it, zeroed once at allocation) for
  // check_mla_run and skipped (a bad length clamped), nothing outside the cache is read. Runs
  // the checked build of the plan's decode kernel: on sm_90 the sm90 kernels' ("_chk" before the
  // sm90 suffix), elsewhere (and with DECA_MLA_KERNEL=portable) the portable kernel's
  // ("..._portable_chk_smXX"), with the same record.
  bool checked = checked_by_default();
  Device device = Device::cpu();
};

// What plan_mla_decode derived from a config (dense and sparse alike). On CUDA the plan also
// loads (compiling on first use) the scheduler, decode and combine kernels it names.
struct MlaPlan {
  MlaConfig config;
  // CUDA: the most pieces the scheduler may cut one request into (= num_parts); 1 on the CPU.
  int num_splits = 1;
  // CUDA: bytes of device memory a run needs (scheduler metadata, split partials, a checked
  // plan's record), sized for max_batch and max_q_len; 0 on the CPU.
  std::size_t workspace_bytes = 0;
  int sm_count = 0;
  // CUDA: SM partitions the scheduler fills (sm_count / (max_q_len * head blocks of 64)).
  int num_parts = 0;
  // CUDA: the decode kernel, e.g. "mla_sparse_decode_portable_sm90", with "+" and the combine
  // kernel's name when the plan takes the split combine (max_batch requests of the longest length
  // each cut into 16 or more pieces: a few long requests, e.g. one of 32k tokens at 128 heads);
  // "" on the CPU.
  std::string kernel_name;
};

// Validates the config (deca::Error from plan_mla_decode naming config.<field>): num_heads > 0,
// page_size >= 1, max_batch > 0, max_q_len > 0; dense: max_seq_len > 0, topk 0, no attn_sink
// or topk_length, kv_format not kModel1; sparse: topk > 0, max_seq_len >= 0, kv_format kDefault,
// kFP8Sparse or kModel1; extra_topk >= 0, > 0 only with kModel1 (sparse); with extra_topk > 0
// extra_page_size >= 1; extra_topk_length only with extra_topk > 0; kv_format one of the enum's
// values; device cpu or a present cuda:N (compute capability 8.0 or newer, and enough shared
// memory for the decode kernel).
MlaPlan plan_mla_decode(const MlaConfig& config);

// Compiles ahead of time the GPU kernels that a plan of `config` runs on devices of compute
// capability `compute_capability` (80, 86, 89, 90, ...; 0 = that of config.device): the
// scheduler, the decode kernel and both combines (which one a plan takes depends on the device's
// SM count), or finds them in the on-disk kernel cache (DECA_CACHE_DIR, else ~/.cache/deca), and
// returns the decode kernel's name (how MlaPlan::kernel_name will begin there). Nothing is launched and, with an explicit capability, no
// GPU is needed. The config is validated as plan_mla_decode validates it (dense and sparse);
// with an explicit capability config.device is not used.
std::string precompile_mla_decode(const MlaConfig& config, int compute_capability = 0);


// Dense decode: query token i of request b (q_len new tokens, the last q_len of the request's
// cache_seqlens[b] tokens) attends to the request's cached tokens j < len - (q_len - 1 - i),
// where token j lives in slot j % page_size of block block_table[b][j / page_size]. A row
// without keys (an empty request) gets zeros and LSE -inf.
struct MlaDenseArgs {
  TensorView q;              // [batch, q_len, num_heads, 576] bf16; batch <= max_batch,
                             // q_len 1..max_q_len, rows 16-byte aligned
  // [num_blocks, page_size, 1, 576] bf16 (kBF16) | fp8_e4m3 (kFP8E4M3), or
  // [num_blocks, page_size, 1, 656] uint8 (kFP8Sparse): plan.config.kv_format says which; rows
  // 16-byte aligned. V is the first 512 dims of each token.
  TensorView kv_cache;
  TensorView block_table;    // [batch, max_blocks] int32 block ids in [0, num_blocks)
  // [batch] int32 in [0, max_seq_len] and <= max_blocks * page_size, the q_len new tokens
  // included (so a nonzero length is >= q_len: the CPU backend refuses one below, on CUDA the
  // rows it leaves without keys get zeros and LSE -inf).
  TensorView cache_seqlens;
  TensorView out;            // [batch, q_len, num_heads, 512] bf16 (written), rows 16-byte aligned
  TensorView lse;            // [batch, q_len, num_heads] fp32 (natural log) iff plan.config.lse
  float softmax_scale = 0.f;  // >= 0, finite; 0 = 1 / sqrt(576)
  // kFP8E4M3 caches: real = stored * kv_scale (finite, > 0). Other formats: 1 (their scales, if
  // any, are in the tokens).
  float kv_scale = 1.f;
  void* workspace = nullptr;        // CUDA: plan.workspace_bytes bytes (see below)
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;           // CUDA: a cudaStream_t (nullptr = the legacy default stream)
  // CUDA: skip the scheduler and run on the schedule an earlier run of this plan left in
  // `workspace` (the other layers of a decode step, whose batch, q_len and cache_seqlens contents
  // are the first layer's), as MlaSparseArgs::reuse_schedule. Ignored on the CPU.
  bool reuse_schedule = false;
};

// Sparse decode: query token i of request b attends to the tokens its indices name, each id
// block * page_size + slot; -1 skips; only the first topk_length[b] entries of a row count
// (all topk without topk_length); a duplicated id counts once per entry. kModel1 with
// extra_topk > 0: the first extra_topk_length[b] entries of extra_indices[b][i] name tokens of
// extra_kv_cache (block * extra_page_size + slot) that join the same softmax (one LSE over the
// keys of both caches). The sink (attn_sink[h]) adds exp(sink) to the denominator only. A row
// without a valid key gets zeros and LSE -inf.
struct MlaSparseArgs {
  // [batch, q_len, num_heads, 576] bf16 (kModel1: [.., 512]: 448 NoPE + 64 RoPE); rows 16-byte
  // aligned.
  TensorView q;
  // [num_blocks, page_size, 1, 656] uint8 (the FP8 token format), rows 16-byte aligned; kModel1:
  // [num_blocks, page_size, 1, 584] uint8 over the kModel1 page layout (MlaCacheFormat):
  // slot stride 584, block stride >= mla_model1_page_bytes(page_size) and a multiple of 16,
  // data 16-byte aligned.
  TensorView kv_cache;
  TensorView indices;      // [batch, q_len, topk] int32 global token ids, -1 = skip
  TensorView topk_length;  // optional [batch] int32: only the first topk_length[b] indices count
  TensorView attn_sink;    // optional [num_heads] fp32 logits (denominator only; LSE excludes it)
  TensorView out;          // [batch, q_len, num_heads, 512] bf16
  TensorView lse;          // optional [batch, q_len, num_heads] fp32
  // kModel1's second cache, given iff plan.config.extra_topk > 0: [extra_num_blocks,
  // extra_page_size, 1, 584] uint8 laid out as kv_cache; extra_indices [batch, q_len,
  // extra_topk] int32 ids into it (-1 = skip); extra_topk_length [batch] int32 iff
  // plan.config.extra_topk_length (only the first extra_topk_length[b] entries count).
  TensorView extra_kv_cache;
  TensorView extra_indices;
  TensorView extra_topk_length;
  float softmax_scale = 0.f;  // >= 0, finite; 0 = 1 / sqrt(576) (kModel1: 1 / sqrt(512))
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;
  // CUDA: skip the scheduler and run on the schedule an earlier run of this plan left in
  // `workspace` (FlashMLA's tile-scheduler metadata made once per decode step): for the other
  // layers of a step, whose batch, q_len, topk and topk_length contents are the first layer's.
  // The kernels compare the call shape (batch, q_len, topk, topk_length given or not) with the
  // one the schedule was made for; on a mismatch nothing is computed, out and lse are filled
  // with NaN, and a checked plan reports it (check_mla_run). Other topk_length contents under an
  // equal shape are the caller's contract. Ignored on the CPU.
  bool reuse_schedule = false;
};

// Both validate every argument before anything is written (deca::Error naming the argument,
// the expectation and the value): dtypes, shapes, devices, alignment, overlap, the scales. On
// the CPU host-memory contents are checked too: cache_seqlens and the block_table entries they
// use; indices (-1 or a token id < num_blocks * page_size, only the first topk_length[b] of each
// row) and topk_length, and likewise extra_indices and extra_topk_length. Both also run on
// CUDA (a plan made for a CUDA device; every tensor on it; `workspace` = plan.workspace_bytes of
// device memory, 16-byte aligned, zeroed once at allocation (only a checked plan's record, its
// last 256 bytes, needs it); launches on `stream`, nothing allocated, graph-capturable; bitwise
// the same result run to run; one run at a time per workspace). There, block_table,
// cache_seqlens, indices, topk_length and their extra_* counterparts are device-resident and
// never read on the host: keeping them in range is the caller's contract (the kernels clamp
// topk_length to [0, topk], extra_topk_length to [0, extra_topk] and cache_seqlens to
// [0, max_seq_len], and skip sparse ids outside the pool, where the CPU backend raises), which a
// checked plan verifies (MlaConfig::checked, check_mla_run).
void mla_decode_dense(const MlaPlan& plan, const MlaDenseArgs& args);
void mla_decode_sparse(const MlaPlan& plan, const MlaSparseArgs& args);

// Checked mode: as check_gqa_run (synchronises `stream`, reads and zeroes the record, throws
// e.g. "mla_decode_sparse: indices[1][0][5]: expected -1 or a token id in [0, 8192), got 8192
// (found by the checked GPU run)" or "mla_decode_dense: block_table[0][3]: expected a block id
// in [0, 40), got 40 (found by the checked GPU run)"); nothing for an unchecked or CPU plan.
void check_mla_run(const MlaPlan& plan, const void* workspace, void* stream = nullptr);

// Merge split-KV partial results: out = sum_i exp(lse_i - lse) * partial_out_i with
// lse = log(sum_i exp(lse_i)) (+ the sink in the denominator when given). A split with
// lse_i = -inf contributes nothing; a row whose splits are all -inf outputs zeros, lse -inf.
// Runs on the CPU or on CUDA (every tensor on one device; launches on `stream`).
struct CombineArgs {
  TensorView partial_out;  // [num_splits, batch, q_len, num_heads, dim_v] fp32
  TensorView partial_lse;  // [num_splits, batch, q_len, num_heads] fp32
  TensorView attn_sink;    // optional [num_heads] fp32
  TensorView out;          // [batch, q_len, num_heads, dim_v] bf16 | fp16 | fp32
  TensorView lse;          // optional [batch, q_len, num_heads] fp32 (sink excluded)
  void* stream = nullptr;
};
void combine(const CombineArgs& args);

}  // namespace deca
