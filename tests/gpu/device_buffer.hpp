// Device memory for GPU tests: an owning buffer with copies to and from host tensors, and the
// skip-unless-GPU guard every test in this folder starts with.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/host_tensor.hpp"
#include "cuda/backend.hpp"

namespace deca::test {

inline void cuda_ok(cudaError_t rc, const char* what) {
  ASSERT_EQ(rc, cudaSuccess) << what << ": " << cudaGetErrorName(rc) << " "
                             << cudaGetErrorString(rc);
}

#define DECA_REQUIRE_GPU()                                                       \
  do {                                                                           \
    if (!::deca::cuda::available()) GTEST_SKIP() << "no CUDA GPU on this machine"; \
  } while (0)

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ && cudaMalloc(&ptr_, bytes_) != cudaSuccess) {
      ptr_ = nullptr;
      ADD_FAILURE() << "cudaMalloc(" << bytes_ << ") failed";
    }
  }
  explicit DeviceBuffer(const HostTensor& t) : DeviceBuffer(t.bytes()) {
    if (ptr_) cudaMemcpy(ptr_, t.raw(), t.bytes(), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  void fill(std::uint8_t byte) const {
    if (ptr_) cudaMemset(ptr_, byte, bytes_);
  }
  void to_host(HostTensor& t) const { cudaMemcpy(t.raw(), ptr_, t.bytes(), cudaMemcpyDeviceToHost); }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace deca::test
