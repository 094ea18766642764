// GPU timing for deca-bench, the method docs/benchmarks.md describes (and the peers' figures use):
//  - one launch with a cold L2: 256 MB of other data are read just before each timed launch,
//    CUDA events around the launch only, median of `iters` after `warmup`; the stream is held
//    by a spinning kernel until the whole sequence is queued, so host-side overhead of the call
//    never appears as a gap between the events;
//  - a second figure: `launches` back-to-back launches captured in one CUDA graph, the median
//    over graph replays divided by `launches` (hides launch gaps, L2 stays warm);
//  - the device-to-device copy bandwidth of the same run (4 GiB, bytes read + written).
// CUDA runtime API only (cudart is linked statically through deca_internal).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace deca::bench {

// Throws deca::Error "deca-bench: <what>: <CUDA error name>: <description>" on failure.
void check_cuda(cudaError_t status, const char* what);

// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Where a case's tensors live: the host buffers themselves on the CPU, device copies of them on
// CUDA. Owns the copies (and the workspace) until the case ends.
class CaseMemory {
 public:
  explicit CaseMemory(bool cuda) : cuda_(cuda) {}
  // The host buffer itself (CPU), or a device copy of its `bytes` (CUDA).
  void* place(const void* host, std::size_t bytes);
  // CUDA and bytes > 0: a zeroed device workspace of `bytes`; otherwise null.
  void* workspace(std::size_t bytes);

 private:
  bool cuda_;
  std::vector<DeviceBuffer> buffers_;
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int compute_capability = 0;  // major * 10 + minor
  int sm_clock_mhz = 0;        // peak, from the device attributes (0 when not reported)
  int mem_clock_mhz = 0;
  int mem_bus_bits = 0;
  int l2_bytes = 0;
  std::size_t global_mem_bytes = 0;
  int driver_version = 0;
  int runtime_version = 0;
};

class GpuTimer {
 public:
  explicit GpuTimer(int device);
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  const DeviceInfo& info() const { return info_; }
  cudaStream_t stream() const { return stream_; }
  // "read kernel" (256 MB read by a tiny NVRTC-compiled kernel) or "memset" (fallback when that
  // kernel cannot be built; leaves dirty lines in L2, so slightly pessimistic).
  const std::string& l2_flush_method() const { return flush_method_; }

  // Median GB/s of a device-to-device cudaMemcpyAsync of up to 4 GiB (smaller when memory is
  // short), counting bytes read + written.
  double measure_copy_bandwidth();

  // Microseconds of each of `iters` launches with a cold L2 (after `warmup` untimed ones).
  std::vector<double> time_cold(const std::function<void(cudaStream_t)>& launch, int warmup,
                                int iters);

  // One untimed run of `launch` as time_cold runs each timed one (stream held, L2 flushed just
  // before), `before_flush` queued ahead of the flush; waits for the end. deca-bench --stamps.
  void run_cold(const std::function<void(cudaStream_t)>& before_flush,
                const std::function<void(cudaStream_t)>& launch);

  // Median microseconds per launch of `launches` back-to-back launches in one CUDA graph;
  // nullopt (and `why`) when the launch cannot be captured.
  std::optional<double> time_graph(const std::function<void(cudaStream_t)>& launch, int launches,
                                   int replays, std::string* why);

 private:
  void flush_l2();
  void build_flush_kernel();
  void hold_stream();     // queue a kernel that spins until release_stream()
  void release_stream();
  // Queues `queue`'s work behind the hold, then releases it (also when `queue` throws).
  void queue_held(const std::function<void()>& queue);

  DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceBuffer scratch_;
  DeviceBuffer sink_;
  cudaLibrary_t flush_library_ = nullptr;
  cudaKernel_t flush_kernel_ = nullptr;
  cudaKernel_t wait_kernel_ = nullptr;
  unsigned* gate_ = nullptr;          // pinned, mapped: the host opens it, deca_bench_wait reads it
  unsigned* gate_device_ = nullptr;
  std::string flush_method_ = "memset";
};

}  // namespace deca::bench
