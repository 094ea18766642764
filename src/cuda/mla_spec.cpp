#include "cuda/mla_spec.hpp"

#include "cuda/tuning.hpp"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/mla/params.cuh"
#include "kernels/mla/sm80/traits.cuh"

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

// The sm90 knobs as data: Cfg field, environment variable and its range, and the kernel-name
// suffix (left out at the `neutral` value; `number`: followed by the value).
struct Knob {
  int MlaSm90Knobs::*member;
  const char* cfg;
  const char* env;
  int lo, hi;
  const char* suffix;
  int neutral;
  bool number;
};
constexpr Knob kKnobs[] = {
    {&MlaSm90Knobs::cluster, "kCluster", "DECA_MLA_CLUSTER", 1, 2, "_c", 1, true},
    {&MlaSm90Knobs::pipe, "kPipe", "DECA_MLA_PIPE", 0, 4, "_pipe", 0, true},
    {&MlaSm90Knobs::dequant, "kDequant", "DECA_MLA_DEQUANT", 0, 2, "_deq", 0, true},
    {&MlaSm90Knobs::sync, "kSync", "DECA_MLA_SYNC", 0, 1, "_sync", 0, true},
    {&MlaSm90Knobs::prefetch, "kPrefetch", "DECA_MLA_PREFETCH", 0, 3, "_pf", 0, true},
    {&MlaSm90Knobs::ahead, "kAhead", "DECA_MLA_AHEAD", 1, 8, "_ahead", 2, true},
    {&MlaSm90Knobs::map, "kMap", "DECA_MLA_MAP", 0, 3, "_map", 0, true},
    {&MlaSm90Knobs::l1, "kL1", "DECA_MLA_L1", 0, 1, "_l1e", 0, true},
    {&MlaSm90Knobs::rescale, "kRescale", "DECA_MLA_RESCALE", 0, 2, "_rs", 2, true},
    {&MlaSm90Knobs::phand, "kPHand", "DECA_MLA_PHAND", 0, 3, "_pr", 0, true},
    {&MlaSm90Knobs::producers, "kProducers", "DECA_MLA_PRODUCERS", 1, 2, "_w", 1, true},
    {&MlaSm90Knobs::peer_copy, "kPeerCopy", "DECA_MLA_PEERCOPY", 0, 1, "_bulk", 0, false},
    {&MlaSm90Knobs::seesaw, "kSeesaw", "DECA_MLA_SEESAW", 0, 2, "_see", 0, true},
    {&MlaSm90Knobs::stage, "kStage", "DECA_MLA_STAGE", 0, 1, "_stage", 0, false},
    {&MlaSm90Knobs::narrow, "kNarrow", "DECA_MLA_NARROW", 0, 1, "_narrow", 0, false},
    {&MlaSm90Knobs::direct, "kDirect", "DECA_MLA_DIRECT", 0, 3, "_direct", 0, true},
    {&MlaSm90Knobs::stamp, "kStamp", "DECA_MLA_STAMP", 0, 2, "_stamp", 0, true},
};

// The cache format's part of a dense decode kernel's name (MlaKvFormat).
const char* kv_format_name(int kv_format) {
  switch (kv_format) {
    case kMlaKvBF16: return "bf16";
    case kMlaKvFP8E4M3: return "fp8_e4m3";
    case kMlaKvFP8Sparse: return "fp8_sparse";
  }
  return "fmt";
}

}  // namespace

MlaSm90Knobs mla_sm90_consistent(MlaSm90Knobs k, int num_heads) {
  const bool two_blocks = num_heads > 64 && num_heads <= 128;
  if (!two_blocks) k.cluster = 1;
  if (k.cluster != 2) k.sync = 0;  // only a cluster has hand-overs between CTAs
  // The sector-completing pair exchange is for the stores into the peer's tile.
  if (k.map == 2 && k.cluster != 2) k.map = 0;
  // The integer route needs registers: one producer's pipe 3, or two producers' pipe 2.
  if (k.dequant == 1 && !((k.producers == 1 && k.pipe == 3) || (k.producers == 2 && k.pipe == 2))) k.dequant = 0;
  if (k.producers == 2 && k.dequant == 2) k.dequant = 0;  // two producers: not the mma route (below)
  // The whole-row pieces (half the shared-store wavefronts of the unit split, whole 128-byte rows
  // into the peer's tile) convert with the hardware conversions or the integer placement: the
  // mma route asked for keeps the unit split. One producer's whole share of 64 tokens (pipes 2
  // and 3 without a cluster) in rows is 16 x 6 registers: it spills (216 B, NVRTC).
  if (k.map == 3 && k.dequant == 2) k.map = 0;
  if (k.map == 3 && k.cluster == 1 && k.producers == 1 && k.pipe >= 2) k.map = 0;
  // The tensor-core f16 -> f32 step: pipes 2 to 4, the unit split (a quad of lanes on one token)
  // and a cluster of 2 (without one the producer's 16 units per block spill there: NVRTC, 36-96 B).
  if (k.dequant == 2 && (k.pipe < 2 || k.map != 0 || k.cluster != 2)) k.dequant = 0;
  if (k.pipe == 0) {
    k.ahead = 2;  // the base producer prefetches two blocks ahead, fixed
    k.map = 0;    // and has the unit split only
  }
  // Two producer warpgroups (72 registers each): the ids a block ahead with 4 units per round
  // (pipe 1) or the stream of 2-unit rounds (pipe 4), and pipes 2 and 3 (a warpgroup's whole
  // share in one round: 16 tokens in a cluster; 32 without one, at 80 registers, traits.cuh
  // reg_budget, where they spill 4 / 12 B, NVRTC). Their consumers
  // split P V in N = 128 halves (sm90_ptx.cuh); the mma dequantization is left out.
  if (k.producers == 2) {
    if (k.pipe == 0) k.pipe = 1;
    if (k.map == 1) k.map = 0;
    // P in consumer 1's registers (176 of them): in a cluster, whose producers fit in 56
    // (traits.cuh reg_budget), with pipes 1 and 2.
    if (k.phand == 1 && (k.cluster != 2 || k.pipe > 2)) k.phand = 0;
  }
  if (k.pipe == 4) k.map = 0;  // the round stream has the unit split only
  // The bulk copies into the peer's tile: a cluster, the block producer (pipes 1-3), not the
  // token split.
  if (k.peer_copy == 1 && (k.cluster != 2 || k.pipe < 1 || k.pipe > 3 || k.map == 1)) k.peer_copy = 0;
  if (k.pipe > 2 && k.phand == 1) k.phand = 0;  // P in consumer 1's registers: 16 registers from consumer 0, pipes 0-2
  // The hand-over after P V moves ptxas' allocation so that pipe 2's producer spills without a
  // cluster (88 B, NVRTC); every other producer compiles clean with it.
  if (k.phand == 2 && k.pipe == 2 && k.cluster == 1 && k.producers == 1) k.phand = 0;
  // The next block's S issued behind P V: so do pipes 2 and 3 without a cluster (one producer;
  // 40-88 B, NVRTC).
  if (k.phand == 3 && k.cluster == 1 && (k.pipe == 2 || k.pipe == 3)) k.phand = 0;
  // The seesaw consumers (200 registers each): two producers at 56, in a cluster, pipes 1 and 2.
  // They hand P over their own way: kPHand is left at its neutral value.
  if (k.seesaw != 0 && (k.cluster != 2 || k.producers != 2 || k.pipe < 1 || k.pipe > 2)) k.seesaw = 0;
  if (k.seesaw != 0) k.phand = 0;
  // The staged records live in the Q tile's rows 16..63: at most 16 heads, and the producer
  // written for it (two warpgroups' whole shares in rows, no cluster).
  if (k.stage == 1 && (num_heads > 16 || k.cluster != 1 || k.producers != 2 || k.pipe != 2 || k.map != 3)) {
    k.stage = 0;
  }
  // The heads on N = 16: one head block of at most 16, not the seesaw; its consumers take P from
  // shared memory (kPHand 1, P in consumer 1's registers, has no meaning there: left out).
  if (k.narrow == 1 && (num_heads > 16 || k.cluster != 1 || k.seesaw != 0 || k.phand == 1)) k.narrow = 0;
  // No bf16 tile: one head block of at most 16 (N = 16), without a cluster. Its kernel has its own
  // producer and consumers (direct.cuh), so every other producer and consumer knob goes back to
  // its neutral value (one name per kernel); the timing aid stays.
  if (k.direct != 0 && (num_heads > 16 || k.cluster != 1)) k.direct = 0;
  if (k.direct != 0) {
    MlaSm90Knobs d;
    for (const Knob& knob : kKnobs) d.*knob.member = knob.neutral;
    d.direct = k.direct;
    d.stamp = k.stamp;
    return d;
  }
  return k;
}

MlaSm90Knobs mla_sm90_defaults(int cluster, int num_heads) {
  MlaSm90Knobs k;
  k.cluster = cluster;
  // Both: a producer warpgroup's whole share of a block in one round (pipe 2). Without a cluster
  // the gather's loads also allocate in L1 (evict_last): the whole-row pieces read each record
  // line in several instructions (2026-12-02, H200: b128 h64 116.5 -> 110.6 -> 107.9 us).
  k.pipe = 2;
  k.l1 = cluster == 2 ? 0 : 1;
  k.ahead = 1;
  // In a cluster P goes to consumer 1's registers (its producers at 56 registers leave room):
  // no proxy fence in consumer 0's hand-over (2026-12-02, H200: b128 h128 181.6 -> 174.5 us,
  // b64 h128 95.8 -> 92.5).
  k.phand = cluster == 2 ? 1 : 2;
  k.producers = 2;
  k.map = 3;
  // At 16 heads or fewer: no bf16 tile, the records multiplied from registers, 16-byte copies and
  // alternating consumers (H200, b128 h16 whole op: 77.1 us with the heads on N and the staged
  // records at 3d7c2ea, 59.9 at 15f1f30; mla_spec.hpp has the steps). The consistency rules then
  // put every other knob at its neutral value.
  if (cluster == 1 && num_heads <= 16) k.direct = 3;
  return k;
}

MlaSm90Knobs mla_sm90_knobs_from_env(int num_heads) {
  int cluster = 1;
#if DECA_MLA_HAVE_SM90
  cluster = mla::sm90::kClusterX(num_heads);
#endif
  MlaSm90Knobs k = mla_sm90_defaults(cluster, num_heads);
  for (const Knob& knob : kKnobs) {
    const char* env = std::getenv(knob.env);
    // One digit in range; anything else leaves the default.
    if (env != nullptr && env[0] >= '0' + knob.lo && env[0] <= '0' + knob.hi && env[1] == '\0') {
      k.*knob.member = env[0] - '0';
    }
  }
  return mla_sm90_consistent(k, num_heads);
}

// Built with std::to_string and appends, never iostreams (see gqa_spec.cpp for the locale trap).
std::string MlaKernelKey::name() const {
  const bool dense_decode = role == MlaKernelRole::kDecode && dense;
  std::string s = dense_decode ? "mla_dense_decode" : role_name(role);
  if (role == MlaKernelRole::kDecode) s += "_" + variant;
  if (dense_decode) {
    s += '_';
    s += kv_format_name(kv_format);
  }
  if (role == MlaKernelRole::kDecode && checked) s += "_chk";
  if (role == MlaKernelRole::kDecode && variant == "sm90") {
    s += "_p" + std::to_string(page_size);
    for (const Knob& k : kKnobs) {
      const int v = sm90.*k.member;
      if (v == k.neutral) continue;
      s += k.suffix;
      if (k.number) s += std::to_string(v);
    }
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
      header = "kernels/mla/schedule/entry.cuh";
      spec.entry = "deca_mla_sparse_schedule";
      break;
    case MlaKernelRole::kDecode:
      if (variant == "sm90") {
        header = "kernels/mla/sm90/entry.cuh";
        spec.entry = "deca_mla_sparse_decode_sm90";
      } else if (dense) {
        header = "kernels/mla/sm80/dense_entry.cuh";
        spec.entry = "deca_mla_dense_decode";
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
  if (role == MlaKernelRole::kDecode && variant == "sm90") {
    prologue = "struct Cfg {\n  static constexpr int kPageSize = " + std::to_string(page_size) + ";\n";
    for (const Knob& k : kKnobs) {
      prologue += std::string("  static constexpr int ") + k.cfg + " = " + std::to_string(sm90.*k.member) + ";\n";
    }
    prologue += "  static constexpr int kDense = " + std::to_string(dense ? 1 : 0) + ";\n";
    prologue += "  static constexpr int kKvFormat = " + std::to_string(kv_format) + ";\n";
    prologue += "};\n";
  } else if (role == MlaKernelRole::kDecode && dense) {
    prologue = std::string("struct Cfg {\n  static constexpr bool kChecked = ") + (checked ? "true" : "false") +
               ";\n  static constexpr int kKvFormat = " + std::to_string(kv_format) + ";\n};\n";
  }
  spec.source = "// " + spec.name + "\n" + prologue + "#include \"" + header + "\"\n";
  return spec;
}

std::string mla_decode_variant(int arch) {
  if (!kMlaSm90KernelEnabled || !DECA_MLA_HAVE_SM90 || arch != 90) return "portable";
  if (tuning_override(Tuning::kMlaKernel, "plan_mla_decode")) return "portable";
  return "sm90";
}

int mla_kv_format(const MlaConfig& config) {
  switch (config.kv_format) {
    case MlaCacheFormat::kBF16: return kMlaKvBF16;
    case MlaCacheFormat::kFP8E4M3: return kMlaKvFP8E4M3;
    case MlaCacheFormat::kFP8Sparse: return kMlaKvFP8Sparse;
    case MlaCacheFormat::kDefault: break;
  }
  return config.sparse ? kMlaKvFP8Sparse : kMlaKvBF16;
}

bool mla_dense_sm90_supported(int kv_format) {
  (void)kv_format;
  return false;
}

std::string mla_plan_variant(int arch, const MlaConfig& config) {
  if (config.checked) return "portable";
  if (!config.sparse && !mla_dense_sm90_supported(mla_kv_format(config))) return "portable";
  return mla_decode_variant(arch);
}

MlaKernelKey mla_decode_key(int arch, const std::string& variant, const MlaConfig& config) {
  MlaKernelKey k;
  k.arch = arch;
  k.role = MlaKernelRole::kDecode;
  k.variant = variant;
  k.checked = config.checked && variant == "portable";
  k.dense = !config.sparse;
  k.kv_format = mla_kv_format(config);
  if (variant != "sm90") return k;
  k.page_size = config.page_size;
  k.sm90 = mla_sm90_knobs_from_env(config.num_heads);
  return k;
}

MlaDecodeShape mla_decode_shape(const MlaKernelKey& key) {
  MlaDecodeShape s;
#if DECA_MLA_HAVE_SM90
  if (key.variant == "sm90") {
    s.threads = mla::sm90::threads_of(key.sm90.producers);
    s.smem_bytes = mla::sm90::kSmemBytes;
    s.cluster_x = key.sm90.cluster;
    return s;
  }
#endif
  s.threads = mla::portable::kThreads;
  s.smem_bytes = mla::portable::kSmemBytes;
  s.cluster_x = 1;
  return s;
}

}  // namespace deca::cuda
