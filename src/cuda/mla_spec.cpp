#include "cuda/mla_spec.hpp"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/mla/sparse_traits.cuh"

#if __has_include("kernels/mla/sm90/traits.cuh")
#include "kernels/mla/sm90/traits.cuh"
#define DECA_MLA_HAVE_SM90 1
#else
#define DECA_MLA_HAVE_SM90 0
#endif

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

}  // namespace

// Built with std::to_string and appends, never iostreams (see gqa_spec.cpp for the locale trap).
std::string MlaKernelKey::name() const {
  std::string s = role_name(role);
  if (role == MlaKernelRole::kDecode) s += "_" + variant;
  if (role == MlaKernelRole::kDecode && checked) s += "_chk";
  if (role == MlaKernelRole::kDecode && variant == "sm90") {
    s += "_p" + std::to_string(page_size);
    if (cluster > 1) s += "_c" + std::to_string(cluster);
    if (pipe > 0) s += "_pipe" + std::to_string(pipe);
    if (dequant > 0) s += "_ideq";
    if (sync > 0) s += "_sync" + std::to_string(sync);
    if (prefetch > 0) s += "_pf" + std::to_string(prefetch);
    if (ahead != 2) s += "_ahead" + std::to_string(ahead);
    if (map > 0) s += "_map" + std::to_string(map);
    if (l1 > 0) s += "_l1e" + std::to_string(l1);
  }
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
      header = "kernels/mla/schedule_entry.cuh";
      spec.entry = "deca_mla_sparse_schedule";
      break;
    case MlaKernelRole::kDecode:
      if (variant == "sm90") {
        header = "kernels/mla/sm90/entry.cuh";
        spec.entry = "deca_mla_sparse_decode_sm90";
      } else {
        header = checked ? "kernels/mla/sparse_entry_checked.cuh" : "kernels/mla/sparse_entry.cuh";
        spec.entry = "deca_mla_sparse_decode";
      }
      break;
    case MlaKernelRole::kCombine:
      header = "kernels/mla/combine_entry.cuh";
      spec.entry = "deca_mla_sparse_combine";
      break;
    case MlaKernelRole::kGenericCombine:
      header = "kernels/mla/generic_combine_entry.cuh";
      spec.entry = "deca_combine";
      break;
  }
  std::string prologue;
  if (role == MlaKernelRole::kDecode && variant == "sm90") {
    prologue = "struct Cfg {\n  static constexpr int kPageSize = " + std::to_string(page_size) +
               ";\n  static constexpr int kCluster = " + std::to_string(cluster) +
               ";\n  static constexpr int kPipe = " + std::to_string(pipe) +
               ";\n  static constexpr int kDequant = " + std::to_string(dequant) +
               ";\n  static constexpr int kSync = " + std::to_string(sync) +
               ";\n  static constexpr int kPrefetch = " + std::to_string(prefetch) +
               ";\n  static constexpr int kAhead = " + std::to_string(ahead) +
               ";\n  static constexpr int kMap = " + std::to_string(map) +
               ";\n  static constexpr int kL1 = " + std::to_string(l1) + ";\n};\n";
  }
  spec.source = "// " + spec.name + "\n" + prologue + "#include \"" + header + "\"\n";
  return spec;
}

std::string mla_decode_variant(int arch) {
  if (!kMlaSm90KernelEnabled || !DECA_MLA_HAVE_SM90 || arch != 90) return "portable";
  const char* env = std::getenv("DECA_MLA_KERNEL");
  if (env != nullptr && std::strcmp(env, "portable") == 0) return "portable";
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
  if (variant != "sm90") return k;
  k.page_size = config.page_size;
#if DECA_MLA_HAVE_SM90
  k.cluster = mla::sm90::kClusterX(config.num_heads);
#endif
  const bool two_blocks = config.num_heads > 64 && config.num_heads <= 128;
  if (const char* env = std::getenv("DECA_MLA_CLUSTER")) {
    if (std::strcmp(env, "1") == 0) k.cluster = 1;
    if (std::strcmp(env, "2") == 0 && two_blocks) k.cluster = 2;
  }
  if (!two_blocks) k.cluster = 1;
  k.pipe = kMlaSm90Pipe;
  k.dequant = kMlaSm90Dequant;
  if (const char* env = std::getenv("DECA_MLA_PIPE")) {
    if (env[0] >= '0' && env[0] <= '3' && env[1] == '\0') k.pipe = env[0] - '0';
  }
  if (const char* env = std::getenv("DECA_MLA_DEQUANT")) {
    if (std::strcmp(env, "0") == 0) k.dequant = 0;
    if (std::strcmp(env, "1") == 0) k.dequant = 1;
  }
  if (k.pipe != 3) k.dequant = 0;  // the integer route is built only with pipe 3 (registers)
  k.sync = kMlaSm90Sync;
  k.prefetch = kMlaSm90Prefetch;
  if (const char* env = std::getenv("DECA_MLA_SYNC")) {
    if (std::strcmp(env, "0") == 0) k.sync = 0;
    if (std::strcmp(env, "1") == 0) k.sync = 1;
  }
  if (const char* env = std::getenv("DECA_MLA_PREFETCH")) {
    if (env[0] >= '0' && env[0] <= '3' && env[1] == '\0') k.prefetch = env[0] - '0';
  }
  k.ahead = kMlaSm90Ahead;
  if (const char* env = std::getenv("DECA_MLA_AHEAD")) {
    if (env[0] >= '1' && env[0] <= '8' && env[1] == '\0') k.ahead = env[0] - '0';
  }
  if (k.pipe == 0) k.ahead = 2;  // the base producer prefetches two blocks ahead, fixed
  k.map = kMlaSm90Map;
  if (const char* env = std::getenv("DECA_MLA_MAP")) {
    if (std::strcmp(env, "0") == 0) k.map = 0;
    if (std::strcmp(env, "1") == 0) k.map = 1;
  }
  if (k.pipe == 0) k.map = 0;  // the base producer has the unit split only
  k.l1 = kMlaSm90L1;
  if (const char* env = std::getenv("DECA_MLA_L1")) {
    if (std::strcmp(env, "0") == 0) k.l1 = 0;
    if (std::strcmp(env, "1") == 0) k.l1 = 1;
  }
  if (k.cluster != 2) k.sync = 0;  // only a cluster has hand-overs between CTAs
  return k;
}

MlaDecodeShape mla_decode_shape(const std::string& variant, int num_heads) {
  MlaDecodeShape s;
#if DECA_MLA_HAVE_SM90
  if (variant == "sm90") {
    s.threads = mla::sm90::kThreads;
    s.smem_bytes = mla::sm90::kSmemBytes;
    s.cluster_x = mla::sm90::kClusterX(num_heads);
    return s;
  }
#endif
  (void)variant;
  (void)num_heads;
  s.threads = mla::portable::kThreads;
  s.smem_bytes = mla::portable::kSmemBytes;
  s.cluster_x = 1;
  return s;
}

}  // namespace deca::cuda
