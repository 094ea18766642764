#include <gtest/gtest.h>

#include "jit/ptxas_info.hpp"

namespace deca::jit {
namespace {

const char* kLog =
    "ptxas info    : 4 bytes gmem\n"
    "ptxas info    : Compiling entry function 'foo_v2' for 'sm_90a'\n"
    "ptxas info    : Function properties for foo_v2\n"
    "ptxas         .     64 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
    "ptxas info    : Used 255 registers, used 1 barriers\n"
    "ptxas info    : Compiling entry function 'foo' for 'sm_90a'\n"
    "ptxas info    : Function properties for foo\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 40 registers, used 0 barriers, 380 bytes cmem[0]\n";

TEST(PtxasInfo, ParsesTheNamedEntryOnly) {
  PtxasInfo foo = parse_ptxas_info(kLog, "foo");
  EXPECT_TRUE(foo.found);
  EXPECT_EQ(foo.registers, 40);
  EXPECT_EQ(foo.stack_bytes, 0);
  EXPECT_EQ(foo.spill_store_bytes, 0);

  PtxasInfo v2 = parse_ptxas_info(kLog, "foo_v2");
  EXPECT_EQ(v2.registers, 255);
  EXPECT_EQ(v2.stack_bytes, 64);
  EXPECT_EQ(v2.spill_store_bytes, 12);
  EXPECT_EQ(v2.spill_load_bytes, 8);
  EXPECT_EQ(to_string(v2), "regs 255, stack 64 B, spill st/ld 12/8 B");
}

TEST(PtxasInfo, MissingEntryIsNotFound) {
  PtxasInfo none = parse_ptxas_info(kLog, "bar");
  EXPECT_FALSE(none.found);
  EXPECT_EQ(none.registers, -1);
  EXPECT_EQ(to_string(none), "no ptxas info");
  EXPECT_FALSE(parse_ptxas_info("", "foo").found);
}

}  // namespace
}  // namespace deca::jit
