// GQA decode on the GPU: plan (kernel key, occupancy, split count, workspace) and launch.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cuda/backend.hpp"
#include "cuda/gqa_spec.hpp"
#include "cuda/gqa_stamps.hpp"
#include "cuda/tuning.hpp"
#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "jit/kernel_cache.hpp"
#include "kernels/common/check_record.cuh"
#include "plan/gqa_split.hpp"

namespace deca::cuda {

namespace {

// bf16 / fp16 caches on the Hopper kernel (make_gqa_key's hopper_16bit) unless DECA_GQA_SM90_16BIT=0.
bool hopper_16bit(const char* fn) { return tuning_override(Tuning::kGqaSm9016Bit, fn).value_or(1) == 1; }

constexpr int kMaxSplits = 256;
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct WorkspaceLayout {
  std::size_t o_bytes = 0;
  std::size_t ml_bytes = 0;
  std::size_t counter_bytes = 0;
  std::size_t check_bytes = 0;  // checked plans: the CheckRecord, last (check_record.cuh)
  std::size_t split_total() const { return o_bytes + ml_bytes + counter_bytes; }
  std::size_t total() const { return split_total() + check_bytes; }
};

// Rows of one CTA's unit: (beam, q token, group head) of one request and kv head.
int row_blocks(const GqaConfig& c, const GqaKernelKey& key) {
  const int rows_needed = key.beam_width * c.max_q_len * key.group;
  return (rows_needed + key.rows - 1) / key.rows;
}

long long units(const GqaConfig& c, const GqaKernelKey& key) {
  return static_cast<long long>(c.max_batch / key.beam_width) * c.num_kv_heads * row_blocks(c, key);
}

WorkspaceLayout layout(const GqaPlan& plan, const GqaKernelKey& key) {
  WorkspaceLayout w;
  if (plan.config.checked) w.check_bytes = static_cast<std::size_t>(kCheckBytes);
  if (plan.num_splits <= 1) return w;
  const auto u = static_cast<std::size_t>(units(plan.config, key));
  // Partial results: one slot per (unit, split).
  const std::size_t slots = u * static_cast<std::size_t>(plan.num_splits);
  w.o_bytes = align_up(slots * key.rows * plan.config.head_dim * sizeof(float));
  w.ml_bytes = align_up(slots * key.rows * 2 * sizeof(float));
  w.counter_bytes = align_up(u * sizeof(unsigned));
  return w;
}

// Keys one request can see at most: a window bounds it (plus tile alignment slack).
int max_visible_keys(const GqaConfig& c, int tile) {
  if (c.window <= 0) return c.max_seq_len;
  return std::min(c.max_seq_len, c.window + c.max_q_len - 1 + tile);
}

int plan_device(const GqaPlan& plan) { return plan.config.device.index; }

// What a run needs from its plan's kernel: the key (shape, rows, beams) and the loaded function.
struct Prepared {
  GqaKernelKey key;
  const jit::LoadedKernel* kernel;
};

// Runs look their kernel up by the plan's name once per (name, device) and then keep the answer:
// rebuilding the key, its source text and its cache hash (and two device-attribute queries) on
// every launch is host time in every decode step. A plan made in this process has left its
// kernel here already (remember_prepared); a plan from elsewhere is checked against the key its
// config gives on this device now.
std::mutex prepared_mu;
std::map<std::pair<std::string, int>, Prepared>& prepared_memo() {
  static std::map<std::pair<std::string, int>, Prepared> memo;
  return memo;
}

void remember_prepared(int device, const GqaKernelKey& key, const jit::LoadedKernel& kernel) {
  std::lock_guard<std::mutex> lock(prepared_mu);
  prepared_memo().try_emplace(std::make_pair(key.name(), device), Prepared{key, &kernel});
}

const Prepared& prepared_slow(const GqaPlan& plan, int device) {
  auto& memo = prepared_memo();
  {
    std::lock_guard<std::mutex> lock(prepared_mu);
    if (auto it = memo.find(std::make_pair(plan.kernel_name, device)); it != memo.end()) {
      return it->second;
    }
  }
  const GqaKernelKey key = make_gqa_key(plan.config, compute_capability(device), sm_count(device), 0,
                                       hopper_16bit("gqa_decode"));
  if (key.name() != plan.kernel_name) {
    throw Error("gqa_decode: plan.kernel_name: expected \"" + key.name() +
                "\" (what the plan's config gives on this device now), got \"" + plan.kernel_name +
                "\": make the plan again with plan_gqa_decode");
  }
  const jit::LoadedKernel& kernel = jit::get_kernel(key.spec(), device);
  std::lock_guard<std::mutex> lock(prepared_mu);
  return memo.try_emplace(std::make_pair(plan.kernel_name, device), Prepared{key, &kernel})
      .first->second;
}

// A decode step calls every layer with the same few plans from one thread: the last answer per
// thread, compared by name and device, skips the shared map's lock, its string-keyed search and
// the key copy it needs. Entries of the map never move, so the pointer stays valid.
const Prepared& prepared(const GqaPlan& plan) {
  struct Last {
    std::string name;
    int device = -1;
    const Prepared* prep = nullptr;
  };
  thread_local Last last[4];
  thread_local unsigned next = 0;
  const int device = plan_device(plan);
  for (const Last& l : last) {
    if (l.prep && l.device == device && l.name == plan.kernel_name) return *l.prep;
  }
  const Prepared& p = prepared_slow(plan, device);
  Last& slot = last[next++ % 4];
  slot.name = plan.kernel_name;
  slot.device = device;
  slot.prep = &p;
  return p;
}

}  // namespace

int gqa_arch(const GqaConfig& c, const std::string& fn) {
  const int device = c.device.index;
  if (device < 0 || device >= device_count()) {
    throw Error(fn + ": config.device: expected a CUDA device index in [0, " +
                std::to_string(device_count()) + "), got " + to_string(c.device));
  }
  const int arch = compute_capability(device);
  if (arch < 80) {
    throw Error(fn + ": config.device: expected compute capability >= 8.0 (mma.sync, cp.async), "
                "got " + std::to_string(arch / 10) + "." + std::to_string(arch % 10));
  }
  return arch;
}

void plan_gqa_decode(GqaPlan& plan, int path_arch) {
  refuse_retired_tuning("plan_gqa_decode");
  const GqaConfig& c = plan.config;
  const int device = plan_device(plan);
  const int arch = gqa_arch(c, "plan_gqa_decode");
  plan.sm_count = sm_count(device);
  const GqaKernelKey key = make_gqa_key(c, arch, plan.sm_count, path_arch, hopper_16bit("plan_gqa_decode"));
  const gqa::Shape shape = key.shape();
  // Occupancy comes from the compiled kernel itself (its registers), not from a guess.
  const jit::LoadedKernel& kernel = jit::get_kernel(key.spec(), device);
  const int resident = plan::ctas_per_sm(kernel.num_regs, shape.threads, shape.smem_bytes,
                                         sm_limits(device));

  plan.kernel_name = key.name();
  remember_prepared(device, key, kernel);
  const int max_splits = std::min(kMaxSplits, gqa::max_merge_splits(shape, key.rows));
  if (c.split_mode == SplitMode::kFixed) {
    plan.split_tokens = plan::fixed_split_tokens(c.split_tokens, shape.tile);
    plan.num_splits = plan::fixed_num_splits(c.max_seq_len, plan.split_tokens);
    if (plan.num_splits > max_splits) {
      throw Error("plan_gqa_decode: config.split_tokens: expected at least " +
                  std::to_string((c.max_seq_len + max_splits - 1) / max_splits) +
                  " keys per split for max_seq_len " + std::to_string(c.max_seq_len) +
                  " (at most " + std::to_string(max_splits) + " splits for kernel " +
                  key.name() + "), got " + std::to_string(c.split_tokens));
    }
  } else {
    plan::SplitInputs in;
    in.units = units(c, key);
    in.max_keys = max_visible_keys(c, shape.tile);
    in.tile = shape.tile;
    in.sm_count = plan.sm_count;
    in.ctas_per_sm = resident;
    in.max_splits = max_splits;
    in.cta_rate = plan::cta_rate(plan::gqa_cta_bytes_per_us(gqa::sm90::kv_bytes_of(key.kv_dtype)),
                                 peak_dram_bytes_per_us(device), plan.sm_count);
    plan.split_tokens = 0;
    plan.num_splits = plan::choose_num_splits(in);
    // DECA_GQA_SPLITS=n: n splits per unit instead of the model's choice (a tuning knob; clamped to
    // what the merge and the keys allow).
    if (const std::optional<int> v = tuning_override(Tuning::kGqaSplits, "plan_gqa_decode")) {
      const int tiles = std::max(1, (in.max_keys + in.tile - 1) / in.tile);
      plan.num_splits = std::min({*v, max_splits, tiles});
    }
  }
  plan.workspace_bytes = layout(plan, key).total();
}

GqaWorkspace gqa_workspace(const GqaPlan& plan, void* workspace) {
  const WorkspaceLayout w = layout(plan, prepared(plan).key);
  auto* base = static_cast<unsigned char*>(workspace);
  GqaWorkspace parts;
  if (w.split_total() != 0) {
    parts.partial_o = reinterpret_cast<float*>(base);
    parts.partial_ml = reinterpret_cast<float*>(base + w.o_bytes);
    parts.counters = reinterpret_cast<unsigned*>(base + w.o_bytes + w.ml_bytes);
  }
  if (w.check_bytes != 0) parts.check = base + w.split_total();
  return parts;
}

namespace {

// The launch of gqa_decode with `key`'s compiled `kernel`: the plan's key, or its stamp build.
void launch_gqa(const GqaPlan& plan, const GqaKernelKey& key, const jit::LoadedKernel& kernel,
                const GqaParams& params, void* stream, bool launch, bool pdl) {
  const gqa::Shape shape = key.shape();
  jit::Dim3 grid;
  grid.x = static_cast<unsigned>(plan.num_splits);
  grid.y = static_cast<unsigned>(params.num_kv_heads * row_blocks(plan.config, key));
  grid.z = static_cast<unsigned>(params.batch / key.beam_width);  // one CTA column per request
  jit::Dim3 block;
  block.x = static_cast<unsigned>(shape.threads);
  // The driver copies the parameter buffer at the launch and never writes it.
  void* args[] = {const_cast<GqaParams*>(&params)};
  jit::ScopedDevice scope(plan_device(plan));
  if (!launch) return;  // deca-bench --host-cost: deca's own part, without the driver call
  jit::LaunchOptions options = gqa_launch_options(key.arch);
  options.pdl = options.pdl && pdl;
  jit::launch(kernel, grid, block, static_cast<std::size_t>(shape.smem_bytes), stream, args, options);
}

}  // namespace

void gqa_decode(const GqaPlan& plan, const GqaParams& params, void* stream, bool launch, bool pdl) {
  if (params.batch == 0) return;
  const Prepared& prep = prepared(plan);
  launch_gqa(plan, prep.key, *prep.kernel, params, stream, launch, pdl);
}

GqaKernelKey gqa_stamp_key(const GqaPlan& plan) {
  GqaKernelKey key = prepared(plan).key;
  key.stamps = true;
  return key;
}

long long gqa_grid_ctas(const GqaPlan& plan, const GqaParams& params) {
  const GqaKernelKey& key = prepared(plan).key;
  return static_cast<long long>(plan.num_splits) * params.num_kv_heads * row_blocks(plan.config, key) *
         (params.batch / key.beam_width);
}

void gqa_decode_with(const GqaPlan& plan, const GqaKernelKey& key, const jit::LoadedKernel& kernel,
                     const GqaParams& params, void* stream) {
  if (params.batch == 0) return;
  launch_gqa(plan, key, kernel, params, stream, true, true);
}

std::string precompile_gqa(const GqaConfig& config, int arch) {
  refuse_retired_tuning("precompile_gqa_decode");
  const GqaKernelKey key = make_gqa_key(config, arch, 132, 0, hopper_16bit("precompile_gqa_decode"));
  (void)jit::compile_only(key.spec());
  return key.name();
}

std::string precompile_gqa_stamps(const GqaConfig& config, int arch) {
  refuse_retired_tuning("precompile_gqa_stamps");
  GqaKernelKey key = make_gqa_key(config, arch, 132, 0, hopper_16bit("precompile_gqa_stamps"));
  if (!key.wgmma()) return "";
  key.stamps = true;
  (void)jit::compile_only(key.spec());
  return key.name();
}

}  // namespace deca::cuda
