// jit::launch (declared in kernel_cache.hpp): one cuLaunchKernelEx with optional cluster and
// programmatic-dependent-launch attributes.
#include <string>

#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "jit/kernel_cache.hpp"

namespace deca::jit {

namespace {

constexpr std::size_t kDefaultSmemLimit = 48 * 1024;

// Raises the function's dynamic shared-memory limit once to the largest size asked so far. The
// mutex keeps two threads from lowering each other's setting; the fast path takes no lock.
void opt_in_dynamic_smem(const LoadedKernel& k, std::size_t bytes) {
  if (bytes <= kDefaultSmemLimit || bytes <= k.dynamic_smem_limit.load(std::memory_order_acquire)) {
    return;
  }
  std::lock_guard<std::mutex> lock(k.attribute_mu);
  if (bytes <= k.dynamic_smem_limit.load(std::memory_order_relaxed)) return;
  CUresult rc = driver().FuncSetAttribute(
      k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes));
  if (rc != CUDA_SUCCESS) {
    check_cu(rc, "launch",
             ("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = " + std::to_string(bytes) +
              ") for \"" + k.key.name + "\" (static smem " + std::to_string(k.static_smem) + " B)")
                 .c_str());
  }
  k.dynamic_smem_limit.store(bytes, std::memory_order_release);
}

}  // namespace

void launch(const LoadedKernel& kernel, Dim3 grid, Dim3 block, std::size_t dynamic_smem,
            void* stream, void** args, const LaunchOptions& options) {
  if (kernel.function == nullptr) {
    throw Error("jit::launch: kernel: expected a kernel loaded by get_kernel, got none");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    throw Error("jit::launch: \"" + kernel.key.name + "\": expected every grid and block extent >= 1, got grid " +
                std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
                ", block " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" +
                std::to_string(block.z));
  }
  const Driver& d = driver();
  opt_in_dynamic_smem(kernel, dynamic_smem);

  CUlaunchAttribute attrs[2];
  unsigned num_attrs = 0;
  if (options.cluster.x != 0) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[num_attrs].value.clusterDim.x = options.cluster.x;
    attrs[num_attrs].value.clusterDim.y = options.cluster.y;
    attrs[num_attrs].value.clusterDim.z = options.cluster.z;
    ++num_attrs;
  }
  if (options.pdl) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[num_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  CUlaunchConfig config{};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = block.x;
  config.blockDimY = block.y;
  config.blockDimZ = block.z;
  config.sharedMemBytes = static_cast<unsigned>(dynamic_smem);
  config.hStream = static_cast<CUstream>(stream);
  config.attrs = num_attrs > 0 ? attrs : nullptr;
  config.numAttrs = num_attrs;
  CUresult rc = d.LaunchKernelEx(&config, kernel.function, args, nullptr);
  if (rc != CUDA_SUCCESS) {
    check_cu(rc, "launch", ("cuLaunchKernelEx(\"" + kernel.key.name + "\", grid " +
                            std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                            std::to_string(grid.z) + ", block " + std::to_string(block.x) + "x" +
                            std::to_string(block.y) + "x" + std::to_string(block.z) +
                            ", dynamic smem " + std::to_string(dynamic_smem) + " B)")
                               .c_str());
  }
}

}  // namespace deca::jit
