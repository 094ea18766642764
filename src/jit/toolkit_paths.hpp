// Where the CUDA toolkit's headers are at run time (NVRTC needs <cuda_bf16.h>, <cuda_fp8.h>,
// <cuda/std/...>), for installs that moved since the library was built.
#pragma once

#include <string>
#include <vector>

namespace deca::jit {

// The include directories to pass to NVRTC: <toolkit>/include and <toolkit>/include/cccl of the
// first candidate that holds cuda_fp16.h. Candidates, in order: $CUDA_HOME, $CUDA_PATH, the
// toolkit around the loaded libnvrtc, /usr/local/cuda, the toolkit found at build time. Found
// once per process; throws deca::Error listing every directory tried when none fits.
const std::vector<std::string>& toolkit_include_dirs();

// The candidate include directories above, in order (uncached; for tests and diagnostics).
std::vector<std::string> toolkit_include_candidates();

// The first of `candidates` holding cuda_fp16.h, plus its cccl/ when present; throws
// deca::Error listing every candidate when none does.
std::vector<std::string> pick_toolkit_include_dirs(const std::vector<std::string>& candidates);

}  // namespace deca::jit
