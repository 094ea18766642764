#include "jit/toolkit_paths.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>

#include "deca/error.hpp"

namespace deca::jit {

namespace fs = std::filesystem;

std::vector<std::string> toolkit_include_candidates() {
  std::vector<std::string> out;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') out.push_back((fs::path(v) / "include").string());
  }
  // The libnvrtc actually loaded is the best guess of a matching toolkit: lib64/ (or
  // targets/<triple>/lib/) sits beside include/.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    fs::path lib = fs::path(info.dli_fname).parent_path();
    fs::path real = fs::canonical(info.dli_fname, ec).parent_path();
    for (const fs::path& dir : {lib, real}) {
      if (dir.empty()) continue;
      out.push_back((dir / ".." / "include").string());
      out.push_back((dir / ".." / ".." / "include").string());
      out.push_back((dir / ".." / "targets" / "x86_64-linux" / "include").string());
    }
  }
  out.push_back("/usr/local/cuda/include");
#ifdef DECA_CUDA_TOOLKIT_INCLUDE
  // CMake's list of include directories, ';'-separated.
  std::string built = DECA_CUDA_TOOLKIT_INCLUDE;
  for (std::size_t pos = 0; pos <= built.size();) {
    std::size_t end = built.find(';', pos);
    if (end == std::string::npos) end = built.size();
    if (end > pos) out.push_back(built.substr(pos, end - pos));
    pos = end + 1;
  }
#endif
  return out;
}

std::vector<std::string> pick_toolkit_include_dirs(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const fs::path dir : candidates) {
    std::error_code ec;
    fs::path norm = fs::weakly_canonical(dir, ec);
    if (ec) norm = dir.lexically_normal();
    if (fs::exists(norm / "cuda_fp16.h", ec)) {
      std::vector<std::string> dirs = {norm.string()};
      // CUDA 13 moved CCCL (<cuda/std/...>) under include/cccl; CUDA 12 has it in include/.
      if (fs::is_directory(norm / "cccl", ec)) dirs.push_back((norm / "cccl").string());
      return dirs;
    }
    tried += "\n  " + norm.string();
  }
  throw Error(
      "jit::toolkit_include_dirs: expected a CUDA toolkit include directory holding cuda_fp16.h "
      "(set CUDA_HOME), none found; tried:" + tried);
}

const std::vector<std::string>& toolkit_include_dirs() {
  // Not a function-local static initialised by find_include_dirs(): a throw there must be
  // retried on the next call (the user may fix CUDA_HOME), not cached.
  static std::mutex mu;
  static std::vector<std::string> dirs;
  std::lock_guard<std::mutex> lock(mu);
  if (dirs.empty()) dirs = pick_toolkit_include_dirs(toolkit_include_candidates());
  return dirs;
}

}  // namespace deca::jit
