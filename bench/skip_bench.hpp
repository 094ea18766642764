// deca-bench --skip-softmax F [--dist uniform|peaked]: GQA cases planned with
// GqaConfig::skip_softmax_factor = F, on the data distribution --dist names, measured against the
// exact kernel on the same data (docs/benchmarks.md "Skip-softmax" defines both and the columns).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "data.hpp"
#include "deca/gqa.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace deca::bench {

// Rewrites a case filled by fill_random (q bf16, K codes of values uniform in [-1, 1)) into the
// peaked distribution: per (request, kv head) a random sign vector s; every q row of the group
// gets (20 / sqrt(head_dim)) s added, and 16 keys of the request (tokens 0-3 and 12 at random
// positions) get K = s (codes of +-1). `cache_stride`: the K buffer's [page, dim1, dim2, d]
// strides in `layout`'s order.
void make_peaked(const GqaShape& s, KvLayout layout, const std::vector<int>& lengths, const PageTable& pages,
                 const std::int64_t (&cache_stride)[4], void* q, void* k, Rng& rng);

// After a skip case was timed with `skip_plan` on `args` (its out on the backend): plans and
// times the exact kernel on the same data, compares the outputs (relative RMS of the skip output
// against the exact one) and, on CUDA, counts the V rows the skip kernel copied
// (GqaParams::skip_counts); everything into r.skip. kv_elem_bytes: bytes per cached element.
void measure_skip(const RunOptions& opt, const GqaPlan& skip_plan, const GqaDecodeArgs& args,
                  std::size_t out_bytes, int kv_elem_bytes, CaseResult& r);

// The closing table of a --skip-softmax run: one row per case with skip figures.
void print_skip_table(std::ostream& out, const std::vector<CaseResult>& results);

}  // namespace deca::bench
