// Device memory for GPU tests: an owning buffer with copies to and from host tensors, and the
// skip-unless-GPU guard every test in this folder starts with.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
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
  // New contents from `t` (at most the buffer's bytes), e.g. lengths changed after a capture.
  void from_host(const HostTensor& t) const {
    cuda_ok(cudaMemcpy(ptr_, t.raw(), std::min(t.bytes(), bytes_), cudaMemcpyHostToDevice), "from_host");
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// One call captured in a CUDA graph on its own stream, for the tests that check that a launch
// allocates and synchronizes nothing, and that a replay reads what device memory holds then (new
// lengths written after the capture). capture(run): run(stream) once outside the capture (the
// first use loads the modules; `warm` false when the caller ran it on stream() already), then a
// second run captured and instantiated; replay(n): n launches of the graph, then a sync. Call
// both under ASSERT_NO_FATAL_FAILURE.
class GraphReplay {
 public:
  GraphReplay() { cuda_ok(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  ~GraphReplay() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

  cudaStream_t stream() const { return stream_; }
  cudaGraph_t graph() const { return graph_; }  // the captured graph (null before capture)
  template <class Run>
  void capture(Run&& run, bool warm = true) {
    if (warm) {
      run(stream_);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    run(stream_);
    ASSERT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec_, graph_, 0), cudaSuccess);
  }
  void replay(int times) const {
    for (int i = 0; i < times; ++i) ASSERT_EQ(cudaGraphLaunch(exec_, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace deca::test
