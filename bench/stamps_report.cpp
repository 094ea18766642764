#include "stamps_report.hpp"

#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <vector>

#include "api/gqa_prepare.hpp"
#include "cuda/gqa_stamps.hpp"
#include "gpu_timer.hpp"

namespace deca::bench {

namespace {

nlohmann::json spread_json(const cuda::EventSpread& e) {
  return {{"count", e.count}, {"p10_us", e.p10}, {"median_us", e.median}, {"p90_us", e.p90}, {"max_us", e.max}};
}

std::string us(double v) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << v;
  return s.str();
}

}  // namespace

nlohmann::json stamps_json(const cuda::StampSummary& s) {
  nlohmann::json j = {{"ctas", s.ctas},
                      {"missing", s.missing},
                      {"sms", s.sms},
                      {"waves", static_cast<int>(s.waves.size())},
                      {"median_tiles", s.median_tiles},
                      {"span_us", s.span_us},
                      {"timer_step_ns", s.timer_step_ns},
                      {"gap_before_us", s.has_gap_before ? nlohmann::json(s.gap_before_us) : nlohmann::json(nullptr)},
                      {"gap_after_us", s.has_gap_after ? nlohmann::json(s.gap_after_us) : nlohmann::json(nullptr)}};
  nlohmann::json events = nlohmann::json::object();
  for (int e = 0; e < cuda::kStampEventCount; ++e) events[cuda::stamp_event_key(e)] = spread_json(s.events[e]);
  j["events"] = events;
  if (s.waves.size() > 1) {
    nlohmann::json waves = nlohmann::json::array();
    for (const cuda::WaveSummary& w : s.waves) {
      nlohmann::json we = nlohmann::json::object();
      for (int e = 0; e < cuda::kStampEventCount; ++e) we[cuda::stamp_event_key(e)] = spread_json(w.events[e]);
      waves.push_back({{"ctas", w.ctas}, {"events", we}});
    }
    j["per_wave"] = waves;
  }
  return j;
}

nlohmann::json measure_stamps(const GqaPlan& plan, const GqaDecodeArgs& args, std::size_t out_bytes,
                              const RunOptions& opt) {
  if (!opt.cuda) return {{"note", "the CPU backend has no stamps"}};
  if (!cuda::gqa_stamps_supported(plan)) {
    return {{"note", "no stamp build: " + plan.kernel_name + " is not a Hopper kernel"}};
  }
  const cuda::GqaStamper stamper(plan, "deca-bench --stamps");
  api::check_gqa_decode(plan, args, /*check_workspace=*/true);
  const GqaParams p = api::gqa_params(plan, args, args.workspace);
  std::vector<unsigned char> plain(out_bytes), stamped(out_bytes);
  check_cuda(cudaMemcpy(plain.data(), args.out.data, out_bytes, cudaMemcpyDeviceToHost), "out (D2H)");
  auto clear = [&](cudaStream_t s) { stamper.clear(s); };
  auto launch = [&](cudaStream_t s) { stamper.run(p, s); };
  // The first run loads the module's code (lazy loading) and opts the function in to its shared
  // memory: ungated, as time_cold's first call (a load must not wait behind the held stream).
  const cudaStream_t stream = opt.timer->stream();
  clear(stream);
  launch(stream);
  check_cuda(cudaStreamSynchronize(stream), "the stamp build's first run (cudaStreamSynchronize)");
  check_cuda(cudaMemsetAsync(args.out.data, 0xFF, out_bytes, stream), "cudaMemsetAsync (out)");
  opt.timer->run_cold(clear, launch);
  const cuda::StampRun run = stamper.read(p, stream);
  check_cuda(cudaMemcpy(stamped.data(), args.out.data, out_bytes, cudaMemcpyDeviceToHost), "out (D2H)");
  nlohmann::json j = stamps_json(cuda::summarize_stamps(run));
  j["kernel"] = stamper.kernel_name();
  j["grid_ctas"] = run.grid_ctas;
  j["recorded_ctas"] = static_cast<long long>(run.ctas.size());
  j["same_bits_as_plain"] = std::memcmp(plain.data(), stamped.data(), out_bytes) == 0;
  return j;
}

void print_stamps(std::ostream& out, const nlohmann::json& j) {
  if (j.contains("note")) {
    out << "    stamps: " << j["note"].get<std::string>() << "\n";
    return;
  }
  const int waves = j.value("waves", 1);
  out << "    stamps [" << j.value("kernel", std::string()) << "]: " << j.value("ctas", 0) << " CTAs on "
      << j.value("sms", 0) << " SMs, " << waves << (waves == 1 ? " wave" : " waves") << ", "
      << j.value("median_tiles", -1) << " tiles per CTA (median); first entry to last end " << us(j.value("span_us", 0.0))
      << " us; timer step " << j.value("timer_step_ns", 0.0) << " ns";
  if (j.value("missing", 0) > 0) out << "; " << j["missing"].get<int>() << " CTAs wrote nothing";
  if (j.value("grid_ctas", 0LL) > j.value("recorded_ctas", 0LL)) {
    out << "; records for the first " << j["recorded_ctas"].get<long long>() << " of "
        << j["grid_ctas"].get<long long>() << " CTAs";
  }
  if (j.contains("same_bits_as_plain")) {
    out << (j["same_bits_as_plain"].get<bool>() ? "; output bitwise as the plain kernel's"
                                                 : "; OUTPUT DIFFERS from the plain kernel's");
  }
  out << "\n";
  // Stamps against stamps only: %globaltimer and the CUDA events are different clocks.
  out << "      previous kernel's end -> first entry "
      << (j["gap_before_us"].is_null() ? std::string("-") : us(j["gap_before_us"].get<double>()))
      << " us; last CTA's end -> next kernel " << (j["gap_after_us"].is_null() ? std::string("-") : us(j["gap_after_us"].get<double>()))
      << " us (%globaltimer; not comparable with the event-timed us above)\n";
  out << "      " << std::left << std::setw(30) << "us since the first entry" << std::right << std::setw(8) << "p10"
      << std::setw(8) << "median" << std::setw(8) << "p90" << std::setw(8) << "max" << std::setw(7) << "CTAs";
  const bool per_wave = j.contains("per_wave");
  if (per_wave) {
    for (int w = 0; w < waves; ++w) out << std::setw(7) << "wave " << w << " med";
  }
  out << "\n";
  for (int e = 0; e < cuda::kStampEventCount; ++e) {
    const nlohmann::json& ev = j["events"][cuda::stamp_event_key(e)];
    if (ev.value("count", 0) == 0) continue;
    out << "      " << std::left << std::setw(30) << cuda::stamp_event_label(e) << std::right;
    for (const char* f : {"p10_us", "median_us", "p90_us", "max_us"}) out << std::setw(8) << us(ev.value(f, 0.0));
    out << std::setw(7) << ev.value("count", 0);
    if (per_wave) {
      for (const nlohmann::json& w : j["per_wave"]) {
        const nlohmann::json& we = w["events"][cuda::stamp_event_key(e)];
        out << std::setw(12) << (we.value("count", 0) > 0 ? us(we.value("median_us", 0.0)) : std::string("-"));
      }
    }
    out << "\n";
  }
}

}  // namespace deca::bench
