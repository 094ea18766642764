#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "gpu_timer.hpp"

namespace deca::bench {

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
    std::sort(us.begin(), us.end());
    result.time_us = us.size() % 2 ? us[us.size() / 2]
                                   : 0.5 * (us[us.size() / 2 - 1] + us[us.size() / 2]);
    return;
  }
  auto launch = [&](cudaStream_t stream) { run(stream); };
  result.time_us = options.timer->time_cold(launch, options.warmup, options.iters);
  std::string why;
  result.time_us_graph = options.timer->time_graph(launch, 20, 10, &why);
  result.graph_note = why;
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
