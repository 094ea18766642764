#include "jit/ptxas_info.hpp"

#include <cstdlib>

namespace deca::jit {

namespace {

// The integer right before `suffix` in `line`, or -1.
int number_before(std::string_view line, std::string_view suffix) {
  std::size_t at = line.find(suffix);
  if (at == std::string_view::npos) return -1;
  std::size_t end = at;
  while (end > 0 && line[end - 1] == ' ') --end;
  std::size_t begin = end;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9') --begin;
  if (begin == end) return -1;
  return std::atoi(std::string(line.substr(begin, end - begin)).c_str());
}

}  // namespace

PtxasInfo parse_ptxas_info(std::string_view log, std::string_view entry) {
  PtxasInfo info;
  const std::string header = "Function properties for " + std::string(entry);
  bool inside = false;
  for (std::size_t pos = 0; pos < log.size();) {
    std::size_t end = log.find('\n', pos);
    if (end == std::string_view::npos) end = log.size();
    std::string_view line = log.substr(pos, end - pos);
    pos = end + 1;
    if (!inside) {
      // Exact match of the name: "foo" must not match the block of "foo_v2".
      std::size_t at = line.find(header);
      inside = at != std::string_view::npos && at + header.size() == line.size();
      continue;
    }
    if (line.find("Function properties for") != std::string_view::npos) break;
    if (line.find("bytes stack frame") != std::string_view::npos) {
      info.found = true;
      info.stack_bytes = number_before(line, "bytes stack frame");
      info.spill_store_bytes = number_before(line, "bytes spill stores");
      info.spill_load_bytes = number_before(line, "bytes spill loads");
    }
    int regs = number_before(line, "registers");
    if (regs >= 0) {
      info.found = true;
      info.registers = regs;
      break;
    }
  }
  return info;
}

std::string to_string(const PtxasInfo& info) {
  if (!info.found) return "no ptxas info";
  return "regs " + std::to_string(info.registers) + ", stack " + std::to_string(info.stack_bytes) +
         " B, spill st/ld " + std::to_string(info.spill_store_bytes) + "/" +
         std::to_string(info.spill_load_bytes) + " B";
}

}  // namespace deca::jit
