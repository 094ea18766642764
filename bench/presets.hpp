// The benchmark shape table: every named case of docs/benchmarks.md under its exact name, a
// few extra rows the GPU targets refer to, and small cases that run on the CPU in seconds.
// A case's name is `shape[/variant]/kv_dtype` for GQA (e.g. `l70-b99-4k/fp8`,
// `spec-b32-4k/q4/fp8`) and `shape[/variant]` for MLA (e.g. `mla-dense-b128-h128-8k/q2`,
// `mla-dense-anchor-b128-h128-8k/q2/fp8`: dense rows end in the cache format, bf16, fp8 (576 e4m3
// values, one scale) or fp8-656 (the sparse cache's token read densely)).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "deca/tensor.hpp"

namespace deca::bench {

struct GqaShape {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 128;
  int page_size = 64;
  int batch = 1;
  int seq_len = 0;               // every request's length, or the maximum when `lengths` is set
  std::vector<int> lengths;      // ragged batches: one length per request
  DType kv_dtype = DType::kBF16;
  int q_len = 1;
  bool tree_mask = false;        // random draft trees (speculative decoding)
  int window = 0;                // sliding window; 0 = none
  bool sinks = false;
};

struct MlaShape {
  int num_heads = 0;
  int batch = 1;
  int seq_len = 0;               // every request's context length, or the maximum with `lengths`
  std::vector<int> lengths;
  int q_len = 1;
  int page_size = 64;
  bool sparse = false;           // sparse FP8 (656-byte tokens, top-k indices) or dense
  int topk = 0;
  // Dense: the cache format (MlaKvFormat: 0 bf16, 1 e4m3 with one scale, 2 the 656-byte token).
  // Sparse: 3 (kMlaKvModel1) for MODEL1's 584-byte token (bench/mla_model1_case.cpp), else the
  // 656-byte one.
  int kv_format = 0;
  // MODEL1's second cache: indices per query token (0 = none), page size, and every request's
  // context in it.
  int extra_topk = 0;
  int extra_page_size = 64;
  int extra_seq_len = 0;
};

enum class Family { kGqa, kMla };

struct BenchCase {
  std::string name;
  Family family = Family::kGqa;
  GqaShape gqa;
  MlaShape mla;
  std::string source;            // where the shape comes from (shown by --list)
};

// Every case, in table order (small cases first).
const std::vector<BenchCase>& all_cases();

// A group name (small, gqa, mla, anchors, all), a shape name (all its variants), a shape with a
// variant prefix (`spec-b32-4k/q4`) or a full case name. Throws deca::Error for an unknown name.
std::vector<BenchCase> resolve_preset(const std::string& name);

// The groups and every case, for --list.
void print_presets(std::ostream& os);

// `count` lengths drawn uniformly from lo..hi with a fixed seed (the same on every machine).
std::vector<int> draw_lengths(int count, int lo, int hi, std::uint32_t seed);

// The preset names (groups and cases) closest to a mistyped `name` by edit distance, best first.
std::vector<std::string> nearest_presets(const std::string& name, std::size_t count = 3);

// Per-request lengths of a shape (the ragged ones drawn from a fixed seed).
std::vector<int> request_lengths(const GqaShape& shape);
std::vector<int> request_lengths(const MlaShape& shape);

}  // namespace deca::bench
