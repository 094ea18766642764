// The one exception type deca throws. Messages name the argument, what was expected and what
// came, e.g. "gqa_decode: k_cache: expected dtype fp8_e4m3 (the plan's kv_dtype), got bf16".
#pragma once

#include <stdexcept>
#include <string>

namespace deca {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace deca
