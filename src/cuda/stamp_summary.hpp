// The phase stamps of one launch (kernels/gqa/stamps.cuh) as per-CTA records, and their summary:
// per event the spread over the CTAs of the time since the earliest CTA's entry, per wave when the
// launch had more than one. Host-only and pure (table-tested in tests/plan/stamp_summary_test.cpp);
// deca-bench --stamps prints it (bench/stamps_report.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/gqa/stamps.cuh"

namespace deca::cuda {

inline constexpr int kStampEventCount = gqa::kStampEvents;

// One CTA's record. t[e]: %globaltimer (ns) of event e, 0 when not reached.
struct CtaStamps {
  std::array<std::uint64_t, kStampEventCount> t{};
  int sm = -1;  // -1: the CTA wrote nothing
  int x = 0, y = 0, z = 0;
  int tiles = -1;  // tiles of its split; -1: not written
};

// One launch: its grid's CTAs in linear order (x fastest; at most kStampCtas of them) and the mark
// kernel's stamps just before and after it (0: none).
struct StampRun {
  std::vector<CtaStamps> ctas;
  std::uint64_t mark_before = 0;
  std::uint64_t mark_after = 0;
  long long grid_ctas = 0;
};

// Short name (JSON key) and label (table row) of event e.
const char* stamp_event_key(int e);
const char* stamp_event_label(int e);

// Percentiles of a sample by linear interpolation between the closest ranks (p in [0, 1]); 0 for
// an empty sample.
double percentile(std::vector<double> v, double p);

struct EventSpread {
  int count = 0;  // CTAs that reached the event
  double p10 = 0, median = 0, p90 = 0, max = 0;  // us since the earliest entry
};

struct WaveSummary {
  int ctas = 0;
  std::array<EventSpread, kStampEventCount> events{};
};

struct StampSummary {
  int ctas = 0;            // CTAs that wrote a record
  int missing = 0;         // CTAs of the grid (within kStampCtas) that wrote none
  int sms = 0;             // distinct SMs
  int median_tiles = -1;
  double span_us = 0;      // earliest entry to the latest CTA end (its last event)
  double timer_step_ns = 0;  // the smallest step between distinct stamps: the timer's resolution at best
  bool has_gap_before = false, has_gap_after = false;
  double gap_before_us = 0;  // the mark kernel's stamp before the launch -> the earliest entry
  double gap_after_us = 0;   // the latest CTA end -> the mark kernel's stamp after the launch
  std::array<EventSpread, kStampEventCount> events{};
  std::vector<WaveSummary> waves;  // one per wave, in order (wave_of_ctas)
};

// The wave of each CTA: 0 if no CTA of its SM had ended when it entered, else one more than the
// latest wave among those that had. A CTA's end is its last event. -1 for CTAs without a record.
std::vector<int> wave_of_ctas(const std::vector<CtaStamps>& ctas);

StampSummary summarize_stamps(const StampRun& run);

// Event pairs (before, after) that every CTA reaching both meets in that order, whatever the
// kernel's prologue order (q's step may come before or after the first copies).
struct StampOrder {
  int before, after;
};
const std::vector<StampOrder>& stamp_orders();

}  // namespace deca::cuda
