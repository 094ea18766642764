// A minimal parallel loop for the reference backend: work items are claimed one at a time
// from an atomic counter, so uneven items (requests of different lengths) balance themselves.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace deca::cpu {

// Calls fn(item) for item in [0, count) on up to hardware_concurrency threads; the first
// exception thrown by any item is rethrown on the caller's thread after all threads join.
template <typename Fn>
void parallel_for(std::int64_t count, Fn&& fn) {
  if (count <= 0) return;
  const std::int64_t threads = std::min<std::int64_t>(
      count, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (std::int64_t i = next++; i < count; i = next++) fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = count;
    }
  };
  std::vector<std::thread> pool;
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace deca::cpu
