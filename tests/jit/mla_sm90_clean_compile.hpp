// The sm90a MLA kernels' compile check, shared by the NVRTC tests of tests/jit/: the cubin exports
// the entry, and ptxas reports no spills, no stack and none of the warnings that silently cost
// the design its point: setmaxnreg ignored (C7508) or wgmma serialized (the accumulators touched
// inside a wgmma pipeline stage).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"
#include "jit/spec.hpp"

namespace deca {

// `bound`: the spilled and stack bytes allowed (none by default).
inline void expect_clean_compile(const jit::JitSpec& spec, const jit::PtxasInfo& bound = {}) {
  const jit::CompileResult r = jit::compile(spec);
  ASSERT_FALSE(r.cubin.empty()) << spec.name;
  ASSERT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log:\n" << r.log;
  EXPECT_TRUE(jit::testing::elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-32s %7.0f ms  regs=%d spill_stores=%d spill_loads=%d stack=%d\n",
              spec.name.c_str(), r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
              r.ptxas.spill_load_bytes, r.ptxas.stack_bytes);
  EXPECT_LE(r.ptxas.spill_store_bytes, bound.spill_store_bytes) << spec.name;
  EXPECT_LE(r.ptxas.spill_load_bytes, bound.spill_load_bytes) << spec.name;
  EXPECT_LE(r.ptxas.stack_bytes, bound.stack_bytes) << spec.name;
  // 384 threads (the direct kernel) or 512, one CTA per SM: the launch budget setmaxnreg
  // redistributes.
  const bool direct = spec.source.find("kDirect = 1;") != std::string::npos;
  EXPECT_LE(r.ptxas.registers, direct ? 168 : 128) << spec.name;
  EXPECT_EQ(r.log.find("C7508"), std::string::npos) << spec.name << ":\n" << r.log;
  EXPECT_EQ(r.log.find("serialized"), std::string::npos) << spec.name << ":\n" << r.log;
}

}  // namespace deca
