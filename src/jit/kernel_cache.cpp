#include "jit/kernel_cache.hpp"

#include <chrono>

#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::jit {

namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// A cubin for sm_XY runs on sm_XZ with Z >= Y; one for sm_90a runs on sm_90 only.
void check_arch(const JitSpec& spec, int device) {
  const int dev_arch = device_arch(device);
  const bool ok = spec.arch == 90 ? dev_arch == 90
                                  : spec.arch / 10 == dev_arch / 10 && spec.arch <= dev_arch;
  if (!ok) {
    throw Error("jit::get_kernel: \"" + spec.name + "\": spec.arch " + std::to_string(spec.arch) +
                " (" + gpu_arch_name(spec.arch) + ") cannot run on device " +
                std::to_string(device) + " of compute capability " + std::to_string(dev_arch));
  }
}

int func_attribute(CUfunction f, CUfunction_attribute attr, const char* what) {
  int value = 0;
  check_cu(driver().FuncGetAttribute(&value, attr, f), "get_kernel", what);
  return value;
}

}  // namespace

const char* to_string(KernelOrigin origin) {
  switch (origin) {
    case KernelOrigin::memory: return "memory";
    case KernelOrigin::disk: return "disk";
    case KernelOrigin::compile: return "compile";
  }
  return "?";
}

KernelCache::KernelCache(DiskCache* disk) : disk_(disk) {}

KernelCache::~KernelCache() {
  if (!driver_available()) return;
  modules_.for_each_ready([](LoadedKernel& k) {
    if (k.module != nullptr) driver().ModuleUnload(k.module);
  });
}

const CompiledKernel& KernelCache::get_cubin(const JitSpec& spec) {
  return cubin(spec, cache_key(spec), nullptr);
}

const CompiledKernel& KernelCache::cubin(const JitSpec& spec, const CacheKey& key, bool* made) {
  const std::string key_str = key.str();
  return cubins_.get(
      key_str,
      [&] {
        auto k = std::make_shared<CompiledKernel>();
        k->key = key;
        k->entry = spec.entry;
        k->arch = spec.arch;
        DiskEntry entry;
        const auto start = std::chrono::steady_clock::now();
        if (disk_ != nullptr && disk_->read(key_str, &entry) == DiskRead::hit) {
          k->disk_read_ms = ms_since(start);
          k->cubin = std::move(entry.cubin);
          k->log = std::move(entry.log);
          k->origin = KernelOrigin::disk;
        } else {
          CompileResult r = compile(spec);
          k->compile_ms = r.compile_ms;
          k->origin = KernelOrigin::compile;
          // A failed write has warned once already; the kernel still works from memory.
          if (disk_ != nullptr) disk_->write(key_str, DiskEntry{r.cubin, r.log});
          k->cubin = std::move(r.cubin);
          k->log = std::move(r.log);
        }
        k->ptxas = parse_ptxas_info(k->log, spec.entry);
        return k;
      },
      made);
}

const LoadedKernel& KernelCache::get_kernel(const JitSpec& spec, int device) {
  const CacheKey key = cache_key(spec);
  return modules_.get(key.str() + "@" + std::to_string(device), [&] {
    check_arch(spec, device);
    bool made = false;
    const CompiledKernel& c = cubin(spec, key, &made);

    ScopedDevice scope(device);
    const Driver& d = driver();
    auto k = std::make_shared<LoadedKernel>();
    k->key = key;
    k->entry = spec.entry;
    k->device = device;
    k->ptxas_log = c.log;
    k->ptxas = c.ptxas;
    k->compile_ms = c.compile_ms;
    k->disk_read_ms = c.disk_read_ms;
    k->origin = made ? c.origin : KernelOrigin::memory;

    const auto start = std::chrono::steady_clock::now();
    check_cu(d.ModuleLoadData(&k->module, c.cubin.data()), "get_kernel", "cuModuleLoadData");
    CUresult rc = d.ModuleGetFunction(&k->function, k->module, spec.entry.c_str());
    if (rc != CUDA_SUCCESS) {
      d.ModuleUnload(k->module);
      check_cu(rc, "get_kernel", ("cuModuleGetFunction(\"" + spec.entry + "\") in \"" +
                                  spec.name + "\"").c_str());
    }
    k->num_regs = func_attribute(k->function, CU_FUNC_ATTRIBUTE_NUM_REGS, "NUM_REGS");
    k->local_bytes = func_attribute(k->function, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "LOCAL_SIZE");
    k->static_smem = func_attribute(k->function, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "SHARED_SIZE");
    k->max_threads =
        func_attribute(k->function, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS");
    k->load_ms = ms_since(start);
    return k;
  });
}

KernelCache& default_kernel_cache() {
  // Leaked on purpose: see ~KernelCache.
  static DiskCache* disk = new DiskCache(DiskCache::default_dir());
  static KernelCache* cache = new KernelCache(disk);
  return *cache;
}

const LoadedKernel& get_kernel(const JitSpec& spec, int device) {
  return default_kernel_cache().get_kernel(spec, device);
}

std::vector<char> compile_only(const JitSpec& spec) {
  return default_kernel_cache().get_cubin(spec).cubin;
}

}  // namespace deca::jit
