#include <cuda_runtime.h>

#include <string>

#include "cuda/backend.hpp"
#include "deca/error.hpp"
#include "jit/driver.hpp"

namespace deca::cuda {

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw Error(std::string("cuda: ") + what + ": expected cudaSuccess, got " +
                cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
  }
}

int attribute(cudaDeviceAttr attr, int device, const char* what) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attr, device), what);
  return value;
}

}  // namespace

// The runtime fixes its device list (CUDA_VISIBLE_DEVICES) at its first call, so the count is
// asked once: validation calls this on every gqa_decode.
int device_count() {
  static const int count = [] {
    int n = 0;
    // No driver or no device: the runtime says so with an error; both mean "no CUDA here".
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

bool available() { return device_count() > 0 && jit::driver_available(); }

int sm_count(int device) {
  return attribute(cudaDevAttrMultiProcessorCount, device, "multiprocessor count");
}

int compute_capability(int device) {
  return 10 * attribute(cudaDevAttrComputeCapabilityMajor, device, "compute capability major") +
         attribute(cudaDevAttrComputeCapabilityMinor, device, "compute capability minor");
}

double peak_dram_bytes_per_us(int device) {
  // Memory clock (kHz) x 2 transfers per clock x bus width (bits / 8): bytes per second / 1e6.
  // Not every device reports them (the plan then takes one CTA per SM as enough): no error.
  int khz = 0;
  int bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  return 2.0 * khz * 1e3 * (bits / 8.0) / 1e6;
}

plan::SmLimits sm_limits(int device) {
  plan::SmLimits sm;
  sm.regs_per_sm = attribute(cudaDevAttrMaxRegistersPerMultiprocessor, device, "registers per SM");
  sm.smem_per_sm =
      attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, device, "shared memory per SM");
  sm.smem_reserved_per_cta =
      attribute(cudaDevAttrReservedSharedMemoryPerBlock, device, "reserved shared memory per CTA");
  sm.max_threads_per_sm =
      attribute(cudaDevAttrMaxThreadsPerMultiProcessor, device, "threads per SM");
  sm.max_ctas_per_sm = attribute(cudaDevAttrMaxBlocksPerMultiprocessor, device, "CTAs per SM");
  return sm;
}

}  // namespace deca::cuda
