#include "jit/spec.hpp"

#include "deca/error.hpp"

namespace deca::jit {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

}  // namespace

void validate(const JitSpec& spec) {
  // The name becomes part of a file name: keep it short and free of path separators.
  constexpr std::size_t kMaxName = 200;
  if (spec.name.empty() || spec.name.size() > kMaxName) {
    throw Error("jit::validate: spec.name: expected 1 to " + std::to_string(kMaxName) +
                " characters, got " + std::to_string(spec.name.size()));
  }
  for (char c : spec.name) {
    if (!is_name_char(c)) {
      throw Error("jit::validate: spec.name \"" + spec.name +
                  "\": expected only [A-Za-z0-9_.-], got '" + std::string(1, c) + "'");
    }
  }
  if (spec.name.front() == '.') {
    throw Error("jit::validate: spec.name \"" + spec.name + "\": must not start with '.'");
  }
  if (spec.entry.empty()) {
    throw Error("jit::validate: spec.entry (" + spec.name +
                "): expected the extern \"C\" __global__ function's name, got an empty string");
  }
  if (spec.source.empty()) {
    throw Error("jit::validate: spec.source (" + spec.name + "): expected kernel source, got empty");
  }
  // NVRTC 12.x/13.x compile for sm_75 and newer; the kernels need sm_80 (cp.async, bf16 mma).
  if (spec.arch < 80 || spec.arch % 10 > 9) {
    throw Error("jit::validate: spec.arch (" + spec.name +
                "): expected a compute capability >= 80 such as 80, 86, 89, 90, got " +
                std::to_string(spec.arch));
  }
}

std::string gpu_arch_name(int arch) {
  return arch == 90 ? "sm_90a" : "sm_" + std::to_string(arch);
}

}  // namespace deca::jit
