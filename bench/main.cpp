// deca-bench: decode-attention benchmark over the named shapes of docs/benchmarks.md.
// Without flags it runs the GQA table on the GPU, or the small preset on the CPU backend when
// no GPU is present. See --help.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cuda/backend.hpp"
#include "cuda/gqa_stamps.hpp"
#include "data.hpp"
#include "deca/deca.hpp"
#include "gpu_timer.hpp"
#include "gqa_case.hpp"
#include "mla_case.hpp"
#include "options.hpp"
#include "presets.hpp"
#include "report.hpp"
#include "shape_spec.hpp"
#include "skip_bench.hpp"

#ifndef DECA_BENCH_GIT_COMMIT
#define DECA_BENCH_GIT_COMMIT "unknown"
#endif

namespace {

using namespace deca::bench;

std::string git_commit() {
  if (const char* env = std::getenv("DECA_GIT_COMMIT"); env && *env) return env;
  return DECA_BENCH_GIT_COMMIT;
}

std::vector<BenchCase> collect(const std::vector<std::string>& presets) {
  std::vector<BenchCase> cases;
  std::set<std::string> seen;
  for (const std::string& p : presets)
    for (BenchCase& c : resolve_preset(p))
      if (seen.insert(c.name).second) cases.push_back(std::move(c));
  return cases;
}

// Compiles every kernel specialization the cases need, once each, without running: for compute
// capability `arch` (0: that of `device`); GQA cases their decode kernel, MLA cases the
// scheduler, decode and combine kernels. NVRTC runs
// on `jobs` threads at once (the kernel cache makes each specialization once even when two cases
// share it); the wall time of the whole set is what a server's start-up or a build machine waits.
int precompile(const std::vector<BenchCase>& cases, deca::KvLayout layout, int device, int arch,
               unsigned jobs, float skip_softmax, bool stamps, bool checked) {
  std::vector<std::pair<std::string, std::function<std::string()>>> configs;
  const deca::Device cuda = deca::Device::cuda(device);
  for (const BenchCase& c : cases) {
    if (c.family == Family::kGqa) {
      deca::GqaConfig g = gqa_config(c.gqa, layout, cuda);
      g.skip_softmax_factor = skip_softmax;  // --skip-softmax: the "_skip" kernels
      configs.emplace_back(c.name, [g, arch] { return deca::precompile_gqa_decode(g, arch); });
      if (checked) {  // --checked: the "_chk" build beside it, as the timed runs take both
        deca::GqaConfig gc = g;
        gc.checked = true;
        configs.emplace_back(c.name + " chk", [gc, arch] { return deca::precompile_gqa_decode(gc, arch); });
      }
      if (stamps) {  // the stamp build beside it (Hopper kernels; "" for the others)
        configs.emplace_back(c.name, [g, arch, device] {
          return deca::cuda::precompile_gqa_stamps(g, arch != 0 ? arch : deca::cuda::compute_capability(device));
        });
      }
    } else {
      const deca::MlaConfig m = mla_config(c.mla, cuda);
      configs.emplace_back(c.name, [m, arch] { return deca::precompile_mla_decode(m, arch); });
      if (checked) {
        deca::MlaConfig mc = m;
        mc.checked = true;
        configs.emplace_back(c.name + " chk", [mc, arch] { return deca::precompile_mla_decode(mc, arch); });
      }
    }
  }
  struct Outcome {
    std::string name, error;
    double seconds = 0;
  };
  std::vector<Outcome> outcomes(configs.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < configs.size(); i = next++) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        outcomes[i].name = configs[i].second();
      } catch (const std::exception& e) {
        outcomes[i].error = e.what();
      }
      outcomes[i].seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  jobs = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(configs.size())));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < jobs; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::set<std::string> kernels;
  int failed = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const Outcome& o = outcomes[i];
    if (!o.error.empty()) {
      ++failed;
      std::cout << "[" << i + 1 << "/" << configs.size() << "] " << configs[i].first
                << ": FAILED: " << o.error << "\n";
    } else if (!o.name.empty() && kernels.insert(o.name).second) {
      // Cases sharing a kernel wait for the same compilation: only the first is listed.
      std::cout << "[" << i + 1 << "/" << configs.size() << "] " << configs[i].first << ": "
                << o.name << "  " << o.seconds << " s\n";
    }
  }
  std::cout << kernels.size() << " kernel specializations ready in " << wall << " s wall ("
            << jobs << " threads)" << (failed ? ", " + std::to_string(failed) + " failed" : "")
            << "\n";
  return failed ? 1 : 0;
}

// --json is checked before any case runs: a long GPU run must not end in "cannot open".
std::string json_path_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return "is a directory";
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) return "its directory '" + dir.string() + "' does not exist";
  if (fs::exists(p, ec)) {
    if (::access(path.c_str(), W_OK) != 0) return "exists and is not writable";
  } else if (::access(dir.c_str(), W_OK) != 0) {
    return "its directory '" + dir.string() + "' is not writable";
  }
  return "";
}

nlohmann::json device_json(const DeviceInfo& d) {
  return {{"name", d.name},
          {"index", d.index},
          {"sms", d.sm_count},
          {"compute_capability", d.compute_capability},
          {"sm_clock_mhz", d.sm_clock_mhz},
          {"mem_clock_mhz", d.mem_clock_mhz},
          {"mem_bus_bits", d.mem_bus_bits},
          {"l2_bytes", d.l2_bytes},
          {"global_mem_bytes", d.global_mem_bytes},
          {"driver_version", d.driver_version},
          {"runtime_version", d.runtime_version}};
}

// The command line: every option's value (defaults as --help prints them).
struct Cli {
  bool list = false, check = false, host_cost = false, checked = false, fused = false, stamps = false;
  float skip_softmax = 0.f;
  std::string dist = "uniform";
  std::vector<std::string> presets, shapes;
  std::string json_path, backend = "auto", precompile_preset, layout_name = "nhd", mla_schedule = "once";
  int iters = 0, warmup = -1, device = 0, check_requests = 8, arch = 0, host_calls = 2000, layers = 0;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  double check_tol = 0.01;
};

void add_options(CLI::App& app, Cli& o) {
  app.add_flag("--list", o.list, "list the presets and groups, then exit");
  app.add_option("--preset", o.presets,
                 "group (small, gqa, anchors, mla, all), shape or case name; repeatable "
                 "(default: gqa on a GPU, small on the CPU)");
  app.add_option("--shape", o.shapes, kShapeHelp);
  app.add_flag("--host-cost", o.host_cost,
               "also time the host side of one gqa_decode call (argument checks, kernel lookup, "
               "launch; no synchronisation): median of --host-calls calls, printed with its two "
               "parts: the launch floor (cuLaunchKernelEx of an empty kernel with a parameter "
               "struct of the same size) and deca's own (the call without the launch). On the CPU "
               "backend the calls have 0 requests, so no attention is computed in the timed part");
  app.add_option("--mla-schedule", o.mla_schedule,
                 "MLA on the GPU (sparse and dense): 'once' (default) schedules in the first run of "
                 "a case and reuses that schedule in the timed ones, as the layers of a decode step "
                 "do (Mla*Args::reuse_schedule; FlashMLA is timed so, its metadata made ahead); "
                 "'every' schedules in every run (one layer alone)")
      ->check(CLI::IsMember({"once", "every"}));
  app.add_option("--host-calls", o.host_calls, "calls timed by --host-cost (default 2000)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--json", o.json_path, "write the results to this JSON file");
  app.add_option("--backend", o.backend, "auto (the GPU when present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_flag("--check", o.check,
               "compare with the CPU reference (GPU: --check-requests sampled requests per case; "
               "on by default for the CPU default run)");
  app.add_flag("--fused", o.fused,
               "GQA cases also time the fused decode step (RoPE + KV append + decode, one launch) "
               "on the same cache, and rotate + append + decode as three launches (GPU), printed "
               "under each row and summed up at the end");
  app.add_option("--layers", o.layers,
                 "GQA cases on the GPU also time their plan as this many consecutive layers in "
                 "one CUDA graph (each layer its own copy of the cache while they fit in half the "
                 "free memory), per launch with programmatic dependent launch (as gqa_decode "
                 "launches on sm_90+) and without it, printed under each row (docs/benchmarks.md)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--stamps", o.stamps,
               "GQA cases on the GPU also run once (after the timed runs, cold L2) with the phase "
               "stamps' build of their Hopper kernel, printed under each row: per phase (entry, PDL "
               "wait, q, first copies, first tile, last PV, publish, merge) the 10th / 50th / 90th "
               "percentile over the CTAs of the time since the first CTA's entry, per wave when "
               "there are several (docs/benchmarks.md); with --precompile, the stamp builds are "
               "compiled too");
  app.add_flag("--checked", o.checked,
               "run every case twice, unchecked then checked (GqaConfig / MlaConfig::checked: "
               "the kernels range-test the page ids, lengths and indices they read; names end in "
               "_chk, the row in \" chk\"), and print the checked mode's cost per case; with "
               "--precompile, the checked builds are compiled too");
  app.add_option("--check-requests", o.check_requests, "requests compared per case on the GPU")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--check-tol", o.check_tol,
                 "largest relative RMS error --check accepts (default 0.01: bf16 output "
                 "rounding is ~0.003)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--iters", o.iters, "timed runs per case (default: 20 GPU, 3 CPU)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", o.warmup, "untimed runs first (default: 5 GPU, 1 CPU)")
      ->check(CLI::Range(0, 1 << 30));
  CLI::Option* precompile_opt = app.add_option("--precompile", o.precompile_preset,
                 "compile every GPU kernel specialization of this preset (or all; with --shape "
                 "too) into the kernel cache, in parallel (--jobs), then exit");
  app.add_option("--jobs", o.jobs, "threads for --precompile (default: every core)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--arch", o.arch,
                 "with --precompile: the compute capability to compile for (80, 86, 89, 90, ...); "
                 "needs no GPU (default: the device's)")
      ->check(CLI::Range(1, 1000))
      ->needs(precompile_opt);
  app.add_option("--device", o.device, "CUDA device index")->check(CLI::Range(0, 1 << 30));
  app.add_option("--layout", o.layout_name, "GQA KV cache layout: nhd (vLLM) or hnd")
      ->check(CLI::IsMember({"nhd", "hnd"}));
  app.add_option("--skip-softmax", o.skip_softmax,
                 "GQA cases with skip-softmax at this factor (GqaConfig::skip_softmax_factor; the "
                 "row times the skip kernel), each also timed with the exact kernel on the same "
                 "data; a closing table gives the time saved, the equivalent KV GB/s (the exact "
                 "kernel's bytes / time), the V rows the kernel skipped and the output's relative "
                 "RMS against the exact kernel's (docs/benchmarks.md)")
      ->check(CLI::PositiveNumber);
  app.add_option("--dist", o.dist,
                 "GQA data: uniform (default: q, K, V uniform random) or peaked (16 keys per "
                 "request and kv head whose logits sit ~20 above the rest; docs/benchmarks.md)")
      ->check(CLI::IsMember({"uniform", "peaked"}));
}

// The run's description (device, timing method, commit, seed), printed and kept for the JSON;
// on the GPU the timer (opt.timer) is made here and the copy bandwidth measured.
RunInfo describe_run(RunOptions& opt, std::unique_ptr<GpuTimer>& timer) {
  RunInfo info;
  info.git_commit = git_commit();
  info.date = utc_now_iso8601();
  info.seed = std::to_string(opt.seed);
  if (opt.cuda) {
    timer = std::make_unique<GpuTimer>(opt.device);
    opt.timer = timer.get();
    const DeviceInfo& d = timer->info();
    info.device = device_json(d);
    info.l2_flush = timer->l2_flush_method();
    std::cerr << "measuring device-to-device copy bandwidth ..." << std::endl;
    info.copy_bandwidth_gbs = timer->measure_copy_bandwidth();
    std::cout << "device: " << d.name << " (" << d.sm_count << " SMs, sm_" << d.compute_capability
              << ", " << d.sm_clock_mhz << " MHz), copy bandwidth " << std::round(*info.copy_bandwidth_gbs)
              << " GB/s (read + write, 4 GiB D2D)\ntiming: cold L2 via " << info.l2_flush
              << ", median of " << opt.iters << " after " << opt.warmup
              << " warm-ups; graph figure: 20 launches per graph\n";
  } else {
    info.device = {{"name", "cpu"}, {"threads", std::thread::hardware_concurrency()}};
    info.l2_flush = "none (CPU wall clock)";
    std::cout << "backend: cpu (the reference backend), wall clock, median of " << opt.iters
              << " after " << opt.warmup << " warm-up"
              << "\n";
    if (opt.check) {
      std::cout << "note: on the CPU backend --check compares the reference with itself (the API "
                   "path against a direct reference call): it tests the plumbing, not the "
                   "numerics; run it on a GPU to check kernels\n";
    }
  }
  std::cout << "commit " << info.git_commit << ", seed " << info.seed
            << (opt.check ? ", checking against the CPU reference" : "") << "\n\n";
  return info;
}

// --checked: a case's unchecked and checked medians (single launch and, on the GPU, in a graph).
struct CheckedCost {
  std::string name;
  double plain_us, checked_us;
  std::optional<double> plain_graph_us, checked_graph_us;
};

// The checked mode's price per case: median single launch (cold L2) and, on the GPU, the
// per-launch median inside a CUDA graph, checked over unchecked. MLA rows compare a kernel's
// checked build with the kernel itself (on Hopper the sm90 kernels' unless
// DECA_MLA_KERNEL=portable).
void print_checked_costs(const std::vector<CheckedCost>& costs) {
  std::cout << "\nchecked mode cost (checked / unchecked - 1):\n";
  for (const CheckedCost& k : costs) {
    std::cout << "  " << std::left << std::setw(28) << k.name << std::right << std::fixed
              << std::setprecision(2) << std::setw(8) << 100.0 * (k.checked_us / k.plain_us - 1.0)
              << " %  (" << k.plain_us << " -> " << k.checked_us << " us)";
    if (k.plain_graph_us && k.checked_graph_us && *k.plain_graph_us > 0) {
      std::cout << "   graph " << std::setw(7) << 100.0 * (*k.checked_graph_us / *k.plain_graph_us - 1.0)
                << " %";
    }
    std::cout << "\n";
  }
  std::cout.unsetf(std::ios::floatfield);
}

// One case on opt's backend: its row, with --check's verdict against check_tol, or the error.
CaseResult run_case(const BenchCase& c, const RunOptions& opt, double check_tol) {
  CaseResult r;
  try {
    r = c.family == Family::kGqa ? run_gqa_case(c, opt) : run_mla_case(c, opt);
    if (opt.checked) r.name += " chk";
    if (r.rel_rms_err && std::isnan(*r.rel_rms_err)) {
      r.check_failed = "non-finite output (rows left unwritten, or NaN produced)";
    } else if (r.rel_rms_err && *r.rel_rms_err > check_tol) {
      r.check_failed = "relative RMS error " + std::to_string(*r.rel_rms_err) + " above --check-tol " +
                       std::to_string(check_tol);
    }
  } catch (const std::exception& e) {
    r = CaseResult{};
    r.name = c.name;
    r.backend = opt.cuda ? "cuda" : "cpu";
    r.error = e.what();
  }
  return r;
}

// Every case (twice with --checked: unchecked, then checked) into the report; prints the counts
// and the checked mode's costs. Returns the number of failed rows.
int run_cases(const std::vector<BenchCase>& cases, RunOptions opt, bool checked, double check_tol,
              Report& report) {
  int failed = 0, skipped = 0;
  std::vector<CheckedCost> costs;
  std::optional<CaseResult> plain;  // the unchecked row of the current pair
  const int passes = checked ? 2 : 1;
  for (std::size_t n = 0; n < cases.size() * passes; ++n) {
    const std::size_t i = n / passes;
    opt.checked = checked && n % passes == 1;
    const BenchCase& c = cases[i];
    std::cerr << "[" << i + 1 << "/" << cases.size() << "] " << c.name
              << (opt.checked ? " (checked)" : "") << " ..." << std::endl;
    CaseResult r = run_case(c, opt, check_tol);
    failed += (r.error || r.check_failed) ? 1 : 0;
    skipped += (r.skipped && !r.error) ? 1 : 0;
    if (checked && !opt.checked) plain = r;
    if (opt.checked && plain && !plain->error && !r.error && !r.skipped && plain->time_us > 0) {
      costs.push_back({c.name, plain->time_us, r.time_us, plain->time_us_graph, r.time_us_graph});
    }
    report.add(std::move(r));
  }
  const std::size_t rows = cases.size() * passes;
  std::cout << "\n" << rows << " cases: " << rows - failed - skipped << " ran, "
            << skipped << " skipped, " << failed << " failed\n";
  if (!costs.empty()) print_checked_costs(costs);
  return failed;
}

// --fused: per GQA case, the fused step over the plain decode and over the three launches, each
// as single launches (cold L2) and per launch inside a CUDA graph.
void print_fused_summary(const std::vector<CaseResult>& results) {
  std::cout << "\nfused decode step (fused / plain - 1; fused / three launches - 1):\n";
  const auto pct = [](double a, double b) { return 100.0 * (a / b - 1.0); };
  for (const CaseResult& r : results) {
    if (!r.fused || r.time_us <= 0) continue;
    const FusedTimes& f = *r.fused;
    std::cout << "  " << std::left << std::setw(28) << r.name << std::right << std::fixed << std::setprecision(2)
              << " vs plain " << std::setw(7) << pct(f.fused_us, r.time_us) << " %";
    if (f.fused_graph_us && r.time_us_graph) std::cout << " (graph " << std::setw(7) << pct(*f.fused_graph_us, *r.time_us_graph) << " %)";
    if (f.three_us) std::cout << "   vs 3 launches " << std::setw(7) << pct(f.fused_us, *f.three_us) << " %";
    if (f.fused_graph_us && f.three_graph_us) std::cout << " (graph " << std::setw(7) << pct(*f.fused_graph_us, *f.three_graph_us) << " %)";
    std::cout << "\n";
  }
  std::cout.unsetf(std::ios::floatfield);
}

int run(int argc, char** argv) {
  CLI::App app{"deca-bench: decode-attention benchmark (GQA paged decode, MLA decode).\n"
               "Shapes: docs/benchmarks.md; timing: one launch with a cold L2, median of "
               "--iters after --warmup, plus back-to-back launches in a CUDA graph."};
  Cli o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);

  if (o.list) {
    print_presets(std::cout);
    return 0;
  }
  if (!o.json_path.empty()) {
    if (const std::string why = json_path_problem(o.json_path); !why.empty()) {
      std::cerr << "deca-bench: --json: expected a path where a file can be written, got '"
                << o.json_path << "': " << why << "\n";
      return 2;
    }
  }
  std::vector<BenchCase> shape_cases;
  for (const std::string& spec : o.shapes) shape_cases.push_back(parse_shape(spec));
  const deca::KvLayout layout = o.layout_name == "hnd" ? deca::KvLayout::kHND : deca::KvLayout::kNHD;
  const bool gpu = deca::cuda::available();
  if (!o.precompile_preset.empty()) {
    if (!gpu && o.arch == 0) {
      std::cerr << "deca-bench: --precompile: no CUDA device found: name the compute capability "
                   "to compile for with --arch (e.g. --arch 90 for Hopper)\n";
      return 2;
    }
    std::vector<BenchCase> cases = collect({o.precompile_preset});
    cases.insert(cases.end(), shape_cases.begin(), shape_cases.end());
    return precompile(cases, layout, o.device, o.arch, o.jobs, o.skip_softmax, o.stamps, o.checked);
  }

  RunOptions opt;
  opt.cuda = o.backend == "cuda" || (o.backend == "auto" && gpu);
  if (opt.cuda && !gpu) {
    std::cerr << "deca-bench: --backend cuda: no CUDA GPU found (driver or device missing)\n";
    return 2;
  }
  const bool default_run = o.presets.empty() && shape_cases.empty();
  if (default_run) {
    if (opt.cuda) {
      o.presets = {"gqa"};
    } else {
      if (!gpu) std::cout << "no CUDA GPU found: running the CPU backend on the small preset\n";
      o.presets = {"small"};
    }
  }
  opt.device = o.device;
  opt.layout = layout;
  opt.iters = o.iters > 0 ? o.iters : (opt.cuda ? 20 : 3);
  opt.warmup = o.warmup >= 0 ? o.warmup : (opt.cuda ? 5 : 1);
  opt.check = o.check || (default_run && !opt.cuda);
  opt.check_requests = o.check_requests;
  opt.host_calls = o.host_cost ? o.host_calls : 0;
  opt.mla_schedule_every = o.mla_schedule == "every";
  opt.skip_softmax = o.skip_softmax;
  opt.peaked = o.dist == "peaked";
  opt.fused = o.fused;
  opt.layers = o.layers;
  opt.stamps = o.stamps;
  opt.seed = run_seed();
  std::vector<BenchCase> cases = collect(o.presets);
  cases.insert(cases.end(), shape_cases.begin(), shape_cases.end());

  std::unique_ptr<GpuTimer> timer;
  Report report(std::cout, describe_run(opt, timer));
  report.print_header();
  const int failed = run_cases(cases, opt, o.checked, o.check_tol, report);
  print_skip_table(std::cout, report.results());
  if (o.fused) print_fused_summary(report.results());
  if (!o.json_path.empty()) {
    report.write_json(o.json_path);
    std::cout << "results written to " << o.json_path << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
