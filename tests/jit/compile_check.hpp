// What every NVRTC compile test checks of a kernel, in one place: the compile gives a cubin (else
// the log is shown), ptxas's report is in the log, and the cubin exports the entry; one line is
// printed with the compile time, registers, spilled bytes and stack. Spills and stack are the
// caller's to judge (expect_no_spills).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "jit/elf_symbols.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::jit::testing {

inline CompileResult compile_and_check(const JitSpec& spec) {
  CompileResult r = compile(spec);
  EXPECT_FALSE(r.cubin.empty()) << spec.name << ":\n" << r.log;
  EXPECT_TRUE(r.ptxas.found) << spec.name << ": no ptxas report in the NVRTC log:\n" << r.log;
  if (!r.cubin.empty()) EXPECT_TRUE(elf_has_symbol(r.cubin, spec.entry)) << spec.name;
  std::printf("[nvrtc] %-60s %7.0f ms  regs=%d spill_stores=%d spill_loads=%d stack=%d\n",
              spec.name.c_str(), r.compile_ms, r.ptxas.registers, r.ptxas.spill_store_bytes,
              r.ptxas.spill_load_bytes, r.ptxas.stack_bytes);
  return r;
}

// Nothing spilled to local memory and no stack frame (`stack` false: the frame is not checked).
inline void expect_no_spills(const CompileResult& r, const std::string& name, bool stack = true) {
  EXPECT_EQ(r.ptxas.spill_store_bytes, 0) << name;
  EXPECT_EQ(r.ptxas.spill_load_bytes, 0) << name;
  if (stack) EXPECT_EQ(r.ptxas.stack_bytes, 0) << name;
}

}  // namespace deca::jit::testing
