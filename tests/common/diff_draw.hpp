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
#include "common/diff_model1.hpp"

namespace deca::test::diff {

// Shares of the draws, in Family order: GQA, MLA sparse (V3.2), MLA dense, combine, MLA MODEL1,
// the fused GQA step, GQA skip-softmax.
inline constexpr double kShares[static_cast<int>(Family::kCount)] = {0.34, 0.17, 0.15, 0.07,
                                                                     0.12, 0.09, 0.06};

struct CaseDraw {
  int index = 0;
  Family family = Family::kGqa;
  std::uint64_t data_seed = 0;  // the case's tensors come from this seed alone
  GqaDraw gqa;
  MlaSparseDraw mla_sparse;
  MlaDenseDraw mla_dense;
  CombineDraw combine;
  Model1Draw model1;  // kGqaFused and kGqaSkip draw into `gqa`
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
  const auto pool = [&](Family f, int cases_per_layer, int lo, int hi, auto draw_layer) {
    std::vector<decltype(draw_layer(layers_rng, 0))> layers(
        pool_size(count, f, cases_per_layer, lo, hi));
    for (std::size_t i = 0; i < layers.size(); ++i)
      layers[i] = draw_layer(layers_rng, static_cast<int>(i));
    return layers;
  };
  const auto gqa_layers = pool(Family::kGqa, 12, 8, 400, draw_gqa_layer);
  const auto mla_layers = pool(Family::kMlaSparse, 25, 4, 64, draw_mla_sparse_layer);
  const auto dense_layers = pool(Family::kMlaDense, 20, 6, 64, draw_mla_dense_layer);
  const auto model1_layers = pool(Family::kMlaModel1, 20, 6, 64, draw_model1_layer);
  const auto fused_layers = pool(Family::kGqaFused, 20, 8, 64, draw_gqa_fused_layer);
  const auto skip_layers = pool(Family::kGqaSkip, 20, 8, 64, draw_gqa_skip_layer);

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
      case Family::kMlaModel1: c.model1 = draw_model1(rng, any(model1_layers)); break;
      case Family::kGqaFused: c.gqa = draw_gqa(rng, any(fused_layers)); break;
      case Family::kGqaSkip: c.gqa = draw_gqa(rng, any(skip_layers)); break;
      default: break;
    }
  }
  return cases;
}

inline std::unique_ptr<DiffCase> build_case(const CaseDraw& c) {
  Rng rng(c.data_seed);
  switch (c.family) {
    case Family::kGqa:
    case Family::kGqaFused:
    case Family::kGqaSkip: return std::make_unique<GqaDiff>(c.gqa, rng);
    case Family::kMlaModel1: return std::make_unique<Model1Diff>(c.model1, rng);
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
    case Family::kGqa:
    case Family::kGqaFused:
    case Family::kGqaSkip: {
      (void)plan_gqa_decode(for_device(c.gqa.config, device));
      if (c.gqa.tiny) {  // the second pass's exact kernel
        GqaConfig exact = c.gqa.config;
        exact.skip_softmax_factor = 0.f;
        (void)plan_gqa_decode(for_device(exact, device));
      }
      break;
    }
    case Family::kMlaSparse: (void)plan_mla_decode(for_device(c.mla_sparse.config, device)); break;
    case Family::kMlaDense: (void)plan_mla_decode(for_device(c.mla_dense.config, device)); break;
    case Family::kMlaModel1: (void)plan_mla_decode(for_device(c.model1.config, device)); break;
    default: break;  // the combine op has no plan
  }
}

}  // namespace deca::test::diff
