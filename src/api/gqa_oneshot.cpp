// gqa_decode(config, args): plan from this call's shapes and run once. On the GPU it owns a
// workspace for the duration of the call; servers use plan + run and keep one workspace.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "api/gqa_config.hpp"
#include "api/gqa_prepare.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"

namespace deca {

namespace {

constexpr const char* kFn = "gqa_decode";

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(std::string(kFn) + ": workspace: expected " + what + " to succeed, got " +
                cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

// Owns a zeroed device workspace on the plan's device and frees it on every exit path, after
// the stream has finished with it.
class ScopedWorkspace {
 public:
  ScopedWorkspace(int device, std::size_t bytes, void* stream) : stream_(stream) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    restore_ = true;
    cuda_check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
    cuda_check(cudaMemsetAsync(ptr_, 0, bytes, static_cast<cudaStream_t>(stream)),
               "cudaMemsetAsync");
  }
  ~ScopedWorkspace() {
    if (ptr_) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
      cudaFree(ptr_);
    }
    if (restore_) cudaSetDevice(previous_);
  }
  ScopedWorkspace(const ScopedWorkspace&) = delete;
  ScopedWorkspace& operator=(const ScopedWorkspace&) = delete;

  void* get() const { return ptr_; }
  // Surfaces launch errors here, where the caller can still see them as a deca::Error.
  void finish() {
    cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "the decode stream");
  }

 private:
  void* ptr_ = nullptr;
  void* stream_ = nullptr;
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace

void gqa_decode(const GqaConfig& config, const GqaDecodeArgs& args) {
  const GqaConfig c = api::oneshot_gqa_config(config, args);  // validated there
  const GqaPlan plan = api::plan_validated_gqa(c);
  // A workspace the caller passed along is used (and checked); otherwise one is made below.
  const bool caller_workspace =
      args.workspace != nullptr && args.workspace_bytes >= plan.workspace_bytes;
  api::check_gqa_decode(plan, args, caller_workspace);
  const bool empty = args.q.shape[0] == 0;
  if (c.device.kind == DeviceKind::kCPU || plan.workspace_bytes == 0 || caller_workspace || empty) {
    api::dispatch_gqa_decode(plan, api::gqa_params(plan, args, args.workspace), args.stream);
    // Checked mode: this call synchronises anyway when it owns the workspace; with the caller's
    // it reads the record too, so that a one-shot call reports its own bad indices.
    if (caller_workspace && !empty) check_gqa_run(plan, args.workspace, args.stream);
    return;
  }
  ScopedWorkspace workspace(c.device.index, plan.workspace_bytes, args.stream);
  api::dispatch_gqa_decode(plan, api::gqa_params(plan, args, workspace.get()), args.stream);
  workspace.finish();
  check_gqa_run(plan, workspace.get(), args.stream);
}

}  // namespace deca
