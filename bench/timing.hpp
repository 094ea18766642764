// Times one op on the backend RunOptions names and fills the time fields of a CaseResult.
#pragma once

#include <functional>

#include "options.hpp"
#include "report.hpp"

namespace deca::bench {

// `run(stream)` performs the op once (stream: a cudaStream_t, null on the CPU).
// CPU: median wall clock of options.iters runs after options.warmup.
// CUDA: GpuTimer::time_cold and, as a second figure, GpuTimer::time_graph (20 launches).
void time_op(const RunOptions& options, const std::function<void(void*)>& run, CaseResult& result);

}  // namespace deca::bench
