// A map whose values are made once per key, even when many threads ask at the same moment: the
// first asker makes the value outside the lock (compiling takes seconds; other keys must not
// wait for it), the others wait on a shared_future.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace deca::jit {

template <class V>
class OnceMap {
 public:
  // Returns the value for `key`, calling make() (which returns std::shared_ptr<V>) in this thread
  // if no thread has. *made tells whether this call made it. If make() throws, every waiter gets
  // the exception and the key is forgotten, so that a later call tries again.
  template <class Make>
  const V& get(const std::string& key, Make&& make, bool* made = nullptr) {
    std::promise<std::shared_ptr<V>> promise;
    std::shared_future<std::shared_ptr<V>> future;
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        future = it->second;
      } else {
        future = promise.get_future().share();
        map_.emplace(key, future);
        mine = true;
      }
    }
    if (made != nullptr) *made = mine;
    if (mine) {
      try {
        promise.set_value(make());
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          map_.erase(key);
        }
        promise.set_exception(std::current_exception());
      }
    }
    return *future.get();
  }

  // Calls fn(value) on every value made successfully so far; for teardown.
  void for_each_ready(const std::function<void(V&)>& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, future] : map_) {
      if (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      try {
        fn(*future.get());
      } catch (...) {
        // A failed entry holds no resource.
      }
    }
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<V>>> map_;
};

}  // namespace deca::jit
