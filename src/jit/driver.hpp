// The CUDA driver API, reached through the runtime's cudaGetDriverEntryPointByVersion instead of
// linking libcuda: the library and its tests must load and run (CPU paths, NVRTC) on machines
// with the toolkit but no driver, like CI.
#pragma once

#include <cuda.h>

#include <string>

namespace deca::jit {

struct Driver {
  decltype(&::cuGetErrorName) GetErrorName;
  decltype(&::cuCtxGetCurrent) CtxGetCurrent;
  decltype(&::cuDeviceGet) DeviceGet;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
  decltype(&::cuModuleLoadData) ModuleLoadData;
  decltype(&::cuModuleUnload) ModuleUnload;
  decltype(&::cuModuleGetFunction) ModuleGetFunction;
  decltype(&::cuFuncGetAttribute) FuncGetAttribute;
  decltype(&::cuFuncSetAttribute) FuncSetAttribute;
  decltype(&::cuLaunchKernelEx) LaunchKernelEx;
  decltype(&::cuLaunchKernel) LaunchKernel;  // the bench's launch-floor comparison
  decltype(&::cuModuleGetGlobal) ModuleGetGlobal;  // the GQA phase stamps' records (src/cuda/gqa_stamps.cpp)
  decltype(&::cuTensorMapEncodeTiled) TensorMapEncodeTiled;  // dense MLA rows by TMA (src/cuda/mla_tma.cpp)
};

// True when a driver is installed, every entry point above resolved and a device is present.
bool driver_available();

// The entry points; throws deca::Error saying why when driver_available() is false.
const Driver& driver();

// Throws deca::Error "jit::<where>: <call>: expected CUDA_SUCCESS, got <CUresult name>" unless ok.
void check_cu(CUresult rc, const char* where, const char* call);

// Compute capability (major * 10 + minor) of `device`; throws when it does not exist.
int device_arch(int device);

// Makes `device`'s primary context current for this scope (initialising it on first use: the
// driver calls below act on the current context) and restores the caller's device afterwards.
// Per launch this is one cuCtxGetCurrent when the thread's current context already is that
// primary context (its handle is kept after the first call; the thread's state is asked every
// time, so a cudaSetDevice in between is seen). deca does not survive cudaDeviceReset (its
// loaded modules would be gone), so the kept handles need no invalidation.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace deca::jit
