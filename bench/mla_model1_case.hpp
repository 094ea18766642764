// One MLA MODEL1 sparse decode benchmark case (DeepSeek V4's 584-byte token, a second cache):
// every request's context in each cache in shuffled pages, `topk` (+ `extra_topk`) distinct
// tokens selected per query token, plan once, time the run (scheduler + decode + combine; with
// --mla-schedule once the timed runs reuse the first run's schedule), optionally compare sampled
// requests with the CPU reference. Through the public API (MlaCacheFormat::kModel1,
// MlaSparseArgs::extra_*), on CUDA or the CPU. TFLOP/s = 2 h q_len keys (512 + 512) / time; bytes:
// 584 per selected token.
#pragma once

#include "mla_case.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace deca::bench {

// Whether a shape is a MODEL1 one (sparse, kv_format kMlaKvModel1).
bool is_model1(const MlaShape& shape);

CaseResult run_mla_model1_case(const BenchCase& bench_case, const RunOptions& options);

}  // namespace deca::bench
