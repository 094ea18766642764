// Module load and launch through the driver API. Skipped, with a message, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "jit/kernel_cache.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

class JitGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!driver_available()) GTEST_SKIP() << "no CUDA driver or device: module load/launch not tested";
    arch_ = device_arch(0);
    if (arch_ < 80) GTEST_SKIP() << "device 0 is sm_" << arch_ << ", the kernels need sm_80+";
  }
  // The JIT target for this device: sm_90a on Hopper, the device's own arch elsewhere.
  int arch_ = 0;
};

TEST_F(JitGpu, LoadsAndLaunches) {
  DiskCache disk(testing::fresh_dir("gpu"));
  KernelCache cache(&disk);
  const JitSpec spec = testing::axpy_spec(arch_);
  const LoadedKernel& k = cache.get_kernel(spec, 0);
  EXPECT_EQ(k.origin, KernelOrigin::compile);
  EXPECT_GT(k.num_regs, 0);
  EXPECT_EQ(k.local_bytes, 0);
  EXPECT_GE(k.max_threads, 256);
  EXPECT_EQ(&cache.get_kernel(spec, 0), &k);

  constexpr int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 0.5f * i;  // exact in bf16 for i < 512; compared against the bf16-rounded value below
    y[i] = 1.0f;
  }
  float *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * sizeof(float)), cudaSuccess);
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  int count = n;
  void* args[] = {&dx, &dy, &count};
  launch(k, Dim3{(n + 127) / 128}, Dim3{128}, 0, nullptr, args);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(n);
  cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  for (int i = 0; i < n; ++i) {
    // bf16 keeps 8 significant bits: the rounding error of x is at most 2^-8 relative.
    EXPECT_NEAR(out[i], 2.0f * x[i] + 1.0f, 2.0f * x[i] / 256 + 1e-6f) << "i=" << i;
  }
}

TEST_F(JitGpu, SecondCacheLoadsFromDiskAndMemoryOrigins) {
  const auto dir = testing::fresh_dir("gpu_disk");
  const JitSpec spec = testing::tile_spec(arch_, 8);
  DiskCache d1(dir), d2(dir);
  KernelCache first(&d1), second(&d2);
  EXPECT_EQ(first.get_kernel(spec, 0).origin, KernelOrigin::compile);
  const LoadedKernel& k = second.get_kernel(spec, 0);
  EXPECT_EQ(k.origin, KernelOrigin::disk);
  std::printf("[jit timing] %s: disk read %.2f ms, module load %.2f ms, regs %d (ptxas %d)\n",
              spec.name.c_str(), k.disk_read_ms, k.load_ms, k.num_regs, k.ptxas.registers);
  EXPECT_EQ(k.num_regs, k.ptxas.registers);
  // The cubin already in memory, loaded again (here by a third cache sharing nothing) is fine.
  KernelCache memory_only(nullptr);
  memory_only.get_cubin(spec);
  EXPECT_EQ(memory_only.get_kernel(spec, 0).origin, KernelOrigin::memory);
}

TEST_F(JitGpu, LargeDynamicSharedMemoryIsOptedIn) {
  JitSpec spec;
  spec.name = "test_smem_sm" + std::to_string(arch_);
  spec.entry = "deca_test_smem";
  spec.arch = arch_;
  spec.source =
      "#include \"kernels/gqa/params.cuh\"\n"
      "extern \"C\" __global__ void deca_test_smem(int* out, int n) {\n"
      "  extern __shared__ int buf[];\n"
      "  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;\n"
      "  __syncthreads();\n"
      "  if (threadIdx.x == 0) out[0] = buf[n - 1];\n"
      "}\n";
  KernelCache cache(nullptr);
  const LoadedKernel& k = cache.get_kernel(spec, 0);
  const int n = 80 * 1024 / 4;  // 80 KiB: above the 48 KiB default, below every sm_80+ limit
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, sizeof(int)), cudaSuccess);
  int count = n;
  void* args[] = {&out, &count};
  launch(k, Dim3{1}, Dim3{256}, n * sizeof(int), nullptr, args);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int got = 0;
  cudaMemcpy(&got, out, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(out);
  EXPECT_EQ(got, n - 1);
  EXPECT_GE(k.dynamic_smem_limit.load(), static_cast<std::size_t>(n * 4));
}

TEST_F(JitGpu, WrongArchIsRejectedBeforeCompiling) {
  const int other = arch_ == 90 ? 80 : 90;
  KernelCache cache(nullptr);
  try {
    cache.get_kernel(testing::axpy_spec(other), 0);
    FAIL() << "expected deca::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run on device 0"), std::string::npos) << e.what();
  }
}

TEST_F(JitGpu, MissingEntryNamesTheCUresult) {
  JitSpec spec = testing::axpy_spec(arch_, "_entry");
  spec.entry = "deca_test_axpy_entry_wrong";
  KernelCache cache(nullptr);
  try {
    cache.get_kernel(spec, 0);
    FAIL() << "expected deca::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_NOT_FOUND"), std::string::npos) << e.what();
  }
}

TEST(JitNoGpu, DriverAbsenceIsAClearError) {
  if (driver_available()) GTEST_SKIP() << "a driver is present: nothing to check here";
  try {
    driver();
    FAIL() << "expected deca::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("jit::driver"), std::string::npos) << e.what();
  }
  KernelCache cache(nullptr);
  EXPECT_THROW(cache.get_kernel(testing::axpy_spec(90), 0), Error);
}

}  // namespace
}  // namespace deca::jit
