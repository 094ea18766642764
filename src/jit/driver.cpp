#include "jit/driver.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

#include "deca/error.hpp"

namespace deca::jit {

namespace {

// The driver ABI these pointers are declared with (cuda.h of CUDA 12.0 and later).
constexpr unsigned kDriverAbi = 12000;

struct Loaded {
  Driver fns{};
  std::string error;  // why the driver is unusable; empty when fns are all set
};

template <class Fn>
bool resolve(const char* symbol, Fn* out, std::string* error) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbi, cudaEnableDefault, &status);
  if (rc != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    if (error->empty()) {
      *error = std::string("cannot resolve ") + symbol + " (" +
               (rc != cudaSuccess ? cudaGetErrorName(rc) : "symbol not found in the driver") + ")";
    }
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

const Loaded& loaded() {
  static const Loaded value = [] {
    Loaded l;
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
      l.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + " (" +
                cudaGetErrorString(rc) + ")";
      cudaGetLastError();  // clear the sticky-free error so later runtime calls start clean
      return l;
    }
    if (count == 0) {
      l.error = "no CUDA device";
      return l;
    }
    Driver& d = l.fns;
    bool ok = resolve("cuGetErrorName", &d.GetErrorName, &l.error);
    ok &= resolve("cuCtxGetCurrent", &d.CtxGetCurrent, &l.error);
    ok &= resolve("cuDeviceGet", &d.DeviceGet, &l.error);
    ok &= resolve("cuDeviceGetAttribute", &d.DeviceGetAttribute, &l.error);
    ok &= resolve("cuDevicePrimaryCtxRetain", &d.DevicePrimaryCtxRetain, &l.error);
    ok &= resolve("cuModuleLoadData", &d.ModuleLoadData, &l.error);
    ok &= resolve("cuModuleUnload", &d.ModuleUnload, &l.error);
    ok &= resolve("cuModuleGetFunction", &d.ModuleGetFunction, &l.error);
    ok &= resolve("cuFuncGetAttribute", &d.FuncGetAttribute, &l.error);
    ok &= resolve("cuFuncSetAttribute", &d.FuncSetAttribute, &l.error);
    ok &= resolve("cuLaunchKernelEx", &d.LaunchKernelEx, &l.error);
    ok &= resolve("cuLaunchKernel", &d.LaunchKernel, &l.error);
    ok &= resolve("cuModuleGetGlobal", &d.ModuleGetGlobal, &l.error);
    ok &= resolve("cuTensorMapEncodeTiled", &d.TensorMapEncodeTiled, &l.error);
    if (ok) l.error.clear();
    return l;
  }();
  return value;
}

}  // namespace

bool driver_available() { return loaded().error.empty(); }

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) {
    throw Error("jit::driver: expected a CUDA driver and device, got: " + l.error);
  }
  return l.fns;
}

void check_cu(CUresult rc, const char* where, const char* call) {
  if (rc == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (driver_available()) driver().GetErrorName(rc, &name);
  throw Error(std::string("jit::") + where + ": " + call + ": expected CUDA_SUCCESS, got " +
              (name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(rc))));
}

int device_arch(int device) {
  const Driver& d = driver();
  CUdevice dev = 0;
  check_cu(d.DeviceGet(&dev, device), "device_arch", "cuDeviceGet");
  int major = 0, minor = 0;
  check_cu(d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
           "device_arch", "cuDeviceGetAttribute(major)");
  check_cu(d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
           "device_arch", "cuDeviceGetAttribute(minor)");
  return major * 10 + minor;
}

namespace {

// The primary context of each device, retained (never released: it lives as long as the
// process, as the modules loaded into it do) the first time ScopedDevice made it current.
constexpr int kMaxDevices = 64;
std::atomic<CUcontext> primary_contexts[kMaxDevices];

}  // namespace

ScopedDevice::ScopedDevice(int device) {
  const Driver& d = driver();  // throws a clear error before any runtime call without a driver
  const bool cached = device >= 0 && device < kMaxDevices;
  // The common case of every launch: the caller (torch, an engine) keeps the device current.
  // One driver query of this thread's context instead of cudaGetDevice + cuCtxGetCurrent.
  if (cached) {
    const CUcontext primary = primary_contexts[device].load(std::memory_order_acquire);
    CUcontext ctx = nullptr;
    if (primary != nullptr && d.CtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx == primary) return;
  }
  int current = -1;
  cudaError_t rc = cudaGetDevice(&current);
  CUcontext ctx = nullptr;
  // A fresh thread has device 0 "current" before any context exists: initialise it then too.
  if (rc == cudaSuccess && current == device && (d.CtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)) {
    rc = cudaSetDevice(device);
  }
  // Since CUDA 12.0 cudaSetDevice initialises the device's primary context and makes it current,
  // which the driver calls below (cuModuleLoadData) need. No cudaFree(0): it is not allowed
  // while a stream is being captured into a graph.
  if (rc == cudaSuccess && current != device) {
    rc = cudaSetDevice(device);
    if (rc == cudaSuccess) previous_ = current;
  }
  if (rc != cudaSuccess) {
    throw Error("jit::ScopedDevice: device " + std::to_string(device) +
                ": expected it to become current, got " + cudaGetErrorName(rc));
  }
  if (cached && primary_contexts[device].load(std::memory_order_acquire) == nullptr) {
    // Once per device (a race retains twice, harmlessly: the context is never released).
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    if (d.DeviceGet(&dev, device) == CUDA_SUCCESS &&
        d.DevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS) {
      primary_contexts[device].store(primary, std::memory_order_release);
    }
  }
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace deca::jit
