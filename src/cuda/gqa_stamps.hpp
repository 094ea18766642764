// The phase stamps of the Hopper GQA kernels (kernels/gqa/stamps.cuh), host side: the stamp build
// of a plan's kernel launched as gqa_decode launches the plan's own, and its records read back.
// A timing aid for deca-bench --stamps and the GPU tests only: not in the public API, no
// environment variable; a plan never selects a stamp build.
#pragma once

#include <string>
#include <vector>

#include "cuda/gqa_spec.hpp"
#include "cuda/stamp_summary.hpp"
#include "deca/gqa.hpp"
#include "jit/kernel_cache.hpp"
#include "kernels/gqa/params.cuh"

namespace deca::cuda {

// ---- From gqa_backend.cpp (the plan's prepared key and the launch gqa_decode makes) ----
// The plan's kernel key with the stamps bit set.
GqaKernelKey gqa_stamp_key(const GqaPlan& plan);
// CTAs in gqa_decode's grid for `params`.
long long gqa_grid_ctas(const GqaPlan& plan, const GqaParams& params);
// gqa_decode's launch (grid, block, shared memory, programmatic dependent launch) of `kernel`,
// compiled from `key` (the plan's key or its stamp build).
void gqa_decode_with(const GqaPlan& plan, const GqaKernelKey& key, const jit::LoadedKernel& kernel,
                     const GqaParams& params, void* stream);

// Compiles (or finds in the cubin cache) the stamp build of the kernel a plan of `config` runs on
// devices of compute capability `arch` (132 SMs, as precompile_gqa), without a GPU; returns its
// name, or "" when that kernel has no stamp build (not a Hopper kernel).
std::string precompile_gqa_stamps(const GqaConfig& config, int arch);

// ---- gqa_stamps.cpp ----
// Whether the plan's kernel has a stamp build: the Hopper kernels (rows on N and on M) mark every
// phase; the skip-softmax kernel only its entry and epilogue (the events it does not reach stay
// empty); the portable kernel none (false).
bool gqa_stamps_supported(const GqaPlan& plan);

// The stamp build of plan's kernel, compiled on first use (NVRTC, then the disk cache) and loaded
// on the plan's device. Throws deca::Error from `fn` when gqa_stamps_supported is false.
class GqaStamper {
 public:
  GqaStamper(const GqaPlan& plan, const std::string& fn);
  const std::string& kernel_name() const { return name_; }
  // Zeroes the records on `stream` (queue it before the L2 flush: the buffer's lines are then
  // written back during the flush, not during the timed kernel).
  void clear(void* stream) const;
  // On `stream`: the mark kernel (slot 0), the stamped kernel with `params` (as gqa_decode), the
  // mark kernel (slot 1). Queues only.
  void run(const GqaParams& params, void* stream) const;
  // Synchronizes `stream` and reads the records of the launch of `params` (its grid's CTAs, up to
  // kStampCtas) and the two marks.
  StampRun read(const GqaParams& params, void* stream) const;

 private:
  const GqaPlan* plan_;
  GqaKernelKey key_;
  std::string name_;
  const jit::LoadedKernel* kernel_ = nullptr;
  CUfunction mark_ = nullptr;
  CUdeviceptr buffer_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace deca::cuda
