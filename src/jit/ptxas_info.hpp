// Resource usage that ptxas reports with -v (NVRTC returns it in the program log). Read on
// machines without a GPU (CI, precompile) where the driver's cuFuncGetAttribute is unavailable.
#pragma once

#include <string>
#include <string_view>

namespace deca::jit {

struct PtxasInfo {
  bool found = false;     // the log had a "Function properties for <entry>" block
  int registers = -1;
  int stack_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
};

// Parses the block ptxas prints for `entry`:
//   ptxas info    : Function properties for <entry>
//   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 8 registers, used 0 barriers
PtxasInfo parse_ptxas_info(std::string_view log, std::string_view entry);

// "regs 8, stack 0 B, spill st/ld 0/0 B" (or "no ptxas info") for logs and benchmarks.
std::string to_string(const PtxasInfo& info);

}  // namespace deca::jit
