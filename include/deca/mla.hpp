// MLA decode (DeepSeek): one shared latent KV head of 576 dims (512 "NoPE" + 64 RoPE); V is the
// first 512 dims of each cached row. Dense (bf16 cache + block table) and sparse (656-byte FP8
// tokens + top-k indices), and the combine step that merges split-KV partial results by LSE.
// Semantics: DESIGN.md, "MLA decode"; the CPU backend is the executable specification.
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

struct MlaConfig {
  int num_heads = 0;
  int page_size = 64;
  bool sparse = false;   // sparse FP8 (indices) or dense bf16 (block table)
  int max_batch = 1;
  int max_q_len = 1;
  int max_seq_len = 0;   // dense: promised max cache length
  int topk = 0;          // sparse: indices per query token
  bool lse = true;
  bool attn_sink = false;    // sparse: args.attn_sink given
  bool topk_length = false;  // sparse: args.topk_length given
  // Checked mode (deca/checked.hpp; CUDA sparse only, the CPU backend checks on the host): the
  // decode kernel tests every index it reads against -1 or [0, num_blocks * page_size) and every
  // topk_length entry against [0, topk], records the first offender in the workspace (kCheckBytes
  // more of it, zeroed once at allocation) for check_mla_run, and skips it as the unchecked one
  // does. Runs the portable decode kernel ("mla_sparse_decode_portable_chk_smXX"): the sm90 kernel
  // has no checked variant yet.
  bool checked = checked_by_default();
  Device device = Device::cpu();
};

struct MlaPlan {
  MlaConfig config;
  // CUDA sparse: the most pieces the scheduler may cut one request into (= num_parts); 1 on CPU.
  int num_splits = 1;
  // CUDA sparse: bytes of device memory a run needs (scheduler metadata, split partials), sized
  // for max_batch and max_q_len; 0 on the CPU.
  std::size_t workspace_bytes = 0;
  int sm_count = 0;
  // CUDA sparse: SM partitions the scheduler fills (sm_count / (max_q_len * head blocks of 64)).
  int num_parts = 0;
  std::string kernel_name;  // CUDA sparse: the decode kernel, e.g. "mla_sparse_decode_portable_sm90"
};

MlaPlan plan_mla_decode(const MlaConfig& config);

// Compiles ahead of time the GPU kernels that a plan of `config` runs on devices of compute
// capability `compute_capability` (80, 86, 89, 90, ...; 0 = that of config.device): the
// scheduler, the decode kernel and the combine, or finds them in the on-disk kernel cache
// (DECA_CACHE_DIR, else ~/.cache/deca), and returns the decode kernel's name (what
// MlaPlan::kernel_name will be there). Nothing is launched and, with an explicit capability, no
// GPU is needed. The config is validated as plan_mla_decode validates it; CUDA runs sparse decode
// only in this build, so config.sparse must be true. With an explicit capability config.device is
// not used.
std::string precompile_mla_decode(const MlaConfig& config, int compute_capability = 0);

struct MlaDenseArgs {
  TensorView q;              // [batch, q_len, num_heads, 576] bf16
  TensorView kv_cache;       // [num_blocks, page_size, 1, 576] bf16
  TensorView block_table;    // [batch, max_blocks] int32
  TensorView cache_seqlens;  // [batch] int32 (the q_len new tokens included; causal among them)
  TensorView out;            // [batch, q_len, num_heads, 512] bf16
  TensorView lse;            // optional [batch, q_len, num_heads] fp32
  float softmax_scale = 0.f;  // 0 = 1 / sqrt(576)
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;
};

struct MlaSparseArgs {
  TensorView q;            // [batch, q_len, num_heads, 576] bf16
  TensorView kv_cache;     // [num_blocks, page_size, 1, 656] uint8 (the FP8 token format)
  TensorView indices;      // [batch, q_len, topk] int32 global token ids, -1 = skip
  TensorView topk_length;  // optional [batch] int32: only the first topk_length[b] indices count
  TensorView attn_sink;    // optional [num_heads] fp32 logits (denominator only; LSE excludes it)
  TensorView out;          // [batch, q_len, num_heads, 512] bf16
  TensorView lse;          // optional [batch, q_len, num_heads] fp32
  float softmax_scale = 0.f;  // 0 = 1 / sqrt(576)
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
// the expectation and the value). Host-memory contents are checked too: cache_seqlens and the
// block_table entries they use; indices (-1 or a token id < num_blocks * page_size, only the
// first topk_length[b] of each row) and topk_length. Sparse decode also runs on CUDA (a plan made
// for a CUDA device; every tensor on it; `workspace` = plan.workspace_bytes of device memory,
// 16-byte aligned, zeroed once at allocation (only a checked plan's record, its last 256 bytes,
// needs it); launches on `stream`, nothing allocated, graph-capturable; one run at a time per
// workspace). There, indices and topk_length are device-resident and not read on the host:
// keeping them in range is the caller's contract (the kernels clamp topk_length to [0, topk] and
// skip ids outside the pool, where the CPU backend raises), which a checked plan verifies
// (MlaConfig::checked, check_mla_run). Dense decode runs on the CPU only in this build.
void mla_decode_dense(const MlaPlan& plan, const MlaDenseArgs& args);
void mla_decode_sparse(const MlaPlan& plan, const MlaSparseArgs& args);

// Checked mode: as check_gqa_run (synchronises `stream`, reads and zeroes the record, throws
// e.g. "mla_decode_sparse: indices[1][0][5]: expected -1 or a token id in [0, 8192), got 8192
// (found by the checked GPU run)"); nothing for an unchecked, dense or CPU plan.
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
