#include <gtest/gtest.h>

#include "deca/error.hpp"
#include "jit/spec.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

std::string validate_error(const JitSpec& s) {
  try {
    validate(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JitSpec, ValidSpecPasses) { EXPECT_EQ(validate_error(testing::axpy_spec(90)), ""); }

TEST(JitSpec, RejectsBadFieldsNamingThem) {
  JitSpec s = testing::axpy_spec(90);
  s.name = "has/slash";
  EXPECT_NE(validate_error(s).find("spec.name"), std::string::npos);
  s.name = "";
  EXPECT_NE(validate_error(s).find("spec.name"), std::string::npos);
  s.name = std::string(201, 'a');
  EXPECT_NE(validate_error(s).find("201"), std::string::npos);
  s.name = "..";
  EXPECT_NE(validate_error(s).find("spec.name"), std::string::npos);

  s = testing::axpy_spec(90);
  s.entry = "";
  EXPECT_NE(validate_error(s).find("spec.entry"), std::string::npos);

  s = testing::axpy_spec(90);
  s.arch = 75;
  EXPECT_NE(validate_error(s).find("got 75"), std::string::npos);
}

TEST(JitSpec, ArchNames) {
  EXPECT_EQ(gpu_arch_name(90), "sm_90a");
  EXPECT_EQ(gpu_arch_name(80), "sm_80");
  EXPECT_EQ(gpu_arch_name(89), "sm_89");
}

}  // namespace
}  // namespace deca::jit
