// deca-bench --layers L: a GQA case's plan launched as L consecutive layers of one decode step,
// captured in one CUDA graph, with and without programmatic dependent launch (see LayerTimes,
// report.hpp; docs/benchmarks.md).
#pragma once

#include <cstddef>

#include "deca/gqa.hpp"
#include "options.hpp"
#include "report.hpp"

namespace deca::bench {

// Times L = opt.layers launches of `plan` on the case's tensors (`args`, on CUDA) back to back in
// one graph: layer i reads K and V from cache copy i (copies of the case's `cache_bytes`-byte K
// and V made here, as many as fit in half the free memory, used in turn), every layer the same
// q, out and workspace. Per-launch medians with the attribute (as gqa_decode launches) and
// without it (cuda::gqa_decode's `pdl` false), the two graphs timed alternately.
LayerTimes time_layers(const GqaPlan& plan, const GqaDecodeArgs& args, std::size_t cache_bytes,
                       const RunOptions& opt);

}  // namespace deca::bench
