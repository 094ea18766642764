#include "cuda/mla_spec.hpp"

#include "cuda/mla_tma.hpp"
#include "cuda/tuning.hpp"

#include <string>

#include "kernels/mla/params.cuh"
#include "kernels/mla/schedule/work.cuh"
#include "kernels/mla/sm80/traits.cuh"
#include "kernels/mla/sm90/traits.cuh"
#include "plan/mla_combine.hpp"

namespace deca::cuda {

namespace {

const char* role_name(MlaKernelRole role) {
  switch (role) {
    case MlaKernelRole::kSchedule: return "mla_sparse_schedule";
    case MlaKernelRole::kDecode: return "mla_sparse_decode";
    case MlaKernelRole::kCombine: return "mla_sparse_combine";
    case MlaKernelRole::kGenericCombine: return "combine";
  }
  return "unknown";
}

// The sm90 decode kernel of a key, rendered once for both its name and its JIT prologue: the
// page size, then "_direct" for the direct kernel or "_c2" for the wide kernel's cluster of 2.
struct Sm90Render {
  std::string suffix;
  std::string prologue;
};
// Dense decode adds its token source and cache format (Cfg::kDense, kKvFormat; the sparse
// kernels read the 656-byte token through indices, the fields' defaults); MODEL1 its format and
// the extra cache's page size (Cfg::kKvFormat, kExtraPageSize; "_p<page>x<extra page>").
// A checked kernel adds Cfg::kChecked (kernels/mla/sm90/checked.cuh); the unchecked ones' source
// stays without it. Dense bf16 rows by TMA add Cfg::kTma and "_tma" (src/cuda/mla_tma.hpp).
Sm90Render render_sm90(int page_size, const mla::sm90::KernelClass& k, bool dense, int kv_format,
                       int extra_page_size, bool checked, bool tma) {
  const bool model1 = !dense && kv_format == kMlaKvModel1;
  Sm90Render r;
  r.suffix = "_p" + std::to_string(page_size) + (model1 ? "x" + std::to_string(extra_page_size) : "") +
             (k.direct ? "_direct" : k.cluster == 2 ? "_c2" : "") + (tma ? "_tma" : "");
  r.prologue = "struct Cfg {\n  static constexpr int kPageSize = " + std::to_string(page_size) +
               ";\n  static constexpr int kDirect = " + std::to_string(k.direct) +
               ";\n  static constexpr int kCluster = " + std::to_string(k.cluster) + ";\n";
  if (dense) {
    r.prologue += "  static constexpr int kDense = 1;\n  static constexpr int kKvFormat = " +
                  std::to_string(kv_format) + ";\n";
  }
  if (model1) {
    r.prologue += "  static constexpr int kKvFormat = " + std::to_string(kv_format) +
                  ";\n  static constexpr int kExtraPageSize = " + std::to_string(extra_page_size) + ";\n";
  }
  if (checked) r.prologue += "  static constexpr bool kChecked = true;\n";
  if (tma) r.prologue += "  static constexpr int kTma = 1;\n";
  r.prologue += "};\n";
  // The entry with the tensor map as its second parameter (kernels/mla/sm90/entry.cuh).
  if (tma) r.prologue += "#define DECA_MLA_TMA_ROWS 1\n";
  return r;
}

// The cache format's part of a dense decode kernel's name (MlaKvFormat), and of every MODEL1
// kernel's (scheduler, decode, combine: "_model1").
const char* kv_format_name(int kv_format) {
  switch (kv_format) {
    case kMlaKvBF16: return "bf16";
    case kMlaKvFP8E4M3: return "fp8_e4m3";
    case kMlaKvFP8Sparse: return "fp8_sparse";
    case kMlaKvModel1: return "model1";
  }
  return "fmt";
}

}  // namespace

// Built with std::to_string and appends, never iostreams (see gqa_spec.cpp for the locale trap).
std::string MlaKernelKey::name() const {
  const bool dense_decode = role == MlaKernelRole::kDecode && dense;
  std::string s = dense_decode ? "mla_dense_decode" : role_name(role);
  if (role == MlaKernelRole::kDecode) s += "_" + variant;
  if (dense_decode || model1()) {
    s += '_';
    s += kv_format_name(kv_format);
  }
  if (role == MlaKernelRole::kCombine && combine_split) s += "_split";
  if (role == MlaKernelRole::kDecode && checked) s += "_chk";
  if (role == MlaKernelRole::kDecode && variant == "sm90") {
    s += render_sm90(page_size, sm90, dense, kv_format, extra_page_size, checked, tma).suffix;
  }
  if (lse_pos_inf && (role == MlaKernelRole::kDecode || role == MlaKernelRole::kCombine)) s += "_lsepinf";
  s += "_sm" + std::to_string(arch);
  return s;
}

jit::JitSpec MlaKernelKey::spec() const {
  jit::JitSpec spec;
  spec.name = name();
  spec.arch = arch;
  std::string header;
  switch (role) {
    case MlaKernelRole::kSchedule:
      header = model1() ? "kernels/mla/schedule/entry_model1.cuh" : "kernels/mla/schedule/entry.cuh";
      spec.entry = "deca_mla_sparse_schedule";
      break;
    case MlaKernelRole::kDecode:
      if (variant == "sm90") {
        header = "kernels/mla/sm90/entry.cuh";
        spec.entry = "deca_mla_sparse_decode_sm90";
      } else if (dense) {
        header = "kernels/mla/sm80/dense_entry.cuh";
        spec.entry = "deca_mla_dense_decode";
      } else if (model1()) {
        header = "kernels/mla/sm80/model1_entry.cuh";
        spec.entry = "deca_mla_sparse_decode";
      } else {
        header = checked ? "kernels/mla/sm80/entry_checked.cuh" : "kernels/mla/sm80/entry.cuh";
        spec.entry = "deca_mla_sparse_decode";
      }
      break;
    case MlaKernelRole::kCombine:
      if (combine_split) {
        header = model1() ? "kernels/mla/combine/entry_model1_split.cuh"
                          : "kernels/mla/combine/entry_split.cuh";
      } else {
        header = model1() ? "kernels/mla/combine/entry_model1.cuh" : "kernels/mla/combine/entry.cuh";
      }
      spec.entry = "deca_mla_sparse_combine";
      break;
    case MlaKernelRole::kGenericCombine:
      header = "kernels/mla/combine/generic_entry.cuh";
      spec.entry = "deca_combine";
      break;
  }
  std::string prologue;
  if (role == MlaKernelRole::kDecode && variant == "sm90") {
    prologue = render_sm90(page_size, sm90, dense, kv_format, extra_page_size, checked, tma).prologue;
  } else if (role == MlaKernelRole::kDecode && dense) {
    prologue = std::string("struct Cfg {\n  static constexpr bool kChecked = ") + (checked ? "true" : "false") +
               ";\n  static constexpr int kKvFormat = " + std::to_string(kv_format) + ";\n};\n";
  } else if (role == MlaKernelRole::kDecode && model1()) {
    prologue = std::string("struct Cfg {\n  static constexpr bool kChecked = ") + (checked ? "true" : "false") +
               ";\n};\n";
  }
  if (lse_pos_inf && (role == MlaKernelRole::kDecode || role == MlaKernelRole::kCombine)) {
    prologue += "#define DECA_MLA_LSE_EMPTY_POS_INF 1\n";
  }
  spec.source = "// " + spec.name + "\n" + prologue + "#include \"" + header + "\"\n";
  return spec;
}

int mla_plan_blocks(const MlaConfig& config) {
  const auto blocks = [](int n) { return n <= 0 ? 0 : (n - 1) / mla::kTopkBlock + 1; };
  if (!config.sparse) return blocks(config.max_seq_len);
  return blocks(config.topk) + (mla_kv_format(config) == kMlaKvModel1 ? blocks(config.extra_topk) : 0);
}

bool mla_combine_split(const MlaConfig& config, int num_parts) {
  return plan::mla_split_combine(config.max_batch, mla_plan_blocks(config), num_parts);
}

std::string mla_decode_variant(int arch) {
  if (arch != 90) return "portable";
  if (tuning_override(Tuning::kMlaKernel, "plan_mla_decode")) return "portable";
  return "sm90";
}

int mla_kv_format(const MlaConfig& config) {
  switch (config.kv_format) {
    case MlaCacheFormat::kBF16: return kMlaKvBF16;
    case MlaCacheFormat::kFP8E4M3: return kMlaKvFP8E4M3;
    case MlaCacheFormat::kFP8Sparse: return kMlaKvFP8Sparse;
    case MlaCacheFormat::kModel1: return kMlaKvModel1;
    case MlaCacheFormat::kDefault: break;
  }
  return config.sparse ? kMlaKvFP8Sparse : kMlaKvBF16;
}

bool mla_dense_sm90_supported(int kv_format) {
  return kv_format == kMlaKvBF16 || kv_format == kMlaKvFP8E4M3 || kv_format == kMlaKvFP8Sparse;
}

bool mla_model1_sm90_supported() { return true; }

std::string mla_plan_variant(int arch, const MlaConfig& config) {
  if (!config.sparse && !mla_dense_sm90_supported(mla_kv_format(config))) return "portable";
  if (mla_kv_format(config) == kMlaKvModel1 && !mla_model1_sm90_supported()) return "portable";
  return mla_decode_variant(arch);
}

MlaKernelKey mla_decode_key(int arch, const std::string& variant, const MlaConfig& config) {
  MlaKernelKey k;
  k.arch = arch;
  k.role = MlaKernelRole::kDecode;
  k.variant = variant;
  k.checked = config.checked;
  k.dense = !config.sparse;
  k.kv_format = mla_kv_format(config);
  k.lse_pos_inf = config.lse_of_empty_row == MlaLseOfEmptyRow::kPosInf;
  refuse_retired_tuning("plan_mla_decode");
  if (variant != "sm90") return k;
  k.page_size = config.page_size;
  // The direct kernel reads records from its ring (the 656-byte token, or MODEL1's sparse one);
  // dense bf16 / e4m3 rows only the wide kernel's producers.
  const bool tile_only = k.dense && k.kv_format != kMlaKvFP8Sparse;
  k.sm90 = mla::sm90::kernel_class(config.num_heads, tile_only);
  k.tma = mla_dense_tma_rows(k.dense, k.kv_format, k.sm90, k.page_size);
  // Without a second cache its page size is never read (validate_extra leaves it unchecked: 0 or
  // below is allowed) and would be a divisor compiled in: MlaConfig's default stands in, so such
  // plans share one kernel.
  if (k.model1()) k.extra_page_size = config.extra_topk > 0 ? config.extra_page_size : MlaConfig{}.extra_page_size;
  return k;
}

MlaDecodeShape mla_decode_shape(const MlaKernelKey& key) {
  MlaDecodeShape s;
  if (key.variant == "sm90") {
    s.threads = mla::sm90::threads_of(key.sm90.direct);
    s.smem_bytes = mla::sm90::kSmemBytes;
    s.cluster_x = key.sm90.cluster;
    return s;
  }
  s.threads = mla::portable::kThreads;
  s.smem_bytes = mla::portable::kSmemBytes;
  s.cluster_x = 1;
  return s;
}

}  // namespace deca::cuda
