#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "gpu_timer.hpp"

namespace deca::bench {

namespace {

// Median, min and 90th percentile (nearest rank) of the timed samples.
void set_spread(std::vector<double> us, CaseResult& result) {
  std::sort(us.begin(), us.end());
  const std::size_t n = us.size();
  result.time_us = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
  result.time_us_min = us.front();
  result.time_us_p90 = us[std::min(n - 1, (n * 9 + 9) / 10 - 1)];
}

}  // namespace

void time_op(const RunOptions& options, const std::function<void(void*)>& run,
             CaseResult& result) {
  if (!options.cuda) {
    std::vector<double> us;
    for (int i = 0; i < options.warmup + options.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run(nullptr);
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= options.warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    set_spread(std::move(us), result);
    return;
  }
  auto launch = [&](cudaStream_t stream) { run(stream); };
  set_spread(options.timer->time_cold(launch, options.warmup, options.iters), result);
  std::string why;
  result.time_us_graph = options.timer->time_graph(launch, 20, 10, &why);
  result.graph_note = why;
}

double host_cost_us(const RunOptions& options, int calls, const std::function<void(void*)>& call) {
  // On the GPU the launches are queued, never waited for one by one; a synchronisation every
  // kSyncEvery calls (outside the timed region) keeps the launch queue from filling up, which
  // would make a call block on the GPU and time the kernel instead of the host.
  constexpr int kSyncEvery = 32;
  void* stream = options.cuda ? options.timer->stream() : nullptr;
  std::vector<double> us;
  us.reserve(calls);
  for (int i = 0; i < calls + 10; ++i) {
    if (options.cuda && i % kSyncEvery == 0) {
      check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
    }
    const auto t0 = std::chrono::steady_clock::now();
    call(stream);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 10) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (options.cuda) {
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void time_and_check(const RunOptions& options, int batch, void* out, void* host_out,
                    std::size_t out_bytes, const std::function<void(void*)>& run,
                    const std::function<ErrorStats(const std::vector<int>&)>& check,
                    CaseResult& result) {
  if (options.cuda) check_cuda(cudaMemset(out, 0xFF, out_bytes), "cudaMemset (out)");
  time_op(options, run, result);
  if (!options.check) return;
  if (options.cuda) {
    check_cuda(cudaMemcpy(host_out, out, out_bytes, cudaMemcpyDeviceToHost),
               "download of out (cudaMemcpy D2H)");
  }
  const ErrorStats e = check(sample_requests(batch, options.cuda ? options.check_requests : batch));
  result.max_abs_err = e.max_abs;
  result.rel_rms_err = e.rel_rms;
}

}  // namespace deca::bench
