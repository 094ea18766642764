#include "cuda/stamp_summary.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace deca::cuda {

namespace {

constexpr const char* kKeys[kStampEventCount] = {"entry",   "waited", "q",           "issued",   "first_tile",
                                                 "last_pv", "out",    "merge_weights", "merge_end"};
constexpr const char* kLabels[kStampEventCount] = {
    "entry (before the PDL wait)", "after the PDL wait",   "q in shared memory",
    "first copies issued",         "first tile landed",    "last tile's PV done",
    "output / partial published",  "merge: weights ready", "merge: outputs written"};

// The CTA's last event: its end.
std::uint64_t end_of(const CtaStamps& c) { return *std::max_element(c.t.begin(), c.t.end()); }

// Per event, the spread over `ctas` (those with a record) of the time since t0.
std::array<EventSpread, kStampEventCount> spreads(const std::vector<const CtaStamps*>& ctas, std::uint64_t t0) {
  std::array<EventSpread, kStampEventCount> out{};
  for (int e = 0; e < kStampEventCount; ++e) {
    std::vector<double> us;
    for (const CtaStamps* c : ctas) {
      if (c->t[e] != 0) us.push_back(static_cast<double>(static_cast<std::int64_t>(c->t[e] - t0)) * 1e-3);
    }
    EventSpread& s = out[e];
    s.count = static_cast<int>(us.size());
    if (us.empty()) continue;
    s.max = *std::max_element(us.begin(), us.end());
    s.p10 = percentile(us, 0.1);
    s.median = percentile(us, 0.5);
    s.p90 = percentile(std::move(us), 0.9);
  }
  return out;
}

}  // namespace

const char* stamp_event_key(int e) { return e >= 0 && e < kStampEventCount ? kKeys[e] : "?"; }
const char* stamp_event_label(int e) { return e >= 0 && e < kStampEventCount ? kLabels[e] : "?"; }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

std::vector<int> wave_of_ctas(const std::vector<CtaStamps>& ctas) {
  std::vector<int> wave(ctas.size(), -1);
  std::map<int, std::vector<std::size_t>> by_sm;
  for (std::size_t i = 0; i < ctas.size(); ++i) {
    if (ctas[i].sm >= 0 && ctas[i].t[gqa::kStampEntry] != 0) by_sm[ctas[i].sm].push_back(i);
  }
  for (auto& [sm, ids] : by_sm) {
    std::stable_sort(ids.begin(), ids.end(), [&](std::size_t a, std::size_t b) {
      return ctas[a].t[gqa::kStampEntry] < ctas[b].t[gqa::kStampEntry];
    });
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const std::uint64_t entry = ctas[ids[k]].t[gqa::kStampEntry];
      int w = 0;
      for (std::size_t j = 0; j < k; ++j) {
        if (end_of(ctas[ids[j]]) <= entry) w = std::max(w, wave[ids[j]] + 1);
      }
      wave[ids[k]] = w;
    }
  }
  return wave;
}

StampSummary summarize_stamps(const StampRun& run) {
  StampSummary s;
  std::vector<const CtaStamps*> with;
  std::set<int> sms;
  std::vector<double> tiles;
  for (const CtaStamps& c : run.ctas) {
    if (c.sm < 0 || c.t[gqa::kStampEntry] == 0) {
      ++s.missing;
      continue;
    }
    with.push_back(&c);
    sms.insert(c.sm);
    if (c.tiles >= 0) tiles.push_back(c.tiles);
  }
  s.ctas = static_cast<int>(with.size());
  s.sms = static_cast<int>(sms.size());
  if (with.empty()) return s;
  if (!tiles.empty()) s.median_tiles = static_cast<int>(percentile(tiles, 0.5));
  std::uint64_t t0 = with.front()->t[gqa::kStampEntry], t_end = 0;
  std::vector<std::uint64_t> all;
  for (const CtaStamps* c : with) {
    t0 = std::min(t0, c->t[gqa::kStampEntry]);
    t_end = std::max(t_end, end_of(*c));
    for (std::uint64_t t : c->t) {
      if (t != 0) all.push_back(t);
    }
  }
  s.span_us = static_cast<double>(t_end - t0) * 1e-3;
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) {
    const double step = static_cast<double>(all[i] - all[i - 1]);
    if (s.timer_step_ns == 0 || step < s.timer_step_ns) s.timer_step_ns = step;
  }
  // Signed: the marks come from the same clock, but nothing forces their order.
  if (run.mark_before != 0) {
    s.has_gap_before = true;
    s.gap_before_us = static_cast<double>(static_cast<std::int64_t>(t0 - run.mark_before)) * 1e-3;
  }
  if (run.mark_after != 0) {
    s.has_gap_after = true;
    s.gap_after_us = static_cast<double>(static_cast<std::int64_t>(run.mark_after - t_end)) * 1e-3;
  }
  s.events = spreads(with, t0);
  const std::vector<int> wave = wave_of_ctas(run.ctas);
  const int waves = 1 + *std::max_element(wave.begin(), wave.end());
  for (int w = 0; w < waves; ++w) {
    std::vector<const CtaStamps*> in;
    for (std::size_t i = 0; i < run.ctas.size(); ++i) {
      if (wave[i] == w) in.push_back(&run.ctas[i]);
    }
    WaveSummary ws;
    ws.ctas = static_cast<int>(in.size());
    ws.events = spreads(in, t0);
    s.waves.push_back(ws);
  }
  return s;
}

const std::vector<StampOrder>& stamp_orders() {
  using namespace gqa;
  static const std::vector<StampOrder> orders = {
      {kStampEntry, kStampWaited},         {kStampWaited, kStampQ},           {kStampWaited, kStampIssued},
      {kStampWaited, kStampOut},           {kStampIssued, kStampFirstTile},   {kStampQ, kStampFirstTile},
      {kStampIssued, kStampLastPv},        {kStampQ, kStampLastPv},           {kStampFirstTile, kStampLastPv},
      {kStampLastPv, kStampOut},           {kStampOut, kStampMergeWeights},   {kStampMergeWeights, kStampMergeEnd}};
  return orders;
}

}  // namespace deca::cuda
