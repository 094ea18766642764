// The launch floor of --host-cost: what the driver alone costs per call, so that the host time
// of gqa_decode splits into the driver's part and deca's own.
#pragma once

#include <cstddef>
#include <functional>

namespace deca::bench {

// A `call(stream)` that launches an empty kernel taking a `param_bytes` parameter struct (grid
// 1, 32 threads) on `device` through the same driver entry point gqa_decode uses
// (cuLaunchKernelEx, reached through jit::driver()), or through cuLaunchKernel when `ex` is
// false (to tell the entry point's cost from the parameter size's). The kernel is PTX the driver
// compiles once.
std::function<void(void*)> empty_kernel_launcher(int device, std::size_t param_bytes,
                                                 bool ex = true);

}  // namespace deca::bench
