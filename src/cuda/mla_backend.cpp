// MLA decode on the GPU: plan (partitions, workspace, kernels) and the three launches of a run
// (scheduler, decode, combine), shared by sparse and dense decode (src/cuda/mla_run.hpp); the
// sparse run's entry; the generic combine op.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/backend.hpp"
#include "cuda/mla_run.hpp"
#include "cuda/mla_spec.hpp"
#include "cuda/mla_tma.hpp"
#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "jit/kernel_cache.hpp"
#include "kernels/common/check_record.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "kernels/mla/launch.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::cuda {

namespace {

constexpr std::size_t kAlign = 256;
constexpr unsigned kMaxGridYZ = 65535;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Workspace: partial outputs first (the big, 16-byte-loaded buffer at the aligned base), then
// partial LSEs, the partitions, the split offsets and the schedule's stamp. Sized for the plan's
// maxima: slots are at most batch + num_parts (kernels/mla/schedule/schedule.cuh). A checked plan's
// CheckRecord comes last, where check_mla_run reads it.
struct Layout {
  std::size_t o = 0, lse = 0, parts = 0, offsets = 0, stamp = 0, check = 0;
  int max_slots = 0;
  std::size_t total() const { return o + lse + parts + offsets + stamp + check; }
};

Layout layout(const MlaConfig& c, int num_parts) {
  Layout w;
  w.max_slots = c.max_batch + num_parts;
  const auto rows = static_cast<std::size_t>(w.max_slots) * c.max_q_len * c.num_heads;
  w.o = align_up(rows * kMlaDimV * sizeof(float));
  w.lse = align_up(rows * sizeof(float));
  w.parts = align_up(static_cast<std::size_t>(num_parts) * sizeof(mla::SparsePart));
  w.offsets = align_up((static_cast<std::size_t>(c.max_batch) + 1) * sizeof(int));
  w.stamp = align_up(sizeof(mla::ScheduleStamp));
  if (c.checked) w.check = static_cast<std::size_t>(kCheckBytes);
  return w;
}

int head_blocks(int num_heads) { return (num_heads + 63) / 64; }

// Both combine kernels (the MLA split merge and the generic op): a warp per (request, token,
// head), kCombineWarps heads per CTA; `split` (the MLA combine spread over the value dims,
// mla_combine_split): a CTA per (request, token, head).
jit::Dim3 combine_grid(int num_heads, int q_len, int batch, bool split = false) {
  jit::Dim3 grid;
  const int per_cta = split ? 1 : mla::kCombineWarps;
  grid.x = static_cast<unsigned>((num_heads + per_cta - 1) / per_cta);
  grid.y = static_cast<unsigned>(q_len);
  grid.z = static_cast<unsigned>(batch);
  return grid;
}

jit::Dim3 combine_block(bool split = false) {
  jit::Dim3 block;
  block.x = split ? mla::kCombineSplitThreads : mla::kCombineThreads;
  return block;
}

struct Kernels {
  int arch = 0;
  std::string variant;
  MlaDecodeShape shape;
  const jit::LoadedKernel* schedule;
  const jit::LoadedKernel* decode;
  const jit::LoadedKernel* combine;
  bool combine_split;
  bool tma;  // the decode kernel reads dense bf16 rows by TMA: each run encodes the cache's map
};

// The scheduler or combine key beside decode key `dk`: MODEL1's read both caches' lists; the
// combine writes the decode kernel's convention for empty rows, spread over the value dims when
// `combine_split`.
MlaKernelKey key(const MlaKernelKey& dk, MlaKernelRole role, bool combine_split = false) {
  MlaKernelKey k;
  k.arch = dk.arch;
  k.role = role;
  if (dk.model1()) k.kv_format = dk.kv_format;
  if (role == MlaKernelRole::kCombine) {
    k.lse_pos_inf = dk.lse_pos_inf;
    k.combine_split = combine_split;
  }
  return k;
}

// Every decode kernel set a plan made, by (MlaPlan::kernel_name, head count, device): loaded
// once and kept, so a run does one map lookup, no hashing, compiling or device queries, and finds
// the kernels its plan named even if DECA_MLA_KERNEL changed since.
std::mutex registry_mu;
std::map<std::pair<std::string, int>, Kernels> registry;

std::pair<std::string, int> registry_id(const std::string& plan_name, int num_heads, int device) {
  return std::make_pair(plan_name + "_h" + std::to_string(num_heads), device);
}

// MlaPlan::kernel_name: the decode kernel's name, and "+" the combine's when it is not the
// warp-per-row one (mla_combine_split), so that a plan and a benchmark row say what they run.
std::string plan_name(const MlaKernelKey& dk, bool combine_split) {
  return combine_split ? dk.name() + "+" + key(dk, MlaKernelRole::kCombine, true).name() : dk.name();
}

const Kernels& kernels(const MlaKernelKey& dk, bool combine_split, int num_heads, int device) {
  const auto id = registry_id(plan_name(dk, combine_split), num_heads, device);
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    if (auto it = registry.find(id); it != registry.end()) return it->second;
  }
  Kernels k;
  k.arch = dk.arch;
  k.variant = dk.variant;
  k.shape = mla_decode_shape(dk);
  k.schedule = &jit::get_kernel(key(dk, MlaKernelRole::kSchedule).spec(), device);
  k.decode = &jit::get_kernel(dk.spec(), device);
  k.combine = &jit::get_kernel(key(dk, MlaKernelRole::kCombine, combine_split).spec(), device);
  k.combine_split = combine_split;
  k.tma = dk.tma;
  std::lock_guard<std::mutex> lock(registry_mu);
  return registry.try_emplace(id, k).first->second;
}

// The kernels a run of `plan` launches: those plan_mla_decode loaded for it. A plan this process
// did not make (a copy with a hand-set name) is accepted only when its name is what its config
// gives here now; one from another device kind is refused.
const Kernels& plan_kernels(const MlaPlan& plan, const std::string& fn) {
  const int device = plan.config.device.index;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    const auto it = registry.find(registry_id(plan.kernel_name, plan.config.num_heads, device));
    if (it != registry.end()) return it->second;
  }
  const int arch = compute_capability(device);
  const MlaKernelKey dk = mla_decode_key(arch, mla_plan_variant(arch, plan.config), plan.config);
  const bool split = mla_combine_split(plan.config, plan.num_parts);
  if (plan_name(dk, split) != plan.kernel_name) {
    throw Error(fn + ": plan.kernel_name: expected the name of a decode kernel this "
                "device runs (\"" + plan_name(dk, split) + "\" for this config here), got \"" +
                plan.kernel_name + "\": make the plan again with plan_mla_decode");
  }
  return kernels(dk, split, plan.config.num_heads, device);
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

int checked_arch(const Device& dev, const std::string& fn) {
  const int device = dev.index;
  if (device < 0 || device >= device_count()) {
    throw Error(fn + ": config.device: expected a CUDA device index in [0, " +
                std::to_string(device_count()) + "), got " + to_string(dev));
  }
  const int arch = compute_capability(device);
  if (arch < 80) {
    throw Error(fn + ": config.device: expected compute capability >= 8.0 (mma.sync, bf16), got " +
                std::to_string(arch / 10) + "." + std::to_string(arch % 10));
  }
  return arch;
}

}  // namespace

void plan_mla_run(MlaPlan& plan) {
  const MlaConfig& c = plan.config;
  constexpr const char* fn = "plan_mla_decode";
  const int device = c.device.index;
  const int arch = checked_arch(c.device, fn);
  if (c.max_batch > static_cast<int>(kMaxGridYZ) || c.max_q_len > static_cast<int>(kMaxGridYZ)) {
    throw Error(std::string(fn) + ": config.max_batch / max_q_len: expected <= 65535 on CUDA " +
                "(grid extents), got " + std::to_string(c.max_batch) + " / " +
                std::to_string(c.max_q_len));
  }
  const std::string variant = mla_plan_variant(arch, c);
  const MlaKernelKey dk = mla_decode_key(arch, variant, c);
  const MlaDecodeShape shape = mla_decode_shape(dk);
  const int smem_optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (smem_optin < shape.smem_bytes) {
    throw Error(std::string(fn) + ": config.device: expected a GPU whose CTAs may use " +
                std::to_string(shape.smem_bytes) + " bytes of shared memory (the " + variant +
                (c.sparse ? " MLA sparse" : " MLA dense") + " decode kernel; A100 / H100 class), got " +
                to_string(c.device) + " with " + std::to_string(smem_optin));
  }
  plan.sm_count = sm_count(device);
  plan.num_parts = mla::decode_num_parts(plan.sm_count, c.max_q_len, c.num_heads);
  plan.num_splits = plan.num_parts;
  plan.workspace_bytes = layout(c, plan.num_parts).total();
  const bool split = mla_combine_split(c, plan.num_parts);
  plan.kernel_name = plan_name(dk, split);
  (void)kernels(dk, split, c.num_heads, device);
}

void run_mla_decode(const MlaPlan& plan, mla::DecodeKernelParams& kp, void* workspace, void* stream,
                    bool reuse_schedule, bool combine, const std::string& fn) {
  const MlaConfig& c = plan.config;
  if (plan.num_parts < 1) {
    throw Error(fn + ": plan.num_parts: expected >= 1 (a plan made by plan_mla_decode for a CUDA "
                "device), got " + std::to_string(plan.num_parts));
  }
  const Kernels& k = plan_kernels(plan, fn);
  const MlaSparseParams& params = kp.p;
  if (params.batch == 0) return;
  mla::TensorMapBytes kv_map{};  // the TMA rows kernel's second parameter
  if (k.tma) encode_dense_rows_map(kp, kv_map, fn.c_str());
  const int device = c.device.index;
  const Layout w = layout(c, plan.num_parts);
  auto* base = static_cast<unsigned char*>(workspace);

  kp.run.partial_o = reinterpret_cast<float*>(base);
  kp.run.partial_lse = reinterpret_cast<float*>(base + w.o);
  kp.run.parts = reinterpret_cast<const mla::SparsePart*>(base + w.o + w.lse);
  kp.run.split_offsets = reinterpret_cast<const int*>(base + w.o + w.lse + w.parts);
  kp.run.num_parts = plan.num_parts;
  kp.run.max_slots = w.max_slots;
  kp.run.check = w.check ? base + (w.total() - w.check) : nullptr;
  kp.run.stamp = reinterpret_cast<mla::ScheduleStamp*>(base + w.o + w.lse + w.parts + w.offsets);
  void* args[] = {&kp};

  jit::ScopedDevice scope(device);
  if (!reuse_schedule) {
    // The scheduler stages partitions and offsets in shared memory when they fit
    // (kernels/mla/schedule/entry.cuh says why); 0 bytes selects its global-memory path.
    const std::size_t schedule_smem = static_cast<std::size_t>(plan.num_parts) *
                                          sizeof(mla::SparsePart) +
                                      (static_cast<std::size_t>(params.batch) + 1) * sizeof(int);
    jit::Dim3 one;
    jit::Dim3 schedule_block;
    schedule_block.x = mla::kScheduleThreads;
    jit::launch(*k.schedule, one, schedule_block,
                schedule_smem <= static_cast<std::size_t>(mla::kScheduleSmemLimit) ? schedule_smem : 0,
                stream, args);
  }

  jit::Dim3 grid;
  grid.x = static_cast<unsigned>(head_blocks(params.num_heads));
  grid.y = static_cast<unsigned>(params.q_len);
  grid.z = static_cast<unsigned>(plan.num_parts);
  jit::Dim3 block;
  block.x = static_cast<unsigned>(k.shape.threads);
  jit::LaunchOptions decode_options;
  // The sm90 kernel waits on griddepcontrol before it reads the scheduler's output, so its
  // prologue (barrier setup, Q loads) may overlap the scheduler's tail; the portable one does
  // not wait and must not be launched early.
  decode_options.pdl = k.variant == "sm90";
  if (k.shape.cluster_x > 1) {
    decode_options.cluster.x = static_cast<unsigned>(k.shape.cluster_x);
    decode_options.cluster.y = 1;
    decode_options.cluster.z = 1;
  }
  void* tma_args[] = {&kp, &kv_map};
  jit::launch(*k.decode, grid, block, static_cast<std::size_t>(k.shape.smem_bytes), stream, k.tma ? tma_args : args,
              decode_options);

  if (!combine) return;
  jit::LaunchOptions combine_options;
  // PDL needs sm_90; below, the attribute would be ignored at best.
  combine_options.pdl = k.arch >= 90;
  jit::launch(*k.combine, combine_grid(params.num_heads, params.q_len, params.batch, k.combine_split),
              combine_block(k.combine_split), 0, stream, args, combine_options);
}

void plan_mla_sparse(MlaPlan& plan) { plan_mla_run(plan); }

void mla_sparse_decode(const MlaPlan& plan, const MlaSparseParams& params, void* workspace,
                       void* stream, bool reuse_schedule) {
  mla::DecodeKernelParams kp{};
  kp.p = params;
  // Without lengths the schedule is a function of (batch, topk (+ extra_topk), num_parts): when
  // it cuts no request the decode kernel wrote every output itself and the combine is left out
  // (launched, it costs its launch and one wave of CTAs per 132 (request, 8 heads) that return
  // at once: b128 h128 a few us). A reused schedule of another shape gets NaN outputs from the
  // decode kernel either way.
  const mla::TopkLists lists = params.kv_format == kMlaKvModel1 ? mla::topk_lists<true>(params)
                                                                : mla::topk_lists<false>(params);
  const bool combine = mla::uniform_blocks(lists) < 0 ||
                       (plan.num_parts >= 1 &&
                        mla::schedule_cuts_requests(params.batch, lists, plan.num_parts));
  run_mla_decode(plan, kp, workspace, stream, reuse_schedule, combine, "mla_decode_sparse");
}

int mla_arch(const MlaConfig& config, const std::string& fn) { return checked_arch(config.device, fn); }

std::string precompile_mla(const MlaConfig& config, int arch) {
  const MlaKernelKey dk = mla_decode_key(arch, mla_plan_variant(arch, config), config);
  (void)jit::compile_only(key(dk, MlaKernelRole::kSchedule).spec());
  (void)jit::compile_only(dk.spec());
  // The combine a plan takes depends on the device's SM count (mla_combine_split): both.
  for (bool split : {false, true}) (void)jit::compile_only(key(dk, MlaKernelRole::kCombine, split).spec());
  return dk.name();
}

void combine(const CombineParams& params, int device, void* stream) {
  if (params.batch > static_cast<int>(kMaxGridYZ) || params.q_len > static_cast<int>(kMaxGridYZ)) {
    throw Error("combine: partial_out: expected batch and q_len <= 65535 on CUDA (grid extents), "
                "got " + std::to_string(params.batch) + " and " + std::to_string(params.q_len));
  }
  const int arch = checked_arch(Device::cuda(device), "combine");
  MlaKernelKey generic;
  generic.arch = arch;
  generic.role = MlaKernelRole::kGenericCombine;
  const jit::LoadedKernel& k = jit::get_kernel(generic.spec(), device);
  CombineParams p = params;
  void* args[] = {&p};
  jit::ScopedDevice scope(device);
  jit::launch(k, combine_grid(p.num_heads, p.q_len, p.batch), combine_block(), 0, stream, args);
}

}  // namespace deca::cuda
