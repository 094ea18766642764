// deca-bench --fused: the fused decode step on a GQA case's cache (see FusedTimes, report.hpp).
#pragma once

#include "deca/gqa.hpp"
#include "gpu_timer.hpp"
#include "options.hpp"
#include "report.hpp"

namespace deca::bench {

// Times, on the case's tensors (`args`, planned as `plan`), the fused step (a GPT-NeoX plan of
// rotary_dim = head_dim; random k_new / v_new of the batch's q_len tokens written to the last
// slots, the cos/sin cache fp32) and, on CUDA, rotate + append + plain decode as three launches.
// The plain decode's row is timed before (the fused runs then rewrite the new tokens' slots).
FusedTimes time_fused_step(const GqaPlan& plan, const GqaDecodeArgs& args, const RunOptions& opt,
                           CaseMemory& mem, std::uint64_t seed);

}  // namespace deca::bench
