#include <gtest/gtest.h>

#include <fstream>

#include "deca/error.hpp"
#include "jit/toolkit_paths.hpp"
#include "scoped_env.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

namespace fs = std::filesystem;

fs::path fake_toolkit_include(bool with_cccl) {
  const fs::path inc = testing::fresh_dir("toolkit") / "include";
  fs::create_directories(inc);
  std::ofstream(inc / "cuda_fp16.h") << "// fake\n";
  if (with_cccl) fs::create_directories(inc / "cccl");
  return inc;
}

TEST(ToolkitPaths, FirstCandidateWithCudaFp16Wins) {
  const fs::path empty = testing::fresh_dir("toolkit_empty");
  const fs::path a = fake_toolkit_include(true);
  const fs::path b = fake_toolkit_include(false);
  std::vector<std::string> got =
      pick_toolkit_include_dirs({(empty / "nope").string(), empty.string(), a.string(), b.string()});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(fs::path(got[0]), fs::weakly_canonical(a));
  EXPECT_EQ(fs::path(got[1]), fs::weakly_canonical(a) / "cccl");

  got = pick_toolkit_include_dirs({b.string(), a.string()});
  ASSERT_EQ(got.size(), 1u);  // no cccl/ there: CUDA 12 layout
  EXPECT_EQ(fs::path(got[0]), fs::weakly_canonical(b));
}

TEST(ToolkitPaths, NoneFoundListsEveryPathTried) {
  const fs::path empty = testing::fresh_dir("toolkit_none");
  const std::vector<std::string> tried = {(empty / "x").string(), (empty / "y").string()};
  try {
    pick_toolkit_include_dirs(tried);
    FAIL() << "expected deca::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& t : tried) EXPECT_NE(msg.find(t), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUDA_HOME"), std::string::npos) << msg;
  }
}

TEST(ToolkitPaths, CudaHomeComesFirst) {
  testing::ScopedEnv cuda_home("CUDA_HOME", "/opt/deca_fake_cuda");
  const std::vector<std::string> c = toolkit_include_candidates();
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "/opt/deca_fake_cuda/include");
  // The libnvrtc-relative guesses and /usr/local/cuda follow.
  EXPECT_NE(std::find(c.begin(), c.end(), "/usr/local/cuda/include"), c.end());
  EXPECT_GT(c.size(), 2u);
}

}  // namespace
}  // namespace deca::jit
