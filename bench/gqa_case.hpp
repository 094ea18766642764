// One GQA decode benchmark case: random paged cache (shuffled pages), plan once, time the run
// on the chosen backend, optionally compare sampled requests with the CPU reference.
#pragma once

#include "deca/gqa.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace deca::bench {

// The config deca-bench plans a shape with (also what --precompile compiles).
GqaConfig gqa_config(const GqaShape& shape, KvLayout layout, Device device);

CaseResult run_gqa_case(const BenchCase& bench_case, const RunOptions& options);

}  // namespace deca::bench
