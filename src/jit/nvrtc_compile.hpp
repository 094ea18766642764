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

// The compute capabilities this NVRTC can target (e.g. 75, 80, 86, 87, 89, 90, 100, 120),
// ascending; empty if NVRTC cannot say.
std::vector<int> nvrtc_supported_archs();

// "13.0": part of the cache key, since a new NVRTC may generate different code.
std::string nvrtc_version();

// Everything compile() passes to NVRTC: codegen_options(spec), then --no-cache where NVRTC has
// its own cache (12.9+), then -I for each toolkit include directory.
//
// Why --no-cache: where a CUDA driver is loadable, NVRTC 12.9+ keeps PTX and CUBIN in the
// driver's compute cache ($CUDA_CACHE_PATH, by default ~/.nv/ComputeCache: shared by every
// process of the user, and blind to source comments). On a hit it returns the CUBIN without
// running ptxas, so the program log is empty: PtxasInfo came back not found, and the disk entry
// written from it stored the empty log. The deca disk cache keeps CUBIN and log together
// already, so NVRTC's cache would save nothing here. Without a driver NVRTC's cache is off,
// which is why machines without a GPU never saw this.
std::vector<std::string> nvrtc_options(const JitSpec& spec);

// Compiles with the embedded kernels/ headers and the toolkit's include directories. Throws
// deca::Error with the spec name and the full NVRTC log on failure.
CompileResult compile(const JitSpec& spec);

}  // namespace deca::jit
