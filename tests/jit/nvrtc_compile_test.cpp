#include <gtest/gtest.h>
#include <nvrtc.h>

#include <algorithm>

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

// Compiling the same program again, in this process or another, must run ptxas again: NVRTC's
// own cache (12.9+, live only where a CUDA driver is loadable) returned the cached CUBIN with a
// log that had no ptxas report, so the second compile of a spec lost its PtxasInfo.
TEST_P(NvrtcCompile, RepeatedCompileKeepsThePtxasReport) {
  const JitSpec spec = testing::axpy_spec(GetParam(), "_again");
  const CompileResult first = compile(spec);
  const CompileResult second = compile(spec);
  ASSERT_TRUE(first.ptxas.found) << first.log;
  EXPECT_TRUE(second.ptxas.found) << second.log;
  EXPECT_NE(second.log.find(gpu_arch_name(spec.arch)), std::string::npos) << second.log;
  // Not the logs byte for byte: ptxas -v also reports its own compile time.
  EXPECT_EQ(second.ptxas.registers, first.ptxas.registers);
  EXPECT_EQ(second.ptxas.stack_bytes, first.ptxas.stack_bytes);
  EXPECT_EQ(second.ptxas.spill_store_bytes, first.ptxas.spill_store_bytes);
  EXPECT_EQ(second.cubin, first.cubin);
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

TEST(NvrtcCompileOptions, NvrtcOwnCacheIsBypassed) {
  const JitSpec spec = testing::axpy_spec(90);
  const std::vector<std::string> codegen = codegen_options(spec);
  const std::vector<std::string> all = nvrtc_options(spec);
  ASSERT_GT(all.size(), codegen.size());
  EXPECT_TRUE(std::equal(codegen.begin(), codegen.end(), all.begin()));
  int major = 0, minor = 0;
  ASSERT_EQ(nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
  const bool has_cache = major > 12 || (major == 12 && minor >= 9);
  EXPECT_EQ(std::find(all.begin(), all.end(), "--no-cache") != all.end(), has_cache)
      << "NVRTC " << major << "." << minor;
  // Not a codegen option: it changes no generated code, so it stays out of the cache key.
  EXPECT_EQ(std::find(codegen.begin(), codegen.end(), "--no-cache"), codegen.end());
  EXPECT_EQ(all.back().rfind("-I", 0), 0u) << all.back();
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
