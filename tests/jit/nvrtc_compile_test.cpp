#include <gtest/gtest.h>

#include "deca/error.hpp"
#include "elf_symbols.hpp"
#include "jit/embedded.hpp"
#include "jit/nvrtc_compile.hpp"
#include "jit/toolkit_paths.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

class NvrtcCompile : public ::testing::TestWithParam<int> {};

TEST_P(NvrtcCompile, CubinHoldsTheEntrySymbol) {
  const JitSpec spec = testing::axpy_spec(GetParam());
  CompileResult r = compile(spec);
  ASSERT_FALSE(r.cubin.empty());
  EXPECT_TRUE(testing::elf_has_symbol(r.cubin, spec.entry)) << "no symbol " << spec.entry;
  EXPECT_FALSE(testing::elf_has_symbol(r.cubin, "deca_test_not_there"));
  // ptxas -v reached the log and names the target.
  EXPECT_NE(r.log.find(gpu_arch_name(spec.arch)), std::string::npos) << r.log;
  EXPECT_TRUE(r.ptxas.found) << r.log;
  EXPECT_GT(r.ptxas.registers, 0);
  EXPECT_EQ(r.ptxas.spill_store_bytes, 0);
  EXPECT_GT(r.compile_ms, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Archs, NvrtcCompile, ::testing::Values(80, 86, 89, 90),
                         [](const auto& info) { return "sm" + std::to_string(info.param); });

TEST(NvrtcCompileOptions, StandardOptions) {
  JitSpec spec = testing::axpy_spec(90);
  spec.extra_options = {"-DDECA_X=1"};
  const std::vector<std::string> o = codegen_options(spec);
  EXPECT_EQ(o.front(), "--gpu-architecture=sm_90a");
  EXPECT_EQ(o.back(), "-DDECA_X=1");
  for (const char* want : {"-default-device", "-lineinfo", "-DNDEBUG", "--ptxas-options=-v"}) {
    EXPECT_NE(std::find(o.begin(), o.end(), want), o.end()) << want;
  }
  EXPECT_EQ(std::find(o.begin(), o.end(), "--use_fast_math"), o.end());
}

TEST(NvrtcCompileOptions, ExtraOptionsReachTheCompiler) {
  JitSpec spec = testing::axpy_spec(80, "_opt");
  spec.source = "#ifndef DECA_MUST_BE_SET\n#error DECA_MUST_BE_SET missing\n#endif\n" + spec.source;
  EXPECT_THROW(compile(spec), Error);
  spec.extra_options = {"-DDECA_MUST_BE_SET"};
  EXPECT_TRUE(testing::elf_has_symbol(compile(spec).cubin, spec.entry));
}

TEST(NvrtcCompileErrors, SyntaxErrorThrowsWithNameAndLog) {
  JitSpec spec = testing::axpy_spec(90, "_broken");
  spec.source += "extern \"C\" __global__ void broken() { int x = ; }\n";
  try {
    compile(spec);
    FAIL() << "expected deca::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(spec.name), std::string::npos) << msg;
    EXPECT_NE(msg.find("NVRTC_ERROR_COMPILATION"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected an expression"), std::string::npos) << msg;  // from the log
  }
}

TEST(NvrtcCompileErrors, MissingEmbeddedHeaderIsReported) {
  JitSpec spec = testing::axpy_spec(80, "_missing");
  spec.source = "#include \"kernels/does/not_exist.cuh\"\n" + spec.source;
  try {
    compile(spec);
    FAIL() << "expected deca::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernels/does/not_exist.cuh"), std::string::npos)
        << e.what();
  }
}

TEST(NvrtcEnvironment, EmbeddedAndToolkitHeadersFound) {
  std::size_t count = 0;
  const EmbeddedFile* files = embedded_files(&count);
  bool has_params = false;
  for (std::size_t i = 0; i < count; ++i) {
    has_params |= std::string(files[i].path) == "kernels/gqa/params.cuh";
  }
  EXPECT_TRUE(has_params);
  const auto& dirs = toolkit_include_dirs();
  ASSERT_FALSE(dirs.empty());
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dirs[0]) / "cuda_fp16.h"));
  EXPECT_NE(nvrtc_version(), "unknown");
}

}  // namespace
}  // namespace deca::jit
