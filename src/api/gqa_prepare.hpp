// The two halves of gqa_decode: validate + fill params (no side effects), then dispatch. Split so
// that the one-shot overload can validate everything before it allocates a workspace.
#pragma once

#include "deca/gqa.hpp"
#include "kernels/gqa/params.cuh"

namespace deca::api {

// Checks the plan's config and every argument against it (tensor metadata always; page table,
// seq_lens contents only for CPU tensors), then fills the params. With `check_workspace` false
// the caller promises to provide the workspace itself. params.ws_* are left null.
GqaParams prepare_gqa_decode(const GqaPlan& plan, const GqaDecodeArgs& args, bool check_workspace);

// Runs validated params: the CPU reference, or (CUDA) carves `workspace` and launches on `stream`.
// With `launch` false it stops before the computation (the CPU reference) or the driver call.
void dispatch_gqa_decode(const GqaPlan& plan, GqaParams& params, void* workspace, void* stream,
                         bool launch = true);

// gqa_decode(plan, args) without its computation: every check, the kernel lookup, the params,
// the grid and the current device, but no cuLaunchKernelEx (nor CPU reference). What a call costs
// deca itself, for deca-bench --host-cost and tools/py_host_cost.py; it writes nothing.
void gqa_decode_without_launch(const GqaPlan& plan, const GqaDecodeArgs& args);

}  // namespace deca::api
