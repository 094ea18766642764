#include "launch_floor.hpp"

#include <memory>
#include <string>

#include "deca/error.hpp"
#include "jit/driver.hpp"

namespace deca::bench {

std::function<void(void*)> empty_kernel_launcher(int device, std::size_t param_bytes, bool ex) {
  const jit::Driver& d = jit::driver();
  jit::ScopedDevice scope(device);
  // PTX, not CUDA C++: the bench needs no NVRTC or nvcc for it, and the driver JIT-compiles it
  // for whatever the device is. The parameter is one aligned byte array of the params' size, so
  // the driver copies as many argument bytes as for the real kernel.
  const std::string ptx = ".version 7.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry deca_empty(.param .align 8 .b8 p[" +
                          std::to_string(param_bytes) + "])\n{\n  ret;\n}\n";
  CUmodule module = nullptr;
  jit::check_cu(d.ModuleLoadData(&module, ptx.c_str()), "bench", "cuModuleLoadData (empty kernel)");
  CUfunction function = nullptr;
  jit::check_cu(d.ModuleGetFunction(&function, module, "deca_empty"), "bench",
                "cuModuleGetFunction (empty kernel)");
  // The module stays loaded for the process: unloading at exit after the driver shut down
  // would crash (kernel_cache.hpp says the same of deca's own modules).
  auto params = std::make_shared<std::string>(param_bytes, '\0');
  if (!ex) {
    return [&d, function, params](void* stream) {
      void* args[] = {params->data()};
      jit::check_cu(d.LaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, static_cast<CUstream>(stream),
                                   args, nullptr),
                    "bench", "cuLaunchKernel (empty kernel)");
    };
  }
  return [&d, function, params](void* stream) {
    CUlaunchConfig config{};
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 32;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = static_cast<CUstream>(stream);
    void* args[] = {params->data()};
    jit::check_cu(d.LaunchKernelEx(&config, function, args, nullptr), "bench",
                  "cuLaunchKernelEx (empty kernel)");
  };
}

}  // namespace deca::bench
