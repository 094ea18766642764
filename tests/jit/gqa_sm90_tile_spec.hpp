// The JIT spec of the e4m3 wgmma tile probe (kernels/gqa/sm90/fp8_tile.cuh), shared by its NVRTC
// test (CI) and its GPU test.
#pragma once

#include "jit/spec.hpp"

namespace deca::test {

inline jit::JitSpec gqa_sm90_fp8_tile_spec() {
  jit::JitSpec spec;
  spec.name = "gqa_sm90_fp8_tile_probe";
  spec.source = "#include \"kernels/gqa/sm90/fp8_tile_probe_entry.cuh\"\n";
  spec.entry = "deca_gqa_sm90_fp8_tile_probe";
  spec.arch = 90;
  return spec;
}

}  // namespace deca::test
