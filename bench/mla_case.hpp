// One MLA decode benchmark case (dense bf16 or sparse FP8): random latent cache with shuffled
// blocks, plan once, time the run, optionally compare sampled requests with the CPU reference.
// On CUDA, sparse decode runs scheduler + decode + combine per call (the time reported covers all
// three); dense decode has no CUDA kernel and is reported as skipped (a tiny probe call finds out
// once, before any large allocation).
#pragma once

#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace deca::bench {

CaseResult run_mla_case(const BenchCase& bench_case, const RunOptions& options);

}  // namespace deca::bench
