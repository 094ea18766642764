// A differential-test case's host tensors mirrored on the GPU (tests/common/diff_case.hpp): views
// move to the device copy at the same offset, outputs are poisoned and read back, and a workspace
// is kept per mirror. Every device operation is ordered on the mirror's stream, so that mirrors
// on different (non-blocking) streams can run at once.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "common/diff_case.hpp"
#include "gpu/device_buffer.hpp"

namespace deca::test::diff {

class Mirror {
 public:
  Mirror(const std::vector<HostTensor*>& tensors, cudaStream_t stream = nullptr) : stream_(stream) {
    for (HostTensor* t : tensors) {
      // Never empty: a view of zero elements still gets a pointer into device memory.
      DeviceBuffer b(std::max<std::size_t>(t->bytes(), 256));
      if (b.get() && t->bytes()) cudaMemcpy(b.get(), t->raw(), t->bytes(), cudaMemcpyHostToDevice);
      host_.push_back(t);
      device_.push_back(std::move(b));
    }
    // A copy from pageable memory may still be in flight when cudaMemcpy returns; work on another
    // stream must not overtake it.
    cudaDeviceSynchronize();
  }

  TensorView move(const TensorView& v) const {
    const char* p = static_cast<const char*>(v.data);
    for (std::size_t i = 0; i < host_.size(); ++i) {
      const char* base = static_cast<const char*>(host_[i]->raw());
      if (p >= base && p < base + std::max<std::size_t>(host_[i]->bytes(), 1)) {
        TensorView d = v;
        d.data = static_cast<char*>(device_[i].get()) + (p - base);
        d.device = Device::cuda(0);
        return d;
      }
    }
    ADD_FAILURE() << "a view points into no tensor of its case";
    return v;
  }

  // A side that runs on this mirror's memory and stream.
  Side side() {
    Side s;
    s.device = Device::cuda(0);
    s.move = [this](const TensorView& v) { return move(v); };
    s.workspace = [this](std::size_t bytes) { return workspace(bytes); };
    s.stream = stream_;
    return s;
  }

  const DeviceBuffer& of(const HostTensor* t) const {
    for (std::size_t i = 0; i < host_.size(); ++i) {
      if (host_[i] == t) return device_[i];
    }
    static const DeviceBuffer none;
    ADD_FAILURE() << "an output is not among the case's tensors";
    return none;
  }

  void poison(const std::vector<Output>& outs) const {
    for (const Output& o : outs) {
      if (o.in_place) continue;  // a cache the op appends to: kept as the case made it
      const DeviceBuffer& b = of(o.storage);
      cudaMemsetAsync(b.get(), 0xFF, b.bytes(), stream_);
    }
  }

  // Copies of the outputs' storage as the device holds them once the stream's work is done.
  std::vector<HostTensor> download(const std::vector<Output>& outs) const {
    std::vector<HostTensor> v;
    for (const Output& o : outs) {
      v.push_back(*o.storage);
      if (o.storage->bytes()) {
        cudaMemcpyAsync(v.back().raw(), of(o.storage).get(), o.storage->bytes(),
                        cudaMemcpyDeviceToHost, stream_);
      }
    }
    cudaStreamSynchronize(stream_);
    return v;
  }

  // One buffer per mirror, zeroed when first given (a checked plan's record starts clean; a
  // reused schedule lives in it).
  void* workspace(std::size_t bytes) {
    if (ws_.bytes() < bytes) {
      ws_ = DeviceBuffer(bytes);
      cudaMemsetAsync(ws_.get(), 0, bytes, stream_);
    }
    return ws_.get();
  }

 private:
  cudaStream_t stream_;
  std::vector<HostTensor*> host_;
  std::vector<DeviceBuffer> device_;
  DeviceBuffer ws_;
};

}  // namespace deca::test::diff
