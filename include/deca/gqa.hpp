// GQA / MQA / MHA decode over a paged KV cache.
//
//   plan = deca::plan_gqa_decode(config);        // once per batch shape (host only, no launch)
//   deca::gqa_decode(plan, args);                // once per layer; CUDA-graph safe on the GPU
//
// The config holds what is fixed for a model layer and the maxima the caller promises (batch,
// q_len, sequence length); the plan derives kernel choice, split count and workspace size from
// them alone, never from live lengths, so a captured graph stays valid. Semantics:
// docs/semantics.md; the CPU backend (src/cpu/) is the executable specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "deca/checked.hpp"
#include "deca/tensor.hpp"

namespace deca {

enum class KvLayout : int {
  kNHD = 0,  // [num_pages, page_size, num_kv_heads, head_dim]  (vLLM)
  kHND = 1,  // [num_pages, num_kv_heads, page_size, head_dim]  (FlashInfer / TensorRT-LLM)
};

// The fused decode step's rotary embedding (GqaConfig::rope_style; docs/semantics.md, "Fused
// decode step"). Dimension pairs rotated by the angle of the token's position, cos / sin taken
// from the cos_sin_cache row of that position: i in [0, rotary_dim / 2) pairs
//   kNeox (GPT-NeoX, vLLM is_neox_style=True): dims i and i + rotary_dim / 2
//   kGptj (GPT-J, interleaved, vLLM is_neox_style=False): dims 2i and 2i + 1
// as (x, y) -> (x cos - y sin, y cos + x sin); dims from rotary_dim on are not rotated.
enum class RopeStyle : int {
  kNone = 0,  // plain decode: q is rotated and the new tokens appended by the caller
  kNeox = 1,
  kGptj = 2,
};

enum class SplitMode : int {
  kAuto = 0,   // split count from the shapes, the promised max length and the SM count
  kFixed = 1,  // every split covers exactly `split_tokens` keys: results do not depend on the
               // batch composition (batch-invariant, bitwise reproducible)
};

struct GqaConfig {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 128;
  int page_size = 16;
  KvLayout layout = KvLayout::kNHD;
  DType q_dtype = DType::kBF16;    // bf16 | fp16
  DType kv_dtype = DType::kBF16;   // bf16 | fp16 | fp8_e4m3 | int8
  DType out_dtype = DType::kBF16;  // bf16 | fp16 | fp8_e4m3

  // Maxima the caller promises for every later run with this plan.
  int max_batch = 1;
  int max_q_len = 1;
  int max_seq_len = 0;

  // Features. Values that are fixed per layer live here; per-call tensors live in the args.
  bool tree_mask = false;        // speculative decoding: args.tree_mask is given
  bool sinks = false;            // args.sinks is given
  bool lse = false;              // args.lse is given
  bool per_head_kv_scale = false;  // args.k_scales / v_scales are given (else k_scale / v_scale)
  int window = 0;                // sliding window in keys; 0 = none
  float softcap = 0.f;           // logits soft-cap c (c * tanh(x / c)); 0 = none
  int beam_width = 1;            // batch = requests * beam_width, beams of a request adjacent
  // Skip-softmax (approximate; docs/semantics.md "Skip-softmax"): with f > 0, a tile of keys whose
  // largest logit m_t has exp(m_t - m_run) < f / L (m_run: the row's running maximum over the
  // tiles kept before it, L: the keys the row's causal window spans, with a tree mask plus the
  // drafts after the row's own) adds nothing to the row's sum, output or LSE, and the GPU kernels
  // do not read its V where no row of the CTA keeps it.
  // The skipped weight is below f times the kept weight, so an output element moves by less than
  // f / (1 + f) times the spread of that element over the row's values and zero, and the LSE by
  // less than log(1 + f). 0 = exact attention (the default: the kernels without the skip test);
  // finite and >= 0, and 0 in a fused plan (rope_style below). A plan with f > 0 runs a "_skip"
  // kernel that takes f at run time.
  float skip_softmax_factor = 0.f;

  // Fused decode step (a "fused plan"; docs/semantics.md): rope_style != kNone makes gqa_decode
  // take this step's tokens before rotary embedding (args.k_new, v_new, cos_sin_cache, optional
  // positions), rotate q and k_new, write k_new / v_new into their cache slots (quantized for
  // 8-bit caches) and attend over the cache including them, in one kernel launch. The kernel is
  // specialised on the style and rotary_dim.
  RopeStyle rope_style = RopeStyle::kNone;
  int rotary_dim = 0;            // fused: a multiple of 16 in 16..head_dim; 0 = head_dim

  SplitMode split_mode = SplitMode::kAuto;
  int split_tokens = 0;  // kFixed: keys per split (a multiple of the kernel tile, rounded up)

  // Checked mode (deca/checked.hpp; GPU only, the CPU backend checks everything on the host):
  // the kernel tests every page id it reads against [0, num_pages) and every seq_lens entry
  // against 0 or [q_len, min(max_pages * page_size, max_seq_len)]; a bad page's keys are masked,
  // a bad length reads as 0 (zeros, LSE -inf), nothing out of range is dereferenced, and the first
  // offender is recorded in the workspace (256 bytes more of it) for check_gqa_run. The kernel
  // name ends in "_chk".
  bool checked = checked_by_default();

  Device device = Device::cpu();

  bool operator==(const GqaConfig&) const = default;  // field by field (a NaN softcap is unequal)
};

struct GqaPlan {
  GqaConfig config;
  int num_splits = 1;         // CTAs per (request, kv head) along the sequence
  int split_tokens = 0;       // kFixed: keys per split; 0 = even split of each request
  std::size_t workspace_bytes = 0;  // what args.workspace must provide (0 on the CPU)
  std::string kernel_name;    // readable specialization name (the JIT cache key), "" on the CPU
  int sm_count = 0;
  // Set by plan_gqa_decode: the config it checked and planned for. A run whose plan.config still
  // equals it checks only the run's own arguments; a plan built or edited by hand has its config
  // checked in full on every run, with the messages plan_gqa_decode gives (naming plan.config).
  GqaConfig validated_config;
  bool validated = false;
};

// Validates the config (throws deca::Error naming the field) and derives the plan.
GqaPlan plan_gqa_decode(const GqaConfig& config);

// Compiles ahead of time the GPU kernel that a plan of `config` runs on devices of compute
// capability `compute_capability` (80, 86, 89, 90, ...; 0 = that of config.device), or finds it
// in the on-disk kernel cache (DECA_CACHE_DIR, else ~/.cache/deca), and returns its name (what
// GqaPlan::kernel_name will be there). Nothing is launched and, with an explicit capability, no
// GPU is needed: a build machine or a server's start-up fills the cache so that no request
// waits for NVRTC. With an explicit capability config.device is not used.
std::string precompile_gqa_decode(const GqaConfig& config, int compute_capability = 0);

struct GqaDecodeArgs {
  TensorView q;           // [batch, q_len, num_q_heads, head_dim] bf16|fp16, head_dim contiguous
  TensorView k_cache;     // NHD or HND (config.layout), head_dim contiguous, any page stride
  TensorView v_cache;     // same shape as k_cache; may be a view of the same allocation
  TensorView page_table;  // [batch, max_pages] int32
  TensorView seq_lens;    // [batch] int32: tokens in the cache, the new q_len tokens included
  TensorView out;         // [batch, q_len, num_q_heads, head_dim] config.out_dtype

  TensorView lse;         // optional [batch, q_len, num_q_heads] fp32 (natural log; sink excluded)
  TensorView tree_mask;   // optional [batch, q_len, ceil(q_len / 32)] uint32
  TensorView sinks;       // optional [num_q_heads] fp32 logits
  TensorView k_scales;    // optional [num_kv_heads] fp32 (per-head; overrides k_scale)
  TensorView v_scales;    // optional [num_kv_heads] fp32

  // Fused plans only (GqaConfig::rope_style != kNone; absent otherwise). q is then this step's
  // query BEFORE rotary embedding; the op never writes q, k_new, v_new.
  //   k_new, v_new: [batch, q_len, num_kv_heads, head_dim] config.q_dtype, head_dim contiguous:
  //     this step's keys (before rotary embedding) and values. Token i of batch entry b goes to
  //     cache position seq_lens[b] - q_len + i (seq_lens include the new tokens, as for plain
  //     decode), i.e. page page_table[b][pos / page_size], slot pos % page_size; 8-bit caches
  //     store round(real / scale) with the per-tensor or per-head scale (saturating: e4m3 at
  //     +-448, int8 at +-127, NaN as 0). A request with seq_lens[b] == 0 writes nothing. The pages
  //     that receive a batch entry's new tokens must be its own (no other entry's page_table row,
  //     beams included, names them): otherwise what the other entry reads there is unspecified.
  //   cos_sin_cache: [max_position, rotary_dim] fp32 | bf16 | fp16 (vLLM's layout: cos of the
  //     rotary_dim / 2 frequencies, then their sin), rows contiguous.
  //   positions: optional [batch, q_len] int32, the rotary position of each new token (vLLM
  //     passes them); absent = seq_lens[b] - q_len + i. Every position must be in
  //     [0, max_position): checked on the host for CPU tensors; on the GPU the caller's contract,
  //     which a checked plan tests (an out-of-range position reads row 0 and check_gqa_run
  //     reports it, naming positions[b][i] or seq_lens[b]).
  TensorView k_new;
  TensorView v_new;
  TensorView cos_sin_cache;
  TensorView positions;

  float k_scale = 1.f;        // real = stored * scale (quantized caches)
  float v_scale = 1.f;
  float softmax_scale = 0.f;  // 0 = 1 / sqrt(head_dim)
  float out_scale = 1.f;      // fp8 output stores real / out_scale

  void* workspace = nullptr;  // plan.workspace_bytes bytes on the device, zeroed once at
                              // allocation (split counters reset themselves after each run)
  std::size_t workspace_bytes = 0;
  // cudaStream_t; ignored on the CPU. On sm_90 and later the kernel is launched with programmatic
  // dependent launch: it may be placed on the GPU while the previous kernel in the stream
  // finishes, but reads and writes nothing before that kernel has completed (stream order holds
  // as without it), and it lets the next kernel launch once its main loop is done; a next
  // kernel launched with the attribute must itself wait (griddepcontrol.wait /
  // cudaGridDependencySynchronize) before it reads this call's outputs. Captured graphs keep it.
  void* stream = nullptr;
};

// Validates every argument against the plan before anything is launched or written; throws
// deca::Error naming the argument, what was expected and what came.
// Contents are checked only where they are host memory: on the CPU, seq_lens (0 = an empty
// request that outputs zeros, else q_len..min(max_pages * page_size, max_seq_len)) and the page
// table entries the lengths use ([0, num_pages)). Device-resident page_table / seq_lens are the
// caller's contract: reading them would cost a synchronisation per call and break graph capture.
void gqa_decode(const GqaPlan& plan, const GqaDecodeArgs& args);

// Convenience for one-off calls: plans from the argument shapes (num_q_heads from q; head_dim,
// page_size, num_kv_heads from k_cache; max_* = this call's sizes, max_seq_len only when
// config.max_seq_len is 0); dtypes, features and scalars are the config's.
// On the GPU it allocates and frees a workspace per call: use plan + run in a server.
void gqa_decode(const GqaConfig& config, const GqaDecodeArgs& args);

// Checked mode: reads what the checked runs of `plan` on `workspace` recorded since the last
// check. Synchronises `stream` (cudaStream_t; the runs' stream), copies the 32-byte record from
// the workspace's last bytes and, when an index was out of range, zeroes it again and throws
// deca::Error, e.g. "gqa_decode: page_table[3][17]: expected a page id in [0, 4096), got 99999
// (found by the checked GPU run)". Does nothing for an unchecked or CPU plan. Not inside CUDA
// graph capture (it synchronises): call it after the graph's launch, once per step or per layer.
// The one-shot gqa_decode(config, args) calls it itself.
void check_gqa_run(const GqaPlan& plan, const void* workspace, void* stream = nullptr);

}  // namespace deca
