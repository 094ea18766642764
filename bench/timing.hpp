// Times one op on the backend RunOptions names and fills the time fields of a CaseResult.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "data.hpp"
#include "options.hpp"
#include "report.hpp"

namespace deca::bench {

// `run(stream)` performs the op once (stream: a cudaStream_t, null on the CPU).
// CPU: median (and min, p90) wall clock of options.iters runs after options.warmup.
// CUDA: GpuTimer::time_cold and, as a second figure, GpuTimer::time_graph (20 launches).
void time_op(const RunOptions& options, const std::function<void(void*)>& run, CaseResult& result);

// Median host wall time in microseconds of one `call(stream)` over `calls` calls (after 10
// untimed ones), on the GPU without waiting for each launch: what a decode step pays per layer
// before any kernel runs.
double host_cost_us(const RunOptions& options, int calls, const std::function<void(void*)>& call);

// The end every case shares: time_op with `out` refilled with NaN first on CUDA (the host
// buffer already is: a row the op never writes fails --check); then with --check, `out` back into
// `host_out` (CUDA) and `check` on the requests sample_requests picks (all of them on the CPU,
// options.check_requests on CUDA), its figures into `result`.
void time_and_check(const RunOptions& options, int batch, void* out, void* host_out,
                    std::size_t out_bytes, const std::function<void(void*)>& run,
                    const std::function<ErrorStats(const std::vector<int>&)>& check,
                    CaseResult& result);

}  // namespace deca::bench
