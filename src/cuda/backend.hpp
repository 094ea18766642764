// The CUDA backend as src/api/ sees it: device queries, planning and launches. Every function
// here is called only after src/api/ has validated the arguments.
#pragma once

#include <string>

#include "deca/gqa.hpp"
#include "deca/mla.hpp"
#include "kernels/common/check_record.cuh"
#include "kernels/gqa/params.cuh"
#include "kernels/mla/params.cuh"
#include "plan/gqa_split.hpp"

namespace deca::cuda {

// True when a CUDA driver and at least one device are present.
bool available();
int device_count();
int sm_count(int device);
// Compute capability as major * 10 + minor (90 for Hopper).
int compute_capability(int device);
// Per-SM resource limits of `device`, for occupancy.
plan::SmLimits sm_limits(int device);
// The device's peak DRAM rate from its memory clock and bus width (0 where it reports neither).
double peak_dram_bytes_per_us(int device);

// The compute capability of config.device (a CUDA device) for the GQA kernel; throws a
// deca::Error from `fn` naming config.device when it is absent or older than 8.0.
int gqa_arch(const GqaConfig& config, const std::string& fn);

// Fills plan.num_splits, split_tokens, workspace_bytes, kernel_name, sm_count for a config whose
// device is CUDA. `path_arch` (tests only; make_gqa_key): the 8-bit path a plan takes on that
// arch instead of this device's, so that one GPU runs every arch's code.
void plan_gqa_decode(GqaPlan& plan, int path_arch = 0);

// Where a run of `plan` keeps its split-KV partials, arrival counters and checked-mode record in
// `workspace` (at least plan.workspace_bytes bytes on the plan's device, zeroed once at
// allocation); null for what the plan does not need. The layout is the backend's business; the
// api's params fill (api::gqa_params) asks it here.
struct GqaWorkspace {
  float* partial_o = nullptr;
  float* partial_ml = nullptr;
  unsigned* counters = nullptr;
  void* check = nullptr;  // the CheckRecord, last in the workspace (check_gqa_run reads it there)
};
GqaWorkspace gqa_workspace(const GqaPlan& plan, void* workspace);

// Launches the plan's kernel on `stream` (a cudaStream_t) with checked, filled params (api::
// gqa_params), with gqa_launch_options (programmatic dependent launch on sm_90+). With `launch`
// false it does everything but the driver call (kernel lookup, grid, the current device): what
// deca-bench --host-cost reports as deca's own part of a call. `pdl` false: without the
// programmatic-dependent-launch attribute whatever the arch (deca-bench --layers' comparison,
// the GPU tests' serial baseline); the kernel is the same.
void gqa_decode(const GqaPlan& plan, const GqaParams& params, void* stream, bool launch = true,
                bool pdl = true);
// The fused step's rotate (mode 0: q into q_out, contiguous [batch, q_len, num_q_heads,
// head_dim] in q's dtype) or append (mode 1: k_new / v_new into the cache) alone, for a fused
// plan's params (src/cuda/gqa_rope_append.cpp; deca-bench --fused's three-launch baseline).
void gqa_rope_append(const GqaPlan& plan, const GqaParams& params, void* q_out, int mode, void* stream);

// Compiles (or finds in the cubin cache) the kernel a plan of `config` runs on devices of compute
// capability `arch`, without launching anything or needing a GPU; returns its name. Both this and
// plan_gqa_decode refuse retired tuning variables (tuning.hpp).
std::string precompile_gqa(const GqaConfig& config, int arch);

// ---- MLA sparse decode and the combine op (src/cuda/mla_backend.cpp) --------------------------

// Fills plan.sm_count, num_parts, num_splits, workspace_bytes and kernel_name for a sparse config
// whose device is CUDA, and loads (compiling on first use) the scheduler, decode and combine
// kernels. Throws a deca::Error from plan_mla_decode naming config.device when the device is
// absent, older than 8.0 or short of the decode kernel's shared memory.
void plan_mla_sparse(MlaPlan& plan);

// Scheduler -> decode -> combine (PDL) on `stream`, their metadata and partials in `workspace`
// (plan.workspace_bytes on the plan's device); `reuse_schedule` leaves the scheduler out
// (MlaSparseArgs::reuse_schedule). Allocates nothing: safe in CUDA graph capture.
void mla_sparse_decode(const MlaPlan& plan, const MlaSparseParams& params, void* workspace,
                       void* stream, bool reuse_schedule = false);

// ---- MLA dense decode (src/cuda/mla_dense.cpp) -------------------------------------------------

// Fills plan.sm_count, num_parts, num_splits, workspace_bytes and kernel_name for a dense config
// whose device is CUDA (its kv_format and max_seq_len are known here: the kernels specialise on
// the first and cap the schedule with the second), and loads (compiling on first use) the
// scheduler, decode and combine kernels. Throws a deca::Error from plan_mla_decode naming
// config.device when the device cannot run them.
void plan_mla_dense(MlaPlan& plan);

// Scheduler -> decode -> combine on `stream` for a dense run (params.kv_format, kv_scale and the
// block table / lengths in device memory, never read here), as mla_sparse_decode: metadata and
// partials in `workspace`, `reuse_schedule` leaves the scheduler out. Allocates nothing.
void mla_dense_decode(const MlaPlan& plan, const MlaDenseParams& params, void* workspace,
                      void* stream, bool reuse_schedule);

// The compute capability of config.device (a CUDA device) for the MLA kernels; throws a
// deca::Error from `fn` naming config.device when it is absent or older than 8.0.
int mla_arch(const MlaConfig& config, const std::string& fn);

// Compiles (or finds in the cubin cache) the scheduler, decode and combine kernels a plan of
// `config` (dense or sparse) runs on devices of compute capability `arch`, without launching
// anything or needing a GPU (both combines: the plan's choice depends on the SM count); returns
// the decode kernel's name.
std::string precompile_mla(const MlaConfig& config, int arch);

// The `combine` op on CUDA tensors of `device`.
void combine(const CombineParams& params, int device, void* stream);

// ---- Checked mode (src/cuda/check_record.cpp) ---------------------------------------------------

// Synchronises `stream` on `device`, copies the CheckRecord at `record` (device memory) into
// `out` and, when it is set, zeroes it on the device again; true when a kernel recorded one.
// CUDA failures throw a deca::Error from `fn` naming the stream.
bool take_check_record(int device, const void* record, void* stream, CheckRecord& out,
                       const std::string& fn);

}  // namespace deca::cuda
