// JitSpec: one kernel specialization as NVRTC sees it. Built by the per-family code (e.g. the GQA
// specialization renders itself to one); everything below src/jit/ is generic over kernels.
#pragma once

#include <string>
#include <vector>

namespace deca::jit {

struct JitSpec {
  // Readable, unique specialization name, e.g. "gqa_sm90_d128_g8_p64_nhd_bf16_bf16_bf16".
  // It is the in-memory cache key, the start of the disk file name and the kernel-name suffix, so
  // it may hold only [A-Za-z0-9_.-] (checked by validate()).
  std::string name;
  // A short generated prologue (constexpr constants, using lines) followed by
  // #include "kernels/...". Embedded kernel headers include each other by their full
  // "kernels/..." path: NVRTC matches include names literally.
  std::string source;
  // The __global__ function's name, declared extern "C" so no name lowering is needed.
  std::string entry;
  // Compute capability as major * 10 + minor: 80, 86, 89, 90 (90 compiles for sm_90a).
  int arch = 0;
  // Passed to NVRTC after the standard options (e.g. "-DDECA_TRACE=1", "-maxrregcount=128").
  std::vector<std::string> extra_options;
};

// Throws deca::Error naming the field when the spec cannot be compiled as given.
void validate(const JitSpec& spec);

// "sm_90a" for 90 (wgmma, setmaxnreg need the arch-specific target), "sm_<arch>" otherwise.
std::string gpu_arch_name(int arch);

}  // namespace deca::jit
