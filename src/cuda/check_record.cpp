// Checked mode: reading (and clearing) the record a checked kernel left in the workspace.
#include <cuda_runtime.h>

#include <string>

#include "cuda/backend.hpp"
#include "deca/error.hpp"

namespace deca::cuda {

namespace {

void expect_ok(cudaError_t rc, const std::string& fn, const char* what) {
  if (rc != cudaSuccess) {
    throw Error(fn + ": stream: expected " + what + " to succeed, got " + cudaGetErrorName(rc) +
                " (" + cudaGetErrorString(rc) + ")");
  }
}

// Restores the caller's current device on every exit path.
class DeviceScope {
 public:
  DeviceScope(int device, const std::string& fn) {
    expect_ok(cudaGetDevice(&previous_), fn, "cudaGetDevice");
    expect_ok(cudaSetDevice(device), fn, "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

bool take_check_record(int device, const void* record, void* stream, CheckRecord& out,
                       const std::string& fn) {
  DeviceScope scope(device, fn);
  auto* s = static_cast<cudaStream_t>(stream);
  // The runs on `stream` must have finished writing; a kernel fault surfaces here too.
  expect_ok(cudaStreamSynchronize(s), fn, "cudaStreamSynchronize");
  expect_ok(cudaMemcpyAsync(&out, record, sizeof out, cudaMemcpyDeviceToHost, s), fn,
            "cudaMemcpyAsync of the check record");
  expect_ok(cudaStreamSynchronize(s), fn, "cudaStreamSynchronize");
  if (out.claimed == 0u) return false;
  // Cleared for the next runs before the error is raised: the caller may fix its input and go on.
  expect_ok(cudaMemsetAsync(const_cast<void*>(record), 0, sizeof out, s), fn,
            "cudaMemsetAsync of the check record");
  expect_ok(cudaStreamSynchronize(s), fn, "cudaStreamSynchronize");
  return true;
}

}  // namespace deca::cuda
