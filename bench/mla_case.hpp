// One MLA decode benchmark case (dense over a bf16, e4m3 or 656-byte cache, or sparse FP8):
// random latent cache with shuffled blocks, plan once, time the run, optionally compare sampled
// requests with the CPU reference. On CUDA a run is scheduler + decode + combine (the time
// reported covers all three; with --mla-schedule once the timed runs reuse the first run's
// schedule, as the layers of a decode step do). A build or device without the kernels reports
// the case as skipped (a tiny probe call finds out once, before any large allocation).
#pragma once

#include "deca/mla.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace deca::bench {

// The config a case's plan is made with (unchecked unless `checked`: the bench measures what its
// row says, not DECA_CHECKED).
MlaConfig mla_config(const MlaShape& shape, Device device, bool checked = false);

CaseResult run_mla_case(const BenchCase& bench_case, const RunOptions& options);

}  // namespace deca::bench
