#include "report.hpp"

#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "deca/error.hpp"
#include "stamps_report.hpp"

namespace deca::bench {
namespace {

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string sci(std::optional<double> v) {
  if (!v) return "-";
  if (std::isnan(*v)) return "nan";
  std::ostringstream s;
  s << std::scientific << std::setprecision(2) << *v;
  return s.str();
}

// CPU runs land far below 0.01 TFLOP/s: keep three significant digits there.
std::string flops_text(double tflops) { return fixed(tflops, tflops >= 1 ? 1 : tflops >= 0.01 ? 3 : 5); }

double gbs(double bytes, double us) { return us > 0 ? bytes / (us * 1e-6) / 1e9 : 0; }

nlohmann::json optional_json(std::optional<double> v) {
  if (!v || std::isnan(*v)) return nullptr;
  return *v;
}

constexpr int kNameWidth = 30;
const int kWidths[] = {kNameWidth, 5, 10, 10, 10, 10, 8, 9, 9, 8, 6, 9, 9, 6};

}  // namespace

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void Report::print_header() {
  const char* heads[] = {"case", "bknd", "min us", "median us", "p90 us", "graph us", "host us",
                         "KV GB/s", "tot GB/s",
                         "TFLOP/s", "ratio", "max abs", "rel rms", "splits"};
  int i = 0;
  for (const char* h : heads) out_ << std::left << std::setw(kWidths[i++]) << h << " ";
  out_ << "kernel\n";
  out_ << std::string(kNameWidth + 130, '-') << "\n";
}

void Report::add(CaseResult r) {
  out_ << std::left << std::setw(kNameWidth) << r.name << " " << std::setw(kWidths[1])
       << r.backend << " ";
  if (r.error) {
    out_ << "FAILED: " << *r.error << "\n";
  } else if (r.skipped) {
    out_ << "skipped: " << *r.skipped << "\n";
  } else {
    const double kv = gbs(r.kv_bytes, r.time_us);
    const std::string ratio =
        info_.copy_bandwidth_gbs ? fixed(kv / *info_.copy_bandwidth_gbs, 3) : "-";
    const std::string cols[] = {
        fixed(r.time_us_min, 1),
        fixed(r.time_us, 1),
        fixed(r.time_us_p90, 1),
        r.time_us_graph ? fixed(*r.time_us_graph, 1) : "-",
        r.host_us ? fixed(*r.host_us, 2) : "-",
        fixed(kv, 1),
        fixed(gbs(r.total_bytes, r.time_us), 1),
        flops_text(r.time_us > 0 ? r.flops / (r.time_us * 1e-6) / 1e12 : 0),
        ratio,
        sci(r.max_abs_err),
        sci(r.rel_rms_err),
        std::to_string(r.num_splits)};
    int i = 2;
    for (const std::string& c : cols) out_ << std::right << std::setw(kWidths[i++]) << c << " ";
    out_ << std::left << (r.kernel_name.empty() ? "-" : r.kernel_name) << "\n";
    if (r.host_us) {
      // The host figure split in its two parts, so that one run says where the time goes.
      out_ << "    host us/call: " << fixed(*r.host_us, 2) << " total";
      if (r.host_launch_floor_us) {
        out_ << " = launch floor " << fixed(*r.host_launch_floor_us, 2) << " + deca "
             << fixed(*r.host_us - *r.host_launch_floor_us, 2) << " (by difference)";
      }
      if (r.host_deca_us) out_ << "; deca without the launch, timed: " << fixed(*r.host_deca_us, 2);
      if (r.host_floor_plain_us && r.host_floor_small_us) {
        out_ << "; floor via cuLaunchKernel " << fixed(*r.host_floor_plain_us, 2)
             << ", with an 8-byte parameter " << fixed(*r.host_floor_small_us, 2);
      }
      out_ << "  [" << r.host_note << "]\n";
    }
    if (!r.graph_note.empty()) out_ << "    (no graph figure: " << r.graph_note << ")\n";
    if (r.fused) print_fused(r);
    if (r.layers) print_layers(*r.layers);
    if (r.stamps.is_object()) print_stamps(out_, r.stamps);
    if (r.check_failed) out_ << "    CHECK FAILED: " << *r.check_failed << "\n";
  }
  out_.flush();
  results_.push_back(std::move(r));
}

// --fused: the fused step against the plain decode (this row) and the three launches.
void Report::print_fused(const CaseResult& r) {
  const FusedTimes& f = *r.fused;
  const auto pct = [](double a, double b) { return b > 0 ? fixed(100.0 * (a / b - 1.0), 1) + " %" : std::string("-"); };
  out_ << "    fused: " << fixed(f.fused_us, 1) << " us (" << pct(f.fused_us, r.time_us) << " vs plain)";
  if (f.fused_graph_us && r.time_us_graph) {
    out_ << ", graph " << fixed(*f.fused_graph_us, 1) << " us (" << pct(*f.fused_graph_us, *r.time_us_graph) << ")";
  }
  if (f.three_us) out_ << "; rotate + append + decode (3 launches) " << fixed(*f.three_us, 1) << " us";
  if (f.three_graph_us) out_ << ", graph " << fixed(*f.three_graph_us, 1) << " us";
  if (f.max_abs_vs_three) out_ << "; max |fused - 3 launches| " << sci(f.max_abs_vs_three);
  out_ << "  [" << f.kernel_name << "]\n";
}

// --layers: per launch in a graph of L consecutive layers, with and without PDL.
void Report::print_layers(const LayerTimes& t) {
  out_ << "    layers: " << t.layers << " in a graph (" << t.caches << " caches): "
       << (t.pdl_us ? fixed(*t.pdl_us, 1) : std::string("-")) << " us per launch with PDL, "
       << (t.plain_us ? fixed(*t.plain_us, 1) : std::string("-")) << " without";
  if (t.pdl_us && t.plain_us && *t.plain_us > 0) {
    out_ << " (" << fixed(*t.plain_us - *t.pdl_us, 2) << " us, " << fixed(100.0 * (*t.pdl_us / *t.plain_us - 1.0), 1)
         << " %)";
  }
  if (!t.note.empty()) out_ << "  [" << t.note << "]";
  out_ << "\n";
}

void Report::write_json(const std::string& path) const {
  nlohmann::json j;
  j["git_commit"] = info_.git_commit;
  j["date"] = info_.date;
  j["device"] = info_.device;
  j["copy_bandwidth_gbs"] = optional_json(info_.copy_bandwidth_gbs);
  j["timing"] = {{"l2_flush", info_.l2_flush}, {"seed", info_.seed}};
  j["cases"] = nlohmann::json::array();
  for (const CaseResult& r : results_) {
    nlohmann::json c = {{"name", r.name}, {"backend", r.backend}, {"kv_dtype", r.kv_dtype}};
    if (r.shape.is_object()) c.update(r.shape);  // a case that failed early has no shape
    if (r.error) {
      c["error"] = *r.error;
    } else if (r.skipped) {
      c["skipped"] = *r.skipped;
    } else {
      const double kv = gbs(r.kv_bytes, r.time_us);
      c["time_us"] = r.time_us;
      c["time_us_min"] = r.time_us_min;
      c["time_us_p90"] = r.time_us_p90;
      c["host_us_per_call"] = optional_json(r.host_us);
      if (r.host_us) c["host_note"] = r.host_note;
      c["host_launch_floor_us"] = optional_json(r.host_launch_floor_us);
      c["host_floor_cuLaunchKernel_us"] = optional_json(r.host_floor_plain_us);
      c["host_floor_8byte_param_us"] = optional_json(r.host_floor_small_us);
      c["host_deca_us"] = optional_json(r.host_deca_us);
      c["time_us_graph"] = optional_json(r.time_us_graph);
      c["kv_bytes"] = r.kv_bytes;
      c["total_bytes"] = r.total_bytes;
      c["kv_gbs"] = kv;
      c["total_gbs"] = gbs(r.total_bytes, r.time_us);
      c["tflops"] = r.time_us > 0 ? r.flops / (r.time_us * 1e-6) / 1e12 : 0.0;
      c["ratio_to_copy"] =
          info_.copy_bandwidth_gbs ? nlohmann::json(kv / *info_.copy_bandwidth_gbs) : nullptr;
      c["max_abs_err"] = optional_json(r.max_abs_err);
      c["rel_rms_err"] = optional_json(r.rel_rms_err);
      c["num_splits"] = r.num_splits;
      c["kernel_name"] = r.kernel_name;
      if (r.skip.is_object()) c["skip_softmax"] = r.skip;
      if (r.stamps.is_object()) c["stamps"] = r.stamps;
      if (r.check_failed) c["check_failed"] = *r.check_failed;
      if (r.layers) {
        c["layers"] = {{"count", r.layers->layers},
                       {"caches", r.layers->caches},
                       {"pdl_time_us_graph", optional_json(r.layers->pdl_us)},
                       {"plain_time_us_graph", optional_json(r.layers->plain_us)}};
      }
      if (r.fused) {
        const FusedTimes& f = *r.fused;
        c["fused"] = {{"kernel_name", f.kernel_name},
                      {"time_us", f.fused_us},
                      {"time_us_graph", optional_json(f.fused_graph_us)},
                      {"three_launch_time_us", optional_json(f.three_us)},
                      {"three_launch_time_us_graph", optional_json(f.three_graph_us)},
                      {"max_abs_vs_three_launch", optional_json(f.max_abs_vs_three)}};
      }
    }
    j["cases"].push_back(std::move(c));
  }
  std::ofstream f(path);
  if (!f) throw Error("deca-bench: --json: cannot open '" + path + "' for writing");
  f << j.dump(2) << "\n";
  if (!f) throw Error("deca-bench: --json: writing '" + path + "' failed");
}

}  // namespace deca::bench
