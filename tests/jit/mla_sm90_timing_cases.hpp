// The shapes tests/gpu/mla_sm90_timing_test.cpp times, each as the MlaConfig of its plan, and the
// timing-only builds (kernels/mla/sm90/config.cuh Ablate) it runs on each: shared with
// tests/jit/mla_sm90_nvrtc_test.cpp, which compiles every one of them without a GPU.
#pragma once

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/mla_spec.hpp"
#include "deca/mla.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "jit/spec.hpp"
#include "kernels/mla/sm90/config.cuh"

namespace deca::test {

// One timed shape. config: what the plan is made from (max_batch = the batch, max_q_len = the
// q_len, max_seq_len = a dense request's length; unchecked, as the bench times it). context /
// extra_context: the tokens of a request's context that a sparse selection draws from, in
// pages of their own (the bench's layout, bench/mla_model1_case.cpp); 0 for V3.2's anchor rows,
// whose requests all draw from one shared pool.
struct TimingCase {
  std::string family;  // "sparse", "dense", "model1" (the printed lines start with it)
  std::string name;    // the gtest name, e.g. "bf16_b128_h128_8k"
  MlaConfig config;
  int context = 0;
  int extra_context = 0;
};
// gtest prints a case by its family and name (not its bytes).
inline void PrintTo(const TimingCase& c, std::ostream* os) { *os << c.family << " " << c.name; }

inline MlaConfig timing_config(int batch, int heads, int q_len, int page, bool sparse, MlaCacheFormat format) {
  MlaConfig c;
  c.num_heads = heads;
  c.page_size = page;
  c.sparse = sparse;
  c.kv_format = format;
  c.max_batch = batch;
  c.max_q_len = q_len;
  c.checked = false;
  return c;
}

// V3.2's anchor rows: q_len 1, page 64, topk 2048 from a pool of 2^18 tokens.
inline TimingCase sparse_timing_case(int batch, int heads) {
  TimingCase t{"sparse", "b" + std::to_string(batch) + "_h" + std::to_string(heads),
               timing_config(batch, heads, 1, 64, true, MlaCacheFormat::kFP8Sparse)};
  t.config.topk = 2048;
  return t;
}

// Dense rows: every request `len` tokens, page 64, q_len 1.
inline TimingCase dense_timing_case(int batch, int heads, int len, MlaCacheFormat format) {
  const char* f = format == MlaCacheFormat::kBF16 ? "bf16" : "e4m3";
  TimingCase t{"dense", std::string(f) + "_b" + std::to_string(batch) + "_h" + std::to_string(heads) + "_" +
                            std::to_string(len / 1024) + "k",
               timing_config(batch, heads, 1, 64, false, format)};
  t.config.max_seq_len = len;
  return t;
}

// MODEL1 rows as bench/presets.cpp makes them: topk of a context of max(4 topk, 8192) tokens in
// pages of `page`, extra_topk of one of 4 extra_topk tokens in pages of 64.
inline TimingCase model1_timing_case(int batch, int heads, int q_len, int topk, int page, int extra_topk) {
  TimingCase t{"model1",
               "b" + std::to_string(batch) + "_h" + std::to_string(heads) + "_q" + std::to_string(q_len) + "_t" +
                   std::to_string(topk) + "p" + std::to_string(page) +
                   (extra_topk > 0 ? "_x" + std::to_string(extra_topk) + "p64" : ""),
               timing_config(batch, heads, q_len, page, true, MlaCacheFormat::kModel1)};
  t.config.topk = topk;
  t.config.extra_topk = extra_topk;
  t.config.extra_page_size = 64;
  t.context = std::max(4 * topk, 8192);
  t.extra_context = 4 * extra_topk;
  return t;
}

inline std::vector<TimingCase> sparse_timing_cases() {
  return {sparse_timing_case(128, 128), sparse_timing_case(64, 128), sparse_timing_case(128, 64),
          sparse_timing_case(64, 64), sparse_timing_case(128, 16)};
}

// docs/perf-notes-mla.md's per-block table: bf16 at 128, 64 and 16 heads, e4m3 at 128.
inline std::vector<TimingCase> dense_timing_cases() {
  return {dense_timing_case(128, 128, 8192, MlaCacheFormat::kBF16),
          dense_timing_case(128, 64, 8192, MlaCacheFormat::kBF16),
          dense_timing_case(128, 16, 4096, MlaCacheFormat::kBF16),
          dense_timing_case(128, 128, 8192, MlaCacheFormat::kFP8E4M3)};
}

// The bench's mla-model1-b128-h64-t128-x1024/q2 and mla-model1-b128-h128-t2k rows.
inline std::vector<TimingCase> model1_timing_cases() {
  return {model1_timing_case(128, 64, 2, 128, 256, 1024), model1_timing_case(128, 128, 1, 2048, 64, 0)};
}

// The decode kernel a plan of the case runs on sm_90 (its key: name, kernel class, launch shape).
inline cuda::MlaKernelKey timing_key(const TimingCase& c) { return cuda::mla_decode_key(90, "sm90", c.config); }

// The kernel and its timing-only builds, each with what it answers against the kernel: no-mma
// (the tensor-core products left out) what the products cost; no-gather (the cache's bytes left
// out) what the memory traffic costs; producers (the consumers only release the tiles) and
// consumers (no producer work) whether the two sides overlap (the kernel ~ the slower side) or
// add up. The direct kernel has no consumers-only build.
// A TMA rows kernel (key.tma) is timed beside the plan's kernel without it ("reg-rows": the
// register producers, the kernel the TMA one replaces) and that kernel's producers alone
// ("reg-producers"), so that one run gives the before and after.
struct TimingVariant {
  int ablate;
  const char* name;
  bool register_rows = false;  // the key without Cfg::kTma
};
inline std::vector<TimingVariant> timing_variants(const cuda::MlaKernelKey& key) {
  std::vector<TimingVariant> v = {{mla::sm90::kAblateNone, "kernel"},
                                  {mla::sm90::kAblateNoMma, "no-mma"},
                                  {mla::sm90::kAblateNoGather, "no-gather"},
                                  {mla::sm90::kAblateProducersOnly, "producers"}};
  if (!key.sm90.direct) v.push_back({mla::sm90::kAblateConsumersOnly, "consumers"});
  if (key.tma) {
    v.push_back({mla::sm90::kAblateNone, "reg-rows", true});
    v.push_back({mla::sm90::kAblateProducersOnly, "reg-producers", true});
  }
  return v;
}

inline jit::JitSpec timing_spec(const cuda::MlaKernelKey& key, int ablate) { return with_ablation(key.spec(), ablate); }
inline jit::JitSpec timing_spec(const cuda::MlaKernelKey& key, const TimingVariant& v) {
  cuda::MlaKernelKey k = key;
  if (v.register_rows) k.tma = false;
  return timing_spec(k, v.ablate);
}

}  // namespace deca::test
