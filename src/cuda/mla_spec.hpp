// MLA sparse decode kernel specializations: the small value type the JIT compiles, caches and
// names. One key per kernel of a run (scheduler, decode, combine) and the generic combine op.
#pragma once

#include <string>

#include "deca/mla.hpp"
#include "jit/spec.hpp"
#include "kernels/mla/params.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::cuda {

enum class MlaKernelRole { kSchedule, kDecode, kCombine, kGenericCombine };

struct MlaKernelKey {
  int arch = 90;                       // compute capability, 90 = sm_90a
  MlaKernelRole role = MlaKernelRole::kDecode;
  std::string variant = "portable";    // decode only: "portable" (sm_80+) or "sm90"
  int page_size = 0;                   // sm90 decode only: compiled in (Cfg::kPageSize)
  int extra_page_size = 0;             // sm90 MODEL1 decode only: Cfg::kExtraPageSize
  mla::sm90::KernelClass sm90{0, 1};   // sm90 decode only: which kernel (Cfg::kDirect, kCluster)
  bool checked = false;                // MlaConfig::checked, "_chk" (either variant)
  // Decode only: dense decode (the block table as token source, "mla_dense_decode_...") and the
  // cache's records (MlaKvFormat, kernels/mla/params.cuh; named for dense: "_bf16", "_fp8_e4m3",
  // "_fp8_sparse"). Sparse decode reads kMlaKvFP8Sparse.
  bool dense = false;
  int kv_format = 2;  // kMlaKvFP8Sparse
  // sm90 dense bf16 decode only: the rows by TMA (Cfg::kTma, "_tma" after the class;
  // src/cuda/mla_tma.hpp mla_dense_tma_rows says for which plans). Its entry takes the cache's
  // tensor map (mla::TensorMapBytes) as a second parameter.
  bool tma = false;
  // MODEL1 (kv_format kMlaKvModel1, sparse): every role's kernel reads both caches' lists
  // ("_model1" in each name; the scheduler's and combine's entry_model1.cuh).
  bool model1() const { return kv_format == kMlaKvModel1; }
  // Combine only: the combine spread over the value dimensions (mla_combine_split,
  // kernels/mla/combine/entry_split.cuh; "mla_sparse_combine_split").
  bool combine_split = false;
  // Decode and combine: a row without a valid key gets the final LSE +inf instead of -inf
  // (MlaConfig::lse_of_empty_row; kernels/mla/lse.cuh; "_lsepinf" in the name, the macro in the
  // source). Off, the kernels' names and sources are what they were.
  bool lse_pos_inf = false;

  // e.g. "mla_sparse_decode_portable_sm90", "mla_sparse_decode_sm90_p64_direct_sm90",
  // "mla_sparse_decode_sm90_model1_p256x64_c2_sm90", "mla_dense_decode_sm90_bf16_p64_c2_tma_sm90",
  // "mla_sparse_decode_portable_model1_chk_sm90",
  // "mla_dense_decode_portable_bf16_chk_sm80",
  // "mla_sparse_combine_sm90", "combine_sm80"
  std::string name() const;
  // "// <name>" + the prologue (the sm90 kernel's Cfg; the portable dense kernel's Cfg::kChecked
  // and kKvFormat) + #include of the role's entry header.
  jit::JitSpec spec() const;
};

// Blocks of 64 in the longest request a plan of `config` may run: dense ceil(max_seq_len / 64),
// sparse ceil(topk / 64) (MODEL1: + ceil(extra_topk / 64), the extra cache's blocks).
int mla_plan_blocks(const MlaConfig& config);

// The combine a plan of `config` on `num_parts` partitions launches: the split one
// (combine_split) when its max_batch requests of the longest length are each cut into many pieces
// (plan::mla_split_combine, src/plan/mla_combine.hpp), else the one warp per row.
bool mla_combine_split(const MlaConfig& config, int num_parts);

// The decode variant a plan runs on a device of compute capability `arch`: "sm90" when arch == 90
// and DECA_MLA_KERNEL is not "portable" (src/cuda/tuning.cpp); else "portable".
std::string mla_decode_variant(int arch);

// Launch shape of a decode kernel.
struct MlaDecodeShape {
  int threads = 0;
  int smem_bytes = 0;
  int cluster_x = 1;  // CTAs of a cluster along x (1: no cluster attribute)
};
// The decode key's: the sm90 kernels' threads and cluster from their kernel class, the portable
// kernel's fixed.
MlaDecodeShape mla_decode_shape(const MlaKernelKey& key);

// The MlaKvFormat (kernels/mla/params.cuh) a plan of `config` reads: config.kv_format, with
// kDefault read as bf16 for dense decode and the 656-byte FP8 token for sparse decode.
int mla_kv_format(const MlaConfig& config);

// Whether the sm90 kernels decode a dense cache of format `kv_format` (MlaKvFormat): bf16 and e4m3
// rows through the wide kernel (kernels/mla/sm90/rows.cuh), the 656-byte token through the sparse
// kernels' record producers. The one switch between the sm90 and the portable kernel for dense
// plans on sm_90.
bool mla_dense_sm90_supported(int kv_format);

// Whether the sm90 kernels decode MODEL1 (kMlaKvModel1, two caches: the wide kernel at every
// head count); the portable kernel does everywhere.
bool mla_model1_sm90_supported();

// The decode variant of a plan: mla_decode_variant(arch), but the portable kernel for a dense
// plan whose format the sm90 kernel does not decode (mla_dense_sm90_supported). Checked plans
// take the same variant (on sm90 the kernels' checked builds, kernels/mla/sm90/checked.cuh): the
// key's `checked` follows the config for either.
std::string mla_plan_variant(int arch, const MlaConfig& config);

// The decode key a plan of `config` runs with `variant` on compute capability `arch`: its token
// source and format (dense, mla_kv_format); the sm90 kernels compile the page size in and are
// chosen by mla::sm90::kernel_class(config.num_heads). Throws a deca::Error from plan_mla_decode
// when a retired tuning variable is set (src/cuda/tuning.cpp).
MlaKernelKey mla_decode_key(int arch, const std::string& variant, const MlaConfig& config);

}  // namespace deca::cuda
