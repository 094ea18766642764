// Small kernels given as source strings, for the JIT tests. Each includes an embedded kernels/
// header (proving that embedded includes resolve) and toolkit headers (proving that the toolkit
// include directories were found).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "jit/spec.hpp"

namespace deca::jit::testing {

// out[i] = a * x[i] + y[i] in bf16 arithmetic converted through float; the constant `kScale` comes
// from the generated prologue, as in real specializations.
inline JitSpec axpy_spec(int arch, const std::string& tag = "") {
  JitSpec s;
  s.name = "test_axpy_sm" + std::to_string(arch) + tag;
  s.entry = "deca_test_axpy" + tag;
  s.arch = arch;
  s.source =
      "constexpr float kScale = 2.0f;\n"
      "#include \"kernels/gqa/params.cuh\"\n"
      "#include <cuda_bf16.h>\n"
      "#include <cuda/std/cstdint>\n"
      "static_assert(sizeof(deca::GqaParams) > 0, \"params visible\");\n"
      "extern \"C\" __global__ void deca_test_axpy" + tag +
      "(const float* x, float* y, int n) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n) {\n"
      "    __nv_bfloat16 b = __float2bfloat16(x[i]);\n"
      "    y[i] = kScale * __bfloat162float(b) + y[i];\n"
      "  }\n"
      "}\n";
  return s;
}

// A heavier kernel (unrolled tiles in registers) to make cold-compile timing meaningful.
inline JitSpec tile_spec(int arch, int tile) {
  JitSpec s;
  s.name = "test_tile_sm" + std::to_string(arch) + "_t" + std::to_string(tile);
  s.entry = "deca_test_tile";
  s.arch = arch;
  s.source = "constexpr int kTile = " + std::to_string(tile) + ";\n" +
             "#include \"kernels/gqa/params.cuh\"\n"
             "#include <cuda_fp16.h>\n"
             "extern \"C\" __global__ void deca_test_tile(const __half* a, float* out) {\n"
             "  float acc[kTile];\n"
             "  #pragma unroll\n"
             "  for (int i = 0; i < kTile; ++i) acc[i] = 0.f;\n"
             "  for (int k = 0; k < 64; ++k) {\n"
             "    #pragma unroll\n"
             "    for (int i = 0; i < kTile; ++i)\n"
             "      acc[i] = fmaf(__half2float(a[(k * kTile + i) * blockDim.x + threadIdx.x]), acc[(i + 1) % kTile], acc[i]);\n"
             "  }\n"
             "  float s = 0.f;\n"
             "  #pragma unroll\n"
             "  for (int i = 0; i < kTile; ++i) s += acc[i];\n"
             "  out[blockIdx.x * blockDim.x + threadIdx.x] = s;\n"
             "}\n";
  return s;
}

// A fresh, empty directory under the system temp dir, unique per call; all of them are removed
// when the test program exits.
inline std::filesystem::path fresh_dir(const std::string& what) {
  struct Registry {
    std::vector<std::filesystem::path> dirs;
    ~Registry() {
      std::error_code ec;
      for (const auto& d : dirs) {
        std::filesystem::permissions(d, std::filesystem::perms::owner_all, ec);
        std::filesystem::remove_all(d, ec);
      }
    }
  };
  static Registry registry;
  static std::mutex mu;
  static int counter = 0;
  std::lock_guard<std::mutex> lock(mu);
  std::filesystem::path p = std::filesystem::temp_directory_path() /
                            ("deca_jit_test_" + std::to_string(::getpid()) + "_" + what + "_" +
                             std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  registry.dirs.push_back(p);
  return p;
}

}  // namespace deca::jit::testing
