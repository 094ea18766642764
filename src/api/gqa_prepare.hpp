// gqa_decode in its three steps: check the arguments (once per plan the config, per run what the
// run adds; no side effects), fill the params (the one place that writes GqaParams), dispatch.
// Split so that the one-shot overload can check everything before it allocates a workspace.
#pragma once

#include "deca/gqa.hpp"
#include "kernels/gqa/params.cuh"

namespace deca::api {

// Every check of gqa_decode(plan, args): plan.config in full unless plan_gqa_decode validated it
// (GqaPlan::validated), the plan's own fields, every tensor against the plan (metadata always;
// page table and seq_lens contents only in host memory), the byte strides the GPU kernels keep in
// 32 bits. With `check_workspace` false the caller promises to provide the workspace itself.
void check_gqa_decode(const GqaPlan& plan, const GqaDecodeArgs& args, bool check_workspace);

// The kernels' and the CPU reference's params for checked arguments: every field, the split-KV
// partials, arrival counters and checked-mode record in `workspace` (the plan's
// workspace_bytes on its device; null on the CPU or where the plan needs none).
GqaParams gqa_params(const GqaPlan& plan, const GqaDecodeArgs& args, void* workspace);

// Runs the params: the CPU reference, or (CUDA) the plan's kernel on `stream`. With `launch`
// false it stops before the computation (the CPU reference) or the driver call.
void dispatch_gqa_decode(const GqaPlan& plan, const GqaParams& params, void* stream, bool launch = true);

// gqa_decode(plan, args) without its computation: every check, the kernel lookup, the params,
// the grid and the current device, but no cuLaunchKernelEx (nor CPU reference). What a call costs
// deca itself, for deca-bench --host-cost and tools/py_host_cost.py; it writes nothing.
void gqa_decode_without_launch(const GqaPlan& plan, const GqaDecodeArgs& args);

}  // namespace deca::api
