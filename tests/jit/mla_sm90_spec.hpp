// The JitSpec of the sm90a MLA sparse decode kernel for one page size, as the tests build it
// (the CUDA backend renders its own from the same prologue: Cfg::kPageSize, then the entry).
#pragma once

#include <string>

#include "jit/spec.hpp"

namespace deca::test {

inline jit::JitSpec mla_sm90_spec(int page_size) {
  jit::JitSpec spec;
  spec.name = "mla_sparse_sm90_test_p" + std::to_string(page_size);
  spec.source = "struct Cfg {\n  static constexpr int kPageSize = " + std::to_string(page_size) +
                ";\n};\n#include \"kernels/mla/sm90/entry.cuh\"\n";
  spec.entry = "deca_mla_sparse_decode_sm90";
  spec.arch = 90;
  return spec;
}

}  // namespace deca::test
