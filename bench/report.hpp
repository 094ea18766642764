// What one benchmark case measured, the table printed as cases finish, and the JSON file.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deca::bench {

// --fused (GQA, bench/gqa_fused_case.cpp): the fused decode step (rotate q and k_new, append,
// decode: one launch) on the case's cache, and the same three steps as three launches (rotate,
// append, plain decode). Graph figures: per fused launch / per three-launch group.
struct FusedTimes {
  std::string kernel_name;
  double fused_us = 0;
  std::optional<double> fused_graph_us;
  std::optional<double> three_us;  // CUDA only
  std::optional<double> three_graph_us;
  std::optional<double> max_abs_vs_three;  // fused output against the three launches' (CUDA)
};

// --layers L (GQA on CUDA, bench/gqa_layers.cpp): the case's plan as L consecutive layers in one
// CUDA graph (each layer its own copy of the cache while they fit), per-launch medians with
// programmatic dependent launch (as gqa_decode launches on sm_90+) and without it.
struct LayerTimes {
  int layers = 0;
  int caches = 0;  // distinct K/V copies the layers take in turn
  std::optional<double> pdl_us;
  std::optional<double> plain_us;
  std::string note;  // why a figure is missing
};

struct CaseResult {
  std::string name;
  std::string backend;          // "cpu" | "cuda"
  std::string kv_dtype;
  nlohmann::json shape;         // the shape fields (heads, head_dim, batch, lengths, ...)
  std::optional<std::string> skipped;  // why the case did not run (not a failure)
  std::optional<std::string> error;    // the deca::Error (or CUDA error) that stopped it
  std::optional<std::string> check_failed;  // --check: error above tolerance or non-finite

  double time_us = 0;                  // median single launch (GPU: cold L2) / wall clock (CPU)
  double time_us_min = 0;              // spread of the same samples
  double time_us_p90 = 0;
  std::optional<double> host_us;       // --host-cost: host wall time of one gqa_decode call
  std::string host_note;               // what host_us measures on this backend
  // --host-cost on CUDA: the same timing of the driver call alone (cuLaunchKernelEx of an empty
  // kernel taking a parameter struct of the same size, same stream), and of gqa_decode without
  // that call (checks, kernel lookup, params, grid, current device). floor + deca ~ host.
  std::optional<double> host_launch_floor_us;
  // The same floor through cuLaunchKernel, and through cuLaunchKernelEx with an 8-byte parameter.
  std::optional<double> host_floor_plain_us;
  std::optional<double> host_floor_small_us;
  std::optional<double> host_deca_us;
  std::optional<double> time_us_graph; // GPU: median per launch inside a CUDA graph
  std::string graph_note;              // why there is no graph figure
  double kv_bytes = 0;                 // K and V of the visible tokens, each once, stored dtype
  double total_bytes = 0;              // kv_bytes + q + output
  double flops = 0;
  std::optional<double> max_abs_err;
  std::optional<double> rel_rms_err;
  int num_splits = 1;
  std::string kernel_name;
  // --skip-softmax: the figures against the exact kernel (skip_bench.cpp measure_skip); null
  // otherwise. Written to the JSON as "skip_softmax".
  nlohmann::json skip;
  std::optional<FusedTimes> fused;
  std::optional<LayerTimes> layers;
  // --stamps: the phase stamps' summary (stamps_report.cpp measure_stamps); null otherwise.
  // Written to the JSON as "stamps".
  nlohmann::json stamps;
};

struct RunInfo {
  std::string git_commit;
  std::string date;                    // ISO 8601, UTC
  nlohmann::json device;               // {"name": ..., "sms": ..., ...} or {"name": "cpu", ...}
  std::optional<double> copy_bandwidth_gbs;
  std::string l2_flush;
  std::string seed;
};

class Report {
 public:
  Report(std::ostream& out, RunInfo info) : out_(out), info_(std::move(info)) {}
  void print_header();
  void add(CaseResult result);  // prints its row at once
  void write_json(const std::string& path) const;
  const std::vector<CaseResult>& results() const { return results_; }

 private:
  void print_fused(const CaseResult& r);
  void print_layers(const LayerTimes& t);
  std::ostream& out_;
  RunInfo info_;
  std::vector<CaseResult> results_;
};

std::string utc_now_iso8601();

}  // namespace deca::bench
