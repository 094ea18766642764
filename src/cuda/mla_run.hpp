// What the sparse (src/cuda/mla_backend.cpp) and dense (src/cuda/mla_dense.cpp) MLA decode paths
// share on the host: the plan's partitions, workspace and kernels, and the three launches of a
// run (scheduler, decode, combine). A dense run is a sparse run whose decode kernel reads its
// tokens through DecodeKernelParams::dense (kernels/mla/schedule/work.cuh).
#pragma once

#include <string>

#include "deca/mla.hpp"
#include "kernels/mla/schedule/work.cuh"

namespace deca::cuda {

// Fills plan.sm_count, num_parts, num_splits, workspace_bytes and kernel_name for a config whose
// device is CUDA (sparse or dense: the decode key is mla_decode_key's for the config), and loads
// (compiling on first use) the scheduler, decode and combine kernels, once per (decode kernel,
// head count, device). Throws a deca::Error from plan_mla_decode naming config.device when the
// device is absent, older than 8.0 or short of the decode kernel's shared memory, and naming
// config.max_batch / max_q_len past the grid's extents.
void plan_mla_run(MlaPlan& plan);

// One run on `stream`: carves `workspace` (plan.workspace_bytes) into kp.run, then launches the
// scheduler (unless `reuse_schedule`), the decode kernel and, when `combine`, the combine kernel
// (programmatic dependent launch where the kernels allow it). kp.p and kp.dense are the caller's.
// `fn` names the public function in errors (a plan this process did not make, with a kernel name
// its config does not give here). Allocates nothing: safe in CUDA graph capture.
void run_mla_decode(const MlaPlan& plan, mla::DecodeKernelParams& kp, void* workspace, void* stream,
                    bool reuse_schedule, bool combine, const std::string& fn);

}  // namespace deca::cuda
