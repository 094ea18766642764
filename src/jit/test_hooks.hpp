// Counters for tests only (e.g. "eight threads asking for one key compile once"). Not part of
// any interface that production code may depend on.
#pragma once

#include <cstdint>

namespace deca::jit::test_hooks {

// NVRTC compilations started by jit::compile() in this process.
std::uint64_t nvrtc_compile_count();

}  // namespace deca::jit::test_hooks
