// Specialization -> loaded kernel, through three levels: the in-process cache, the on-disk cubin
// cache, NVRTC. Thread-safe; a key is compiled once per process however many threads ask.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "jit/cache_key.hpp"
#include "jit/disk_cache.hpp"
#include "jit/once_map.hpp"
#include "jit/ptxas_info.hpp"
#include "jit/spec.hpp"

namespace deca::jit {

// Where a kernel came from when this process first asked for it.
enum class KernelOrigin { memory, disk, compile };
const char* to_string(KernelOrigin origin);

struct CompiledKernel {
  CacheKey key;
  std::string entry;
  int arch = 0;
  std::vector<char> cubin;
  std::string log;       // NVRTC log with the ptxas -v report
  PtxasInfo ptxas;
  double compile_ms = 0;    // NVRTC time (0 when read from disk)
  double disk_read_ms = 0;  // time to read and check the disk entry (0 when compiled)
  KernelOrigin origin = KernelOrigin::compile;  // disk or compile
};

struct LoadedKernel {
  CacheKey key;
  std::string entry;
  int device = 0;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  // From cuFuncGetAttribute on the loaded function.
  int num_regs = 0;
  int local_bytes = 0;   // per-thread local memory: spills and stack
  int static_smem = 0;
  int max_threads = 0;
  std::string ptxas_log;
  PtxasInfo ptxas;
  double compile_ms = 0;
  double disk_read_ms = 0;
  double load_ms = 0;    // cuModuleLoadData + attribute queries
  KernelOrigin origin = KernelOrigin::compile;  // memory: the cubin was already in this process

  // The dynamic shared memory the function is opted in to (48 KiB needs no opt-in).
  mutable std::atomic<std::size_t> dynamic_smem_limit{48 * 1024};
  mutable std::mutex attribute_mu;
};

class KernelCache {
 public:
  // `disk` may be null (memory only); it must outlive the cache.
  explicit KernelCache(DiskCache* disk);
  // Unloads the modules this cache loaded. The process-wide cache is never destroyed: unloading
  // after the driver has shut down at exit would crash.
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // References returned below stay valid for the cache's lifetime: callers keep them (e.g. in a
  // plan) rather than asking per launch, which hashes the spec each time.
  // Memory, then disk, then NVRTC (which writes the disk entry). No GPU needed.
  const CompiledKernel& get_cubin(const JitSpec& spec);
  // get_cubin, then loads the module on `device` (whose arch must run spec.arch code).
  const LoadedKernel& get_kernel(const JitSpec& spec, int device);

 private:
  const CompiledKernel& cubin(const JitSpec& spec, const CacheKey& key, bool* made);

  DiskCache* disk_;
  OnceMap<CompiledKernel> cubins_;
  OnceMap<LoadedKernel> modules_;
};

// The process-wide cache over DiskCache(DiskCache::default_dir()).
KernelCache& default_kernel_cache();

const LoadedKernel& get_kernel(const JitSpec& spec, int device);

// The cubin for `spec`, compiled or read through the process-wide cache (so the disk entry is
// written): for CI without a GPU and for ahead-of-time precompilation.
std::vector<char> compile_only(const JitSpec& spec);

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchOptions {
  Dim3 cluster{0, 0, 0};  // thread-block cluster shape (sm_90+); x == 0: no cluster attribute
  bool pdl = false;       // programmatic dependent launch: may overlap the previous kernel's tail
};

// cuLaunchKernelEx on `stream` (a cudaStream_t / CUstream; null is the legacy default stream).
// The caller's current context must be that of kernel.device. Opts the function in to
// `dynamic_smem` above 48 KiB on first need. Allocates nothing: safe in CUDA graph capture.
void launch(const LoadedKernel& kernel, Dim3 grid, Dim3 block, std::size_t dynamic_smem,
            void* stream, void** args, const LaunchOptions& options = {});

}  // namespace deca::jit
