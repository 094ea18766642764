// deca-bench --stamps (GQA on the GPU): the case's plan run once more with the stamp build of its
// Hopper kernel (kernels/gqa/stamps.cuh), cold L2 as the timed runs, and where each CTA's time
// went: per phase the spread over the CTAs of the time since the earliest entry, per wave when
// there are several (docs/benchmarks.md, "Phase stamps").
#pragma once

#include <cstddef>
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "cuda/stamp_summary.hpp"
#include "deca/gqa.hpp"
#include "options.hpp"

namespace deca::bench {

// The summary as JSON (the case's "stamps" field); {"note": why} for a kernel without a stamp
// build. `args` and `out_bytes`: the case's, after its timed runs (their output is kept to check
// that the stamp build writes the same bits).
nlohmann::json measure_stamps(const GqaPlan& plan, const GqaDecodeArgs& args, std::size_t out_bytes,
                              const RunOptions& options);

// summarize_stamps' result as that JSON (no kernel, bits or note fields).
nlohmann::json stamps_json(const cuda::StampSummary& s);

// The lines printed under the case's row.
void print_stamps(std::ostream& out, const nlohmann::json& stamps);

}  // namespace deca::bench
