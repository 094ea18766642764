// NVRTC: JitSpec -> CUBIN for one architecture. No GPU or driver needed.
#pragma once

#include <string>
#include <vector>

#include "jit/ptxas_info.hpp"
#include "jit/spec.hpp"

namespace deca::jit {

struct CompileResult {
  std::vector<char> cubin;
  std::string log;      // NVRTC's program log: warnings and the ptxas -v report
  PtxasInfo ptxas;      // parsed from `log` for spec.entry
  double compile_ms = 0;
};

// The options that decide the generated code (hashed into the cache key): target, language
// standard, -default-device, -lineinfo, -DNDEBUG, ptxas -v, then spec.extra_options. No
// --use_fast_math: kernels keep IEEE semantics and call fast intrinsics where they mean to.
std::vector<std::string> codegen_options(const JitSpec& spec);

// "13.0": part of the cache key, since a new NVRTC may generate different code.
std::string nvrtc_version();

// Compiles with the embedded kernels/ headers and the toolkit's include directories. Throws
// deca::Error with the spec name and the full NVRTC log on failure.
CompileResult compile(const JitSpec& spec);

}  // namespace deca::jit
