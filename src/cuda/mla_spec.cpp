#include "cuda/mla_spec.hpp"

#include "cuda/tuning.hpp"

#include <string>

#include "kernels/mla/sm80/traits.cuh"
#include "kernels/mla/sm90/traits.cuh"

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
Sm90Render render_sm90(int page_size, const mla::sm90::KernelClass& k) {
  Sm90Render r;
  r.suffix = "_p" + std::to_string(page_size) + (k.direct ? "_direct" : k.cluster == 2 ? "_c2" : "");
  r.prologue = "struct Cfg {\n  static constexpr int kPageSize = " + std::to_string(page_size) +
               ";\n  static constexpr int kDirect = " + std::to_string(k.direct) +
               ";\n  static constexpr int kCluster = " + std::to_string(k.cluster) + ";\n};\n";
  return r;
}

}  // namespace

// Built with std::to_string and appends, never iostreams (see gqa_spec.cpp for the locale trap).
std::string MlaKernelKey::name() const {
  std::string s = role_name(role);
  if (role == MlaKernelRole::kDecode) s += "_" + variant;
  if (role == MlaKernelRole::kDecode && checked) s += "_chk";
  if (role == MlaKernelRole::kDecode && variant == "sm90") s += render_sm90(page_size, sm90).suffix;
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
      header = "kernels/mla/schedule/entry.cuh";
      spec.entry = "deca_mla_sparse_schedule";
      break;
    case MlaKernelRole::kDecode:
      if (variant == "sm90") {
        header = "kernels/mla/sm90/entry.cuh";
        spec.entry = "deca_mla_sparse_decode_sm90";
      } else {
        header = checked ? "kernels/mla/sm80/entry_checked.cuh" : "kernels/mla/sm80/entry.cuh";
        spec.entry = "deca_mla_sparse_decode";
      }
      break;
    case MlaKernelRole::kCombine:
      header = "kernels/mla/combine/entry.cuh";
      spec.entry = "deca_mla_sparse_combine";
      break;
    case MlaKernelRole::kGenericCombine:
      header = "kernels/mla/combine/generic_entry.cuh";
      spec.entry = "deca_combine";
      break;
  }
  std::string prologue;
  if (role == MlaKernelRole::kDecode && variant == "sm90") prologue = render_sm90(page_size, sm90).prologue;
  spec.source = "// " + spec.name + "\n" + prologue + "#include \"" + header + "\"\n";
  return spec;
}

std::string mla_decode_variant(int arch) {
  if (arch != 90) return "portable";
  if (tuning_override(Tuning::kMlaKernel, "plan_mla_decode")) return "portable";
  return "sm90";
}

std::string mla_plan_variant(int arch, const MlaConfig& config) {
  return config.checked ? "portable" : mla_decode_variant(arch);
}

MlaKernelKey mla_decode_key(int arch, const std::string& variant, const MlaConfig& config) {
  MlaKernelKey k;
  k.arch = arch;
  k.role = MlaKernelRole::kDecode;
  k.variant = variant;
  k.checked = config.checked && variant == "portable";
  refuse_retired_tuning("plan_mla_decode");
  if (variant != "sm90") return k;
  k.page_size = config.page_size;
  k.sm90 = mla::sm90::kernel_class(config.num_heads);
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
