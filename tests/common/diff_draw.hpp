// The differential test's schedule: `count` cases drawn from one seed, each a family and that
// family's draw, over pools of layers (what kernels compile for) sized to the count, so that a
// bounded run compiles tens of kernels and a long one a few hundred. Drawing is cheap and holds
// no data: a case's tensors are built from its own seed when it runs (build_case), so that case i
// can be replayed alone and a GPU run can plan (compile) every case ahead, in parallel.
//
// Adding a family: a draw, a DiffCase (diff_gqa.hpp, diff_mla.hpp), a Family value, its share in
// kShares, and a line each in draw_cases, build_case and plan_case.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/diff_case.hpp"
#include "common/diff_gqa.hpp"
#include "common/diff_mla.hpp"

namespace deca::test::diff {

// Shares of the draws, in Family order.
inline constexpr double kShares[static_cast<int>(Family::kCount)] = {0.45, 0.25, 0.20, 0.10};

struct CaseDraw {
  int index = 0;
  Family family = Family::kGqa;
  std::uint64_t data_seed = 0;  // the case's tensors come from this seed alone
  GqaDraw gqa;
  MlaSparseDraw mla_sparse;
  MlaDenseDraw mla_dense;
  CombineDraw combine;
};

inline Family draw_family(Rng& rng) {
  double u = uniform_real(rng, 0, 1);
  for (int f = 0; f < static_cast<int>(Family::kCount); ++f) {
    if (u < kShares[f]) return static_cast<Family>(f);
    u -= kShares[f];
  }
  return Family::kGqa;
}

// A pool of about one layer per `cases_per_layer` cases of a family, at least `lo`, at most `hi`.
inline int pool_size(int count, Family f, int cases_per_layer, int lo, int hi) {
  const double cases = count * kShares[static_cast<int>(f)];
  return std::clamp(static_cast<int>(cases / cases_per_layer), lo, hi);
}

inline std::vector<CaseDraw> draw_cases(int count, std::uint64_t seed) {
  Rng layers_rng(seed * 0x9E3779B97F4A7C15ull + 0xD1F7);
  std::vector<GqaLayer> gqa_layers(pool_size(count, Family::kGqa, 12, 8, 400));
  for (std::size_t i = 0; i < gqa_layers.size(); ++i)
    gqa_layers[i] = draw_gqa_layer(layers_rng, static_cast<int>(i));
  std::vector<MlaSparseLayer> mla_layers(pool_size(count, Family::kMlaSparse, 25, 4, 64));
  for (std::size_t i = 0; i < mla_layers.size(); ++i)
    mla_layers[i] = draw_mla_sparse_layer(layers_rng, static_cast<int>(i));
  std::vector<MlaDenseLayer> dense_layers(pool_size(count, Family::kMlaDense, 20, 6, 64));
  for (std::size_t i = 0; i < dense_layers.size(); ++i)
    dense_layers[i] = draw_mla_dense_layer(layers_rng, static_cast<int>(i));

  Rng rng(seed * 0x9E3779B97F4A7C15ull + 0xCA5E);
  const auto any = [&](const auto& pool) -> const auto& {
    return pool[uniform(rng, 0, static_cast<int>(pool.size()) - 1)];
  };
  std::vector<CaseDraw> cases(count);
  for (int i = 0; i < count; ++i) {
    CaseDraw& c = cases[i];
    c.index = i;
    c.data_seed =
        seed * 0xBF58476D1CE4E5B9ull + static_cast<std::uint64_t>(i) * 0x94D049BB133111EBull + 1;
    c.family = draw_family(rng);
    switch (c.family) {
      case Family::kGqa: c.gqa = draw_gqa(rng, any(gqa_layers)); break;
      case Family::kMlaSparse: c.mla_sparse = draw_mla_sparse(rng, any(mla_layers)); break;
      case Family::kMlaDense: c.mla_dense = draw_mla_dense(rng, any(dense_layers)); break;
      case Family::kCombine: c.combine = draw_combine(rng); break;
      default: break;
    }
  }
  return cases;
}

inline std::unique_ptr<DiffCase> build_case(const CaseDraw& c) {
  Rng rng(c.data_seed);
  switch (c.family) {
    case Family::kGqa: return std::make_unique<GqaDiff>(c.gqa, rng);
    case Family::kMlaSparse: return std::make_unique<MlaSparseDiff>(c.mla_sparse, rng);
    case Family::kMlaDense: return std::make_unique<MlaDenseDiff>(c.mla_dense, rng);
    case Family::kCombine: return std::make_unique<CombineDiff>(c.combine, rng);
    default: return nullptr;
  }
}

// Makes the plan case `c` will make on `device` (compiling its kernels on first use), without
// data; throws deca::Error where the case would be refused at plan time.
inline void plan_case(const CaseDraw& c, Device device) {
  switch (c.family) {
    case Family::kGqa: {
      GqaConfig cfg = c.gqa.config;
      cfg.device = device;
      (void)plan_gqa_decode(cfg);
      break;
    }
    case Family::kMlaSparse:
    case Family::kMlaDense: {
      MlaConfig cfg = c.family == Family::kMlaSparse ? c.mla_sparse.config : c.mla_dense.config;
      cfg.device = device;
      (void)plan_mla_decode(cfg);
      break;
    }
    default: break;  // the combine op has no plan
  }
}

}  // namespace deca::test::diff
