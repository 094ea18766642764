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

// Threads parallel_for uses for `count` items.
// hardware_concurrency() reads /sys on every call (about half the cost of a tiny CPU-backend
// call): ask once.
inline int worker_count(std::int64_t count) {
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::clamp<std::int64_t>(count, 1, cores));
}

// Calls fn(item, worker) for item in [0, count) on worker_count(count) threads; worker is in
// [0, worker_count(count)), so per-thread scratch can be indexed by it. The first exception
// thrown by any item is rethrown on the caller's thread after all threads join.
template <typename Fn>
void parallel_for(std::int64_t count, Fn&& fn) {
  if (count <= 0) return;
  const int threads = worker_count(count);
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&](int w) {
    try {
      for (std::int64_t i = next++; i < count; i = next++) fn(i, w);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = count;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace deca::cpu
