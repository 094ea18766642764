// Sets or unsets an environment variable for one scope and restores the old value on every exit,
// including a failed ASSERT_*, so that no later test (in any --gtest_shuffle order) sees it.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace deca::jit::testing {

class ScopedEnv {
 public:
  // `value` null: unset.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const char* value) {
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace deca::jit::testing
