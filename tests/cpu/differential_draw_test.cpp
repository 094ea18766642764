// The differential test's generator without a GPU (tests/gpu/differential_test.cpp runs it against
// the GPU): every drawn case is a valid call that the CPU reference runs, writing every output
// element and nothing around the views; the draws cover every feature they promise; a case is
// rebuilt from its own seed byte for byte (what DECA_DIFF_ONLY replays).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/diff_draw.hpp"
#include "common/test_seed.hpp"
#include "deca/error.hpp"

namespace deca::test::diff {
namespace {

constexpr int kCases = 500;

// The tensor of `tensors` a view points into, as the mirrors find it (-1: none).
int holder_of(const std::vector<HostTensor*>& tensors, const TensorView& v) {
  const char* p = static_cast<const char*>(v.data);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const char* base = static_cast<const char*>(tensors[i]->raw());
    if (p >= base && p < base + std::max<std::size_t>(tensors[i]->bytes(), 1)) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// The GPU runner's way of running a case (tests/gpu/diff_mirror.hpp) with host memory: every
// tensor copied, views moved to the copy at their offset. Runs there must write what runs on the
// case's own tensors write, which holds only if tensors() names every buffer a view points into
// and outputs() the buffers the op writes.
class HostMirror {
 public:
  explicit HostMirror(const std::vector<HostTensor*>& tensors) : host_(tensors) {
    for (const HostTensor* t : tensors) copies_.push_back(*t);
  }
  Side side() {
    Side s;
    s.move = [this](const TensorView& v) {
      const int i = holder_of(host_, v);
      if (i < 0) {
        ADD_FAILURE() << "a view points into no tensor of its case";
        return v;
      }
      TensorView m = v;
      m.data = static_cast<char*>(copies_[i].raw()) +
               (static_cast<const char*>(v.data) - static_cast<const char*>(host_[i]->raw()));
      return m;
    };
    return s;
  }
  const HostTensor& copy_of(const HostTensor* t) const {
    for (std::size_t i = 0; i < host_.size(); ++i) {
      if (host_[i] == t) return copies_[i];
    }
    ADD_FAILURE() << "an output is not among the case's tensors";
    return copies_.front();
  }
  void poison(const std::vector<Output>& outs) {
    for (const Output& o : outs) {
      if (!o.in_place) const_cast<HostTensor&>(copy_of(o.storage)).fill_bytes(0xFF);
    }
  }

 private:
  std::vector<HostTensor*> host_;
  std::vector<HostTensor> copies_;
};

TEST(DifferentialDraw, CpuReferenceRunsEveryDrawnCase) {
  DECA_SEED_TRACE();
  const std::vector<CaseDraw> draws = draw_cases(kCases, test_seed());
  int per_family[static_cast<int>(Family::kCount)] = {};
  int failures = 0;
  for (const CaseDraw& d : draws) {
    ++per_family[static_cast<int>(d.family)];
    const std::unique_ptr<DiffCase> c = build_case(d);
    const std::vector<Output> outs = c->outputs();
    const std::vector<HostTensor> before = save_in_place(outs);
    poison(outs);
    // Every case, not only the mirrored fifth: each view lies in a tensor of the case, or the GPU
    // mirror leaves it on the host and the GPU refuses the call (a pool of no pages once put V
    // past the end of K's shared allocation).
    Side own;
    own.move = [&, tensors = c->tensors()](const TensorView& v) {
      if (holder_of(tensors, v) < 0 && failures++ < 10) {
        ADD_FAILURE() << "case " << d.index << ": a view points into no tensor of its case\n  "
                      << c->describe();
      }
      return v;
    };
    try {
      EXPECT_EQ(c->run(own, 0), "") << "the CPU backend names no kernel";
    } catch (const Error& e) {
      if (failures++ < 10)
        ADD_FAILURE() << "case " << d.index << " refused: " << e.what() << "\n  " << c->describe();
      continue;
    }
    // The reference against itself: the poison left inside a view (an element not written) or
    // lost outside it (a write past the view) is what this sees.
    Mismatch m;
    const std::vector<HostTensor> got = snapshot(outs);
    restore_in_place(outs, before);  // the mirrored run starts from the case's caches
    c->compare(outs, got, got, Tolerance{0, 0, 0}, m);
    if (!m.within(Tolerance{0, 0, 0}) && failures++ < 10) {
      ADD_FAILURE() << "case " << d.index << ": " << m.text() << "\n  " << c->describe();
    }
    if (d.index % 5 != 0) continue;  // a fifth of the cases again through a mirror
    HostMirror mirror(c->tensors());
    mirror.poison(outs);
    c->run(mirror.side(), 0);
    for (std::size_t k = 0; k < outs.size(); ++k) {
      const HostTensor& mirrored = mirror.copy_of(outs[k].storage);
      if (std::memcmp(mirrored.raw(), got[k].raw(), got[k].bytes()) != 0 && failures++ < 10) {
        ADD_FAILURE() << "case " << d.index << ": " << outs[k].name
                      << " differs when run on copies\n  " << c->describe();
      }
    }
  }
  EXPECT_EQ(failures, 0);
  for (int f = 0; f < static_cast<int>(Family::kCount); ++f) {
    EXPECT_GT(per_family[f], kCases * kShares[f] / 2) << family_name(static_cast<Family>(f));
  }
}

// Each feature the generator promises appears among the draws (forced into the first layers of a
// pool, or drawn per case with a probability that makes a miss over 500 draws negligible).
using Pred = std::function<bool(const CaseDraw&)>;

// A predicate on the draws of family `f`, given one on its draw (CaseDraw member `m`).
template <class Draw>
auto of(Family f, Draw CaseDraw::*m) {
  return [f, m](std::function<bool(const Draw&)> p) -> Pred {
    return [=](const CaseDraw& c) { return c.family == f && p(c.*m); };
  };
}

void expect_each_drawn(const std::vector<std::pair<std::string, Pred>>& features) {
  const std::vector<CaseDraw> draws = draw_cases(kCases, test_seed());
  for (const auto& [name, has] : features) {
    int n = 0;
    for (const CaseDraw& d : draws) n += has(d);
    EXPECT_GT(n, 0) << "no draw has: " << name;
  }
}

TEST(DifferentialDraw, DrawsCoverEveryFeature) {
  DECA_SEED_TRACE();
  const auto gqa = of(Family::kGqa, &CaseDraw::gqa);
  const auto mla = of(Family::kMlaSparse, &CaseDraw::mla_sparse);
  const auto dense = of(Family::kMlaDense, &CaseDraw::mla_dense);
  const auto comb = of(Family::kCombine, &CaseDraw::combine);
  expect_each_drawn({
      {"gqa kv bf16", gqa([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kBF16; })},
      {"gqa kv fp16", gqa([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kFP16; })},
      {"gqa kv fp8", gqa([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kFP8E4M3; })},
      {"gqa kv int8", gqa([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kINT8; })},
      {"gqa fp8 d128 unchecked", gqa([](const GqaDraw& d) {
         return d.spec.kv_dtype == DType::kFP8E4M3 && d.spec.head_dim == 128 && !d.config.checked &&
                d.config.beam_width == 1;
       })},
      {"gqa q fp16", gqa([](const GqaDraw& d) { return d.spec.q_dtype == DType::kFP16; })},
      {"gqa out fp8", gqa([](const GqaDraw& d) { return d.spec.out_dtype == DType::kFP8E4M3; })},
      {"gqa per-head scales", gqa([](const GqaDraw& d) { return d.spec.per_head_scales; })},
      {"gqa HND", gqa([](const GqaDraw& d) { return d.spec.layout == KvLayout::kHND; })},
      {"gqa NHD", gqa([](const GqaDraw& d) { return d.spec.layout == KvLayout::kNHD; })},
      {"gqa K and V in one allocation",
       gqa([](const GqaDraw& d) { return d.spec.kv_one_allocation; })},
      {"gqa strided q", gqa([](const GqaDraw& d) { return d.q_pad > 0; })},
      {"gqa strided out", gqa([](const GqaDraw& d) { return d.out_pad > 0; })},
      {"gqa narrower page-table view", gqa([](const GqaDraw& d) { return d.table_columns < 0; })},
      {"gqa empty request", gqa([](const GqaDraw& d) {
         return std::count(d.spec.seq_lens.begin(), d.spec.seq_lens.end(), 0) > 0;
       })},
      {"gqa q_len 4", gqa([](const GqaDraw& d) { return d.spec.q_len == 4; })},
      {"gqa tree over drafts",
       gqa([](const GqaDraw& d) { return d.spec.q_len > 1 && d.spec.tree_mask; })},
      {"gqa causal over drafts",
       gqa([](const GqaDraw& d) { return d.spec.q_len > 1 && !d.spec.tree_mask; })},
      {"gqa window", gqa([](const GqaDraw& d) { return d.spec.window > 0; })},
      {"gqa softcap", gqa([](const GqaDraw& d) { return d.spec.softcap > 0; })},
      {"gqa sinks", gqa([](const GqaDraw& d) { return d.spec.sinks; })},
      {"gqa no lse", gqa([](const GqaDraw& d) { return !d.spec.lse; })},
      {"gqa beams", gqa([](const GqaDraw& d) { return d.config.beam_width > 1; })},
      {"gqa fixed split",
       gqa([](const GqaDraw& d) { return d.config.split_mode == SplitMode::kFixed; })},
      {"gqa checked", gqa([](const GqaDraw& d) { return d.config.checked; })},
      {"gqa max_batch above batch",
       gqa([](const GqaDraw& d) { return d.config.max_batch > d.spec.batch; })},
      {"gqa odd q heads",
       gqa([](const GqaDraw& d) { return d.spec.num_q_heads % 2 == 1 && d.spec.num_q_heads > 1; })},
      {"gqa group 16",
       gqa([](const GqaDraw& d) { return d.spec.num_q_heads / d.spec.num_kv_heads == 16; })},
      {"gqa head_dim 256", gqa([](const GqaDraw& d) { return d.spec.head_dim == 256; })},
      {"gqa page 1", gqa([](const GqaDraw& d) { return d.spec.page_size == 1; })},
      {"gqa second run", gqa([](const GqaDraw& d) { return d.passes == 2; })},
      {"mla odd heads", mla([](const MlaSparseDraw& d) { return d.spec.num_heads % 2 == 1; })},
      {"mla heads > 64", mla([](const MlaSparseDraw& d) { return d.spec.num_heads > 64; })},
      {"mla q_len 3", mla([](const MlaSparseDraw& d) { return d.spec.q_len == 3; })},
      {"mla topk not a multiple of 64",
       mla([](const MlaSparseDraw& d) { return d.spec.topk % 64 != 0; })},
      {"mla topk_length with an empty request", mla([](const MlaSparseDraw& d) {
         return d.spec.topk_length && d.edges.empty_request && d.spec.batch > 1;
       })},
      {"mla sinks", mla([](const MlaSparseDraw& d) { return d.spec.attn_sink; })},
      {"mla rows of -1",
       mla([](const MlaSparseDraw& d) { return d.edges.rows_of_skips && d.spec.batch > 1; })},
      {"mla duplicates", mla([](const MlaSparseDraw& d) { return d.spec.duplicates > 0; })},
      {"mla strided cache", mla([](const MlaSparseDraw& d) { return d.slot_pad > 0; })},
      {"mla strided indices", mla([](const MlaSparseDraw& d) { return d.index_pad > 0; })},
      {"mla strided q and out",
       mla([](const MlaSparseDraw& d) { return d.q_pad > 0 && d.out_pad > 0; })},
      {"mla reused schedule", mla([](const MlaSparseDraw& d) { return d.passes == 2; })},
      {"mla checked", mla([](const MlaSparseDraw& d) { return d.config.checked; })},
      {"mla unchecked", mla([](const MlaSparseDraw& d) { return !d.config.checked; })},
      {"mla dense bf16",
       dense([](const MlaDenseDraw& d) { return d.spec.kv_format == kMlaKvBF16; })},
      {"mla dense fp8 e4m3 at a scale not a power of two", dense([](const MlaDenseDraw& d) {
         return d.spec.kv_format == kMlaKvFP8E4M3 && d.spec.kv_scale > 0;
       })},
      {"mla dense 656-byte tokens",
       dense([](const MlaDenseDraw& d) { return d.spec.kv_format == kMlaKvFP8Sparse; })},
      {"mla dense checked", dense([](const MlaDenseDraw& d) { return d.config.checked; })},
      {"mla dense unchecked", dense([](const MlaDenseDraw& d) { return !d.config.checked; })},
      {"mla dense q_len 4", dense([](const MlaDenseDraw& d) { return d.spec.q_len == 4; })},
      {"mla dense odd heads > 64",
       dense([](const MlaDenseDraw& d) { return d.spec.num_heads > 64 && d.spec.num_heads % 2; })},
      {"mla dense empty request", dense([](const MlaDenseDraw& d) {
         return std::count(d.spec.seq_lens.begin(), d.spec.seq_lens.end(), 0) > 0;
       })},
      {"mla dense strided cache", dense([](const MlaDenseDraw& d) { return d.slot_pad > 0; })},
      {"mla dense narrower block table",
       dense([](const MlaDenseDraw& d) { return d.drop_column > 0; })},
      {"mla dense reused schedule", dense([](const MlaDenseDraw& d) { return d.passes == 2; })},
      {"combine bf16 out", comb([](const CombineDraw& d) { return d.out_dtype == DType::kBF16; })},
      {"combine fp16 out", comb([](const CombineDraw& d) { return d.out_dtype == DType::kFP16; })},
      {"combine fp32 out", comb([](const CombineDraw& d) { return d.out_dtype == DType::kFP32; })},
      {"combine sink", comb([](const CombineDraw& d) { return d.sink; })},
      {"combine a row without keys", comb([](const CombineDraw& d) { return d.dead_row; })},
      {"combine strided partial_out", comb([](const CombineDraw& d) { return d.po_pad > 0; })},
      {"combine strided partial_lse", comb([](const CombineDraw& d) { return d.pl_pad > 0; })},
      {"combine strided out", comb([](const CombineDraw& d) { return d.out_pad > 0; })},
  });
}

TEST(DifferentialDraw, DrawsCoverEveryModel1FusedAndSkipFeature) {
  DECA_SEED_TRACE();
  const auto m1 = [](std::function<bool(const Model1Spec&)> p) {
    return of(Family::kMlaModel1, &CaseDraw::model1)([p](const Model1Draw& d) { return p(d.spec); });
  };
  const auto fused = of(Family::kGqaFused, &CaseDraw::gqa);
  const auto skip = of(Family::kGqaSkip, &CaseDraw::gqa);
  const auto either_page = [](int page) {
    return [page](const Model1Spec& s) {
      return s.page_size == page || (s.extra_topk > 0 && s.extra_page_size == page);
    };
  };
  expect_each_drawn({
      {"model1 one cache", m1([](const Model1Spec& s) { return s.extra_topk == 0; })},
      {"model1 two caches", m1([](const Model1Spec& s) { return s.extra_topk > 0; })},
      {"model1 page 1", m1(either_page(1))},
      {"model1 page 2", m1(either_page(2))},
      {"model1 page 61", m1(either_page(61))},
      {"model1 page 256", m1(either_page(256))},
      {"model1 ragged topk_length", m1([](const Model1Spec& s) { return s.topk_length; })},
      {"model1 ragged extra_topk_length",
       m1([](const Model1Spec& s) { return s.extra_topk_length; })},
      {"model1 -1 entries", m1([](const Model1Spec& s) { return s.skip > 0; })},
      {"model1 a row of only -1", m1([](const Model1Spec& s) { return s.all_invalid_row; })},
      {"model1 duplicates", m1([](const Model1Spec& s) { return s.duplicates > 0; })},
      {"model1 sinks", m1([](const Model1Spec& s) { return s.attn_sink; })},
      {"model1 heads > 64 odd", m1([](const Model1Spec& s) { return s.num_heads > 64 && s.num_heads % 2; })},
      {"model1 one head", m1([](const Model1Spec& s) { return s.num_heads == 1; })},
      {"model1 q_len 4", m1([](const Model1Spec& s) { return s.q_len == 4; })},
      {"model1 topk not a multiple of 64", m1([](const Model1Spec& s) { return s.topk % 64 != 0; })},
      {"model1 strided views", m1([](const Model1Spec& s) { return s.strided; })},
      {"model1 padded blocks", m1([](const Model1Spec& s) { return s.block_pad > 0; })},
      {"model1 checked", [](const CaseDraw& c) {
         return c.family == Family::kMlaModel1 && c.model1.config.checked;
       }},
      {"model1 reused schedule", [](const CaseDraw& c) {
         return c.family == Family::kMlaModel1 && c.model1.passes == 2;
       }},
      {"fused neox", fused([](const GqaDraw& d) { return d.fused.style == RopeStyle::kNeox; })},
      {"fused gptj", fused([](const GqaDraw& d) { return d.fused.style == RopeStyle::kGptj; })},
      {"fused partial rotary_dim", fused([](const GqaDraw& d) {
         return d.config.rotary_dim > 0 && d.config.rotary_dim < d.spec.head_dim;
       })},
      {"fused explicit positions", fused([](const GqaDraw& d) { return d.fused.positions; })},
      {"fused derived positions", fused([](const GqaDraw& d) { return !d.fused.positions; })},
      {"fused cos/sin bf16 or fp16",
       fused([](const GqaDraw& d) { return d.fused.cos_sin_dtype != DType::kFP32; })},
      {"fused kv bf16", fused([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kBF16; })},
      {"fused kv fp16", fused([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kFP16; })},
      {"fused kv fp8", fused([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kFP8E4M3; })},
      {"fused kv int8", fused([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kINT8; })},
      {"fused 8-bit per-head scales", fused([](const GqaDraw& d) {
         return d.spec.per_head_scales &&
                (d.spec.kv_dtype == DType::kFP8E4M3 || d.spec.kv_dtype == DType::kINT8);
       })},
      {"fused q_len 4", fused([](const GqaDraw& d) { return d.spec.q_len == 4; })},
      {"fused tree", fused([](const GqaDraw& d) { return d.spec.tree_mask && d.spec.q_len > 1; })},
      {"fused window", fused([](const GqaDraw& d) { return d.spec.window > 0; })},
      {"fused beams", fused([](const GqaDraw& d) { return d.config.beam_width > 1; })},
      {"fused fixed split",
       fused([](const GqaDraw& d) { return d.config.split_mode == SplitMode::kFixed; })},
      {"skip peaked", skip([](const GqaDraw& d) { return d.peaked && !d.tiny; })},
      {"skip random data", skip([](const GqaDraw& d) { return !d.peaked && !d.tiny; })},
      {"skip factor >= 1",
       skip([](const GqaDraw& d) { return d.config.skip_softmax_factor >= 1.f; })},
      {"skip tiny factor against the exact kernel", skip([](const GqaDraw& d) { return d.tiny; })},
      {"skip kv fp8", skip([](const GqaDraw& d) { return d.spec.kv_dtype == DType::kFP8E4M3; })},
      {"skip beams", skip([](const GqaDraw& d) { return d.config.beam_width > 1; })},
      {"skip on the Hopper rows-on-M kernel (more than 16 rows)", skip([](const GqaDraw& d) {
         const GqaConfig& c = d.config;
         const bool fp8 = c.kv_dtype == DType::kFP8E4M3 && c.head_dim == 128;
         const bool b16 = (c.kv_dtype == DType::kBF16 || c.kv_dtype == DType::kFP16) &&
                          (c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256);
         return c.beam_width == 1 && c.max_q_len * (c.num_q_heads / c.num_kv_heads) > 16 && (fp8 || b16);
       })},
  });
}

// The comparison sees each way a GPU run can go wrong: an element left unwritten (NaN), a byte
// written beside a strided view, a wrong row, a row of a request without keys not zero, an LSE
// finite where the reference has -inf.
TEST(DifferentialDraw, CompareFindsEachKindOfMismatch) {
  DECA_SEED_TRACE();
  const std::vector<CaseDraw> draws = draw_cases(kCases, test_seed());
  const CaseDraw* pick = nullptr;
  for (const CaseDraw& d : draws) {
    const std::vector<int>& lens = d.gqa.spec.seq_lens;
    const auto empty = std::count(lens.begin(), lens.end(), 0);
    if (d.family == Family::kGqa && d.gqa.out_pad > 0 && d.gqa.spec.lse && empty > 0 &&
        empty < static_cast<long>(lens.size()) && d.gqa.spec.out_dtype != DType::kFP8E4M3) {
      pick = &d;
      break;
    }
  }
  ASSERT_NE(pick, nullptr) << "no GQA draw with a strided out, LSE, an empty request and another";
  const std::unique_ptr<DiffCase> c = build_case(*pick);
  const std::vector<Output> outs = c->outputs();
  poison(outs);
  c->run(Side{}, 0);
  const std::vector<HostTensor> ref = snapshot(outs);
  ASSERT_EQ(outs.size(), 2u);
  const Output& out = outs[0];
  // Rows (a head's output) of the first empty request and of the first other one.
  const GqaCaseSpec& s = pick->gqa.spec;
  const auto first = [&](bool is_empty) {
    const auto at = std::find_if(s.seq_lens.begin(), s.seq_lens.end(),
                                 [&](int len) { return (len == 0) == is_empty; });
    return static_cast<std::int64_t>(at - s.seq_lens.begin()) * s.q_len * s.num_q_heads;
  };
  const std::int64_t row_of_empty = first(true), other = first(false);
  const auto check = [&](const char* what,
                         const std::function<void(std::vector<HostTensor>&)>& spoil,
                         const std::function<bool(const Mismatch&)>& seen) {
    std::vector<HostTensor> got = ref;
    spoil(got);
    Mismatch m;
    for (std::size_t k = 0; k < outs.size(); ++k) compare_output(outs[k], ref[k], got[k], m);
    EXPECT_TRUE(seen(m)) << what << ": " << m.text();
    EXPECT_FALSE(m.within(c->tolerance(""))) << what;
  };
  const std::int64_t dim = out.view.shape[3], stride = out.view.stride[2];
  check(
      "an unwritten element", [&](auto& g) { g[0].fill_bytes(0xFF); },
      [](const Mismatch& m) { return m.nan > 0; });
  check(
      "a byte past a row", [&](auto& g) { g[0].set(dim, 0.f); },
      [](const Mismatch& m) { return m.gap_writes > 0; });
  check(
      "a wrong row",
      [&](auto& g) {
        for (std::int64_t e = 0; e < dim; ++e)
          g[0].set(other * stride + e, 1 - g[0].get(other * stride + e));
      },
      [](const Mismatch& m) { return m.out_rel > 0 && m.row_rel > 1; });
  check(
      "a row without keys not zero", [&](auto& g) { g[0].set(row_of_empty * stride, 1.f); },
      [](const Mismatch& m) { return m.zero_rows > 0; });
  check(
      "a finite LSE for a row without keys", [&](auto& g) { g[1].set(row_of_empty, 0.f); },
      [](const Mismatch& m) { return m.inf_mismatch > 0; });
}

// The fused family's CPU runs leave the caches as "rotate, then append" through separate steps
// (the test's own arithmetic, common/fused_gqa_case.hpp) leaves them: the new tokens in their
// slots, every other byte (other requests', shared beam pages, spare pages) as it was.
TEST(DifferentialDraw, FusedCachesAreRotateThenAppend) {
  DECA_SEED_TRACE();
  int n = 0;
  for (const CaseDraw& d : draw_cases(kCases, test_seed())) {
    if (d.family != Family::kGqaFused) continue;
    ++n;
    const std::unique_ptr<DiffCase> c = build_case(d);
    auto& g = dynamic_cast<GqaDiff&>(*c);
    const Unfused want = rotate_and_append(g.gqa_case(), g.fused_inputs());
    c->run(Side{}, 0);
    EXPECT_TRUE(same_bytes(g.gqa_case().k_pool, want.k_pool)) << c->describe();
    if (!want.v_pool.shape().empty())
      EXPECT_TRUE(same_bytes(g.gqa_case().v_pool, want.v_pool)) << c->describe();
  }
  EXPECT_GT(n, 0);
}

// The skip family's bound on the CPU: the reference's own skip-softmax (64-key tiles) against
// its exact attention on every drawn skip case, and the bound's peaked data make it drop tiles.
TEST(DifferentialDraw, CpuSkipWithinTheBound) {
  DECA_SEED_TRACE();
  int n = 0, changed = 0;
  for (const CaseDraw& d : draw_cases(kCases, test_seed())) {
    if (d.family != Family::kGqaSkip) continue;
    ++n;
    const std::unique_ptr<DiffCase> c = build_case(d);
    const std::vector<Output> outs = c->outputs();
    poison(outs);
    c->run(Side{}, 0);  // the CPU side: exact attention
    const std::vector<HostTensor> exact = snapshot(outs);
    poison(outs);
    dynamic_cast<GqaDiff&>(*c).run_as(Side{}, d.gqa.config);
    const std::vector<HostTensor> skipped = snapshot(outs);
    Mismatch m;
    c->compare(outs, exact, skipped, Tolerance{std::ldexp(1.0, -7), 0, 1e-5}, m);
    EXPECT_TRUE(m.within(Tolerance{})) << m.text() << "\n  " << c->describe();
    changed += !same_bytes(exact[0], skipped[0]);
  }
  EXPECT_GT(n, 0);
  EXPECT_GT(changed, 0) << "no drawn skip case dropped a tile on the CPU";
}

// The MODEL1 family's CPU side against the float64 semantics (common/model1_case.hpp's brute
// force) on the drawn cases small enough for it: the reference the GPU is held to, on the draws'
// page sizes, lengths, holes, duplicates and sinks.
TEST(DifferentialDraw, Model1CpuMatchesBruteForce) {
  DECA_SEED_TRACE();
  int n = 0;
  for (const CaseDraw& d : draw_cases(kCases, test_seed())) {
    const Model1Spec& s = d.model1.spec;
    if (d.family != Family::kMlaModel1 ||
        static_cast<std::int64_t>(s.batch) * s.q_len * s.num_heads * (s.topk + s.extra_topk) > (1 << 16))
      continue;
    ++n;
    const std::unique_ptr<DiffCase> c = build_case(d);
    c->run(Side{}, 0);
    const Model1Case& m = dynamic_cast<Model1Diff&>(*c).model1_case();
    const MlaExpected e = m.brute_force();
    const HostTensor out = m.out_rows(), lse = m.lse_rows();
    // Each element within bf16 rounding of its row's largest value (fp32 sums cancel: an element
    // far below the row's scale keeps no relative precision); the LSE within float rounding.
    long long bad = 0;
    for (std::size_t row = 0; row < e.lse.size(); ++row) {
      double scale = 0;
      for (int k = 0; k < 512; ++k) scale = std::max(scale, std::fabs(double(e.out[row * 512 + k])));
      for (int k = 0; k < 512; ++k) {
        const double want = double(e.out[row * 512 + k]);
        bad += !(std::fabs(out.get(static_cast<std::int64_t>(row * 512 + k)) - want) <= scale * 0x1p-7);
      }
      const double want = double(e.lse[row]), got = lse.data<float>()[row];
      if (s.lse) bad += std::isinf(want) ? got != want : !(std::fabs(got - want) <= 1e-5 * (1 + std::fabs(want)));
    }
    EXPECT_EQ(bad, 0) << c->describe();
  }
  EXPECT_GT(n, 0);
}

// The new comparisons see their failures: a cache byte not as the reference left it, an output
// element or an LSE outside the skip bound.
TEST(DifferentialDraw, CompareFindsCacheAndSkipMismatches) {
  DECA_SEED_TRACE();
  const std::vector<CaseDraw> draws = draw_cases(kCases, test_seed());
  const auto first = [&](Family f, const std::function<bool(const CaseDraw&)>& ok) {
    for (const CaseDraw& d : draws) {
      if (d.family == f && ok(d)) return &d;
    }
    return static_cast<const CaseDraw*>(nullptr);
  };
  const auto spoiled = [](const CaseDraw& d, const std::function<void(std::vector<HostTensor>&)>& spoil) {
    const std::unique_ptr<DiffCase> c = build_case(d);
    const std::vector<Output> outs = c->outputs();
    poison(outs);
    c->run(Side{}, 0);
    const std::vector<HostTensor> ref = snapshot(outs);
    std::vector<HostTensor> got = ref;
    spoil(got);
    Mismatch m;
    c->compare(outs, ref, got, c->tolerance(""), m);
    return m;
  };
  const CaseDraw* fused = first(Family::kGqaFused, [](const CaseDraw&) { return true; });
  ASSERT_NE(fused, nullptr);
  const Mismatch cache = spoiled(*fused, [](auto& g) {
    static_cast<unsigned char*>(g.back().raw())[g.back().bytes() / 2] ^= 1;  // a cache byte
  });
  EXPECT_GT(cache.in_place_bytes, 0) << cache.text();
  EXPECT_FALSE(cache.within(Tolerance{}));
  const CaseDraw* skip = first(Family::kGqaSkip, [](const CaseDraw& d) {
    return d.gqa.spec.lse && std::count(d.gqa.spec.seq_lens.begin(), d.gqa.spec.seq_lens.end(), 0) == 0;
  });
  ASSERT_NE(skip, nullptr);
  const Mismatch element = spoiled(*skip, [](auto& g) { g[0].set(0, g[0].get(0) + 100.f); });
  EXPECT_GT(element.bound_share, 1) << element.text();
  EXPECT_FALSE(element.within(Tolerance{}));
  const Mismatch lse = spoiled(*skip, [](auto& g) { g[1].set(0, g[1].get(0) + 1.f); });
  EXPECT_GT(lse.bound_share, 1) << lse.text();  // a skip run's LSE is never above the exact one
  EXPECT_FALSE(lse.within(Tolerance{}));
}

// A case is its seed: building it twice gives the same bytes, and a shorter run of the same seed
// draws the same first cases only when it draws the same pools, so a replay names the count.
TEST(DifferentialDraw, CaseRebuildsFromItsSeed) {
  DECA_SEED_TRACE();
  const std::vector<CaseDraw> draws = draw_cases(40, test_seed());
  for (const CaseDraw& d : {draws[3], draws[17], draws[39]}) {
    const std::unique_ptr<DiffCase> a = build_case(d), b = build_case(d);
    EXPECT_EQ(a->describe(), b->describe());
    const std::vector<HostTensor*> ta = a->tensors(), tb = b->tensors();
    ASSERT_EQ(ta.size(), tb.size());
    for (std::size_t i = 0; i < ta.size(); ++i) {
      ASSERT_EQ(ta[i]->bytes(), tb[i]->bytes());
      EXPECT_EQ(std::memcmp(ta[i]->raw(), tb[i]->raw(), ta[i]->bytes()), 0)
          << "tensor " << i << " of case " << d.index;
    }
  }
  EXPECT_EQ(build_case(draw_cases(40, test_seed())[17])->describe(),
            build_case(draws[17])->describe());
}

}  // namespace
}  // namespace deca::test::diff
