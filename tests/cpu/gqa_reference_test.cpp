// The GQA decode reference against an independent brute force, hand-computed cases and
// invariants (docs/semantics.md, "GQA / MQA / MHA decode").
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/paged_gqa_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/gqa_brute_force.hpp"
#include "cpu/reference.hpp"

namespace deca::test {
namespace {

// ---------------------------------------------------------------------------------------------
// Hand-computed: one q head, head_dim 2, two keys on two pages stored in reverse order.
// q = [1, 0], k0 = [0, 0], k1 = [1, 0] (logits 0 and 1 with scale 1), v0 = [1, 0], v1 = [0, 1]:
// out = [1, e] / (1 + e), lse = log(1 + e).
struct TwoKeys {
  HostTensor q{DType::kBF16, {1, 1, 1, 2}};
  HostTensor k{DType::kBF16, {2, 1, 1, 2}};
  HostTensor v{DType::kBF16, {2, 1, 1, 2}};
  HostTensor table{DType::kINT32, {1, 2}};
  HostTensor lens{DType::kINT32, {1}};
  HostTensor out{DType::kFP32, {1, 1, 1, 2}};
  HostTensor sink{DType::kFP32, {1}};
  float lse = NAN;
  GqaParams p{};

  TwoKeys() {
    q.set(0, 1.f);
    // Token 0 lives in page 1, token 1 in page 0.
    k.set(2, 0.f), k.set(3, 0.f), v.set(2, 1.f), v.set(3, 0.f);
    k.set(0, 1.f), k.set(1, 0.f), v.set(0, 0.f), v.set(1, 1.f);
    table.data<int>()[0] = 1, table.data<int>()[1] = 0;
    lens.data<int>()[0] = 2;
    p.batch = p.q_len = p.num_q_heads = p.num_kv_heads = p.page_size = 1;
    p.head_dim = 2, p.max_pages = 2, p.num_pages = 2, p.beam_width = 1;
    p.q_dtype = p.kv_dtype = static_cast<int>(DType::kBF16);
    p.out_dtype = static_cast<int>(DType::kFP32);
    p.q = q.raw(), p.q_stride_batch = p.q_stride_token = p.q_stride_head = 2;
    p.k_cache = k.raw(), p.v_cache = v.raw();
    p.k_stride_page = p.v_stride_page = p.k_stride_slot = p.v_stride_slot = 2;
    p.k_stride_head = p.v_stride_head = 2;
    p.page_table = table.data<int>(), p.page_table_stride = 2;
    p.seq_lens = lens.data<int>();
    p.out = out.raw(), p.out_stride_batch = p.out_stride_token = p.out_stride_head = 2;
    p.lse = &lse;
    p.k_scale = p.v_scale = p.softmax_scale = p.out_scale = 1.f;
  }
};

TEST(GqaReference, HandTwoKeys) {
  TwoKeys c;
  cpu::gqa_decode(c.p);
  EXPECT_NEAR(c.out.get(0), 0.2689414213699951, 1e-7);
  EXPECT_NEAR(c.out.get(1), 0.7310585786300049, 1e-7);
  EXPECT_NEAR(c.lse, 1.3132616875182228, 1e-6);
}

TEST(GqaReference, HandTwoKeysSink) {
  TwoKeys c;
  c.sink.data<float>()[0] = 0.f;  // exp(0) = 1 joins the denominator
  c.p.sinks = c.sink.data<float>();
  cpu::gqa_decode(c.p);
  EXPECT_NEAR(c.out.get(0), 0.21194155761708547, 1e-7);
  EXPECT_NEAR(c.out.get(1), 0.5761168847658291, 1e-7);
  EXPECT_NEAR(c.lse, 1.3132616875182228, 1e-6);  // the sink is not in the LSE
}

TEST(GqaReference, HandTwoKeysSoftcap) {
  TwoKeys c;
  c.p.softcap = 0.5f;  // logit 1 -> 0.5 tanh(2) = 0.48201379
  cpu::gqa_decode(c.p);
  EXPECT_NEAR(c.out.get(0), 0.38177671092879956, 1e-7);
  EXPECT_NEAR(c.out.get(1), 0.6182232890712005, 1e-7);
  EXPECT_NEAR(c.lse, 0.9629193676420975, 1e-6);
}

TEST(GqaReference, HandTwoKeysQuantizedScales) {
  TwoKeys c;
  // int8 codes with scales: k1 = 4 * 0.25 = 1, v0 = v1 = 2 * 0.5 = 1 (per element as below).
  HostTensor k8(DType::kINT8, {2, 1, 1, 2}), v8(DType::kINT8, {2, 1, 1, 2});
  k8.set(0, 4.f), v8.set(1, 2.f), v8.set(2, 2.f);
  c.p.k_cache = k8.raw(), c.p.v_cache = v8.raw();
  c.p.kv_dtype = static_cast<int>(DType::kINT8);
  c.p.k_scale = 0.25f, c.p.v_scale = 0.5f;
  cpu::gqa_decode(c.p);
  EXPECT_NEAR(c.out.get(0), 0.2689414213699951, 1e-7);
  EXPECT_NEAR(c.out.get(1), 0.7310585786300049, 1e-7);
  EXPECT_NEAR(c.lse, 1.3132616875182228, 1e-6);
}

TEST(GqaReference, HandEmptyRow) {
  TwoKeys c;
  c.lens.data<int>()[0] = 0;
  cpu::gqa_decode(c.p);
  EXPECT_EQ(c.out.get(0), 0.f);
  EXPECT_EQ(c.out.get(1), 0.f);
  EXPECT_EQ(c.lse, -std::numeric_limits<float>::infinity());
}

// ---------------------------------------------------------------------------------------------
// Brute force over a table of feature combinations.

struct NamedSpec {
  std::string name;
  GqaCaseSpec spec;
};

GqaCaseSpec base(int batch = 2, int max_len = 40) {
  GqaCaseSpec s;
  s.batch = batch;
  s.max_len = max_len;
  return s;
}

std::vector<NamedSpec> feature_specs() {
  std::vector<NamedSpec> v;
  auto add = [&](std::string name, GqaCaseSpec s) { v.push_back({std::move(name), s}); };
  add("Plain", base());
  { auto s = base(); s.layout = KvLayout::kHND; add("HND", s); }
  { auto s = base(); s.kv_dtype = DType::kFP16; s.q_dtype = DType::kFP16; s.out_dtype = DType::kFP16; add("Fp16", s); }
  { auto s = base(); s.kv_dtype = DType::kFP8E4M3; add("KvFp8", s); }
  { auto s = base(); s.kv_dtype = DType::kINT8; s.layout = KvLayout::kHND; add("KvInt8Hnd", s); }
  { auto s = base(); s.kv_dtype = DType::kFP8E4M3; s.per_head_scales = true; s.num_kv_heads = 4; add("KvFp8PerHeadScales", s); }
  { auto s = base(); s.kv_dtype = DType::kINT8; s.per_head_scales = true; s.num_kv_heads = 4; add("KvInt8PerHeadScales", s); }
  { auto s = base(); s.out_dtype = DType::kFP8E4M3; s.out_scale = 0.01f; add("OutFp8", s); }
  { auto s = base(); s.num_q_heads = 4; s.num_kv_heads = 4; add("Mha", s); }
  { auto s = base(); s.num_q_heads = 16; s.num_kv_heads = 1; add("MqaGroup16", s); }
  { auto s = base(1, 20); s.num_q_heads = 128; s.num_kv_heads = 2; s.head_dim = 32; add("Group64", s); }
  { auto s = base(1, 20); s.num_q_heads = 72; s.num_kv_heads = 1; s.head_dim = 16; add("Group72", s); }
  { auto s = base(); s.head_dim = 16; add("HeadDim16", s); }
  { auto s = base(); s.head_dim = 80; add("HeadDim80", s); }
  { auto s = base(); s.head_dim = 256; s.num_q_heads = 4; s.num_kv_heads = 1; add("HeadDim256", s); }
  { auto s = base(); s.q_len = 4; add("QLen4Causal", s); }
  { auto s = base(3, 50); s.q_len = 6; s.tree_mask = true; add("TreeMask", s); }
  { auto s = base(2, 60); s.q_len = 40; s.tree_mask = true; s.head_dim = 16; add("TreeMask40Drafts", s); }
  { auto s = base(2, 70); s.window = 9; add("Window", s); }
  { auto s = base(2, 70); s.window = 5; s.q_len = 7; add("WindowQLen7", s); }
  { auto s = base(2, 70); s.window = 4; s.q_len = 6; s.tree_mask = true; add("WindowTreeMask", s); }
  { auto s = base(); s.softcap = 2.5f; s.value_range = 2.f; add("Softcap", s); }
  { auto s = base(); s.sinks = true; add("Sinks", s); }
  { auto s = base(); s.sinks = true; s.softcap = 3.f; s.q_len = 3; s.window = 11; add("SinksSoftcapWindow", s); }
  { auto s = base(); s.softmax_scale = 0.3f; add("SoftmaxScale", s); }
  { auto s = base(); s.lse = false; add("NoLse", s); }
  { auto s = base(); s.kv_one_allocation = true; s.layout = KvLayout::kHND; add("KvOneAllocation", s); }
  { auto s = base(); s.page_size = 1; add("PageSize1", s); }
  { auto s = base(2, 300); s.page_size = 256; s.head_dim = 16; add("PageSize256", s); }
  // Lengths at the page edges (page size 16): 0, 1, 15, 16, 17, and one long one.
  { auto s = base(6); s.seq_lens = {0, 1, 15, 16, 17, 200}; add("PageEdgeLengths", s); }
  { auto s = base(6); s.seq_lens = {0, 1, 15, 16, 17, 33}; s.page_size = 16; s.layout = KvLayout::kHND;
    s.kv_dtype = DType::kFP8E4M3; add("PageEdgeLengthsFp8Hnd", s); }
  // More drafts than cached tokens: the first rows see nothing.
  { auto s = base(1); s.seq_lens = {2}; s.q_len = 4; add("QLenBeyondLength", s); }
  return v;
}

void PrintTo(const NamedSpec& s, std::ostream* os) { *os << s.name; }

class GqaBruteForce : public ::testing::TestWithParam<NamedSpec> {};

TEST_P(GqaBruteForce, MatchesBruteForce) {
  DECA_SEED_TRACE();
  auto rng = make_rng(std::hash<std::string>{}(GetParam().name));
  GqaCase c = build_gqa_case(GetParam().spec, rng);
  cpu::gqa_decode(c.params);
  EXPECT_EQ(expect_matches_brute_force(c, brute_force_gqa(c)), 0);
}

INSTANTIATE_TEST_SUITE_P(Features, GqaBruteForce, ::testing::ValuesIn(feature_specs()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Invariants: each compares two runs bit for bit.

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

GqaCaseSpec invariant_spec() {
  GqaCaseSpec s = base(4, 70);
  s.seq_lens = {70, 33, 1, 48};
  s.q_len = 1;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.sinks = false;
  return s;
}

TEST(GqaReferenceInvariant, PermutingPagesChangesNothing) {
  DECA_SEED_TRACE();
  auto rng = make_rng(11);
  GqaCaseSpec spec = invariant_spec();
  spec.kv_dtype = DType::kFP8E4M3;
  GqaCase c = build_gqa_case(spec, rng);
  cpu::gqa_decode(c.params);
  const HostTensor out = c.out, lse = c.lse;

  // Move every pool page to a new place (a random permutation) and rewrite the table to match.
  const std::int64_t pages = c.k_pool.shape()[0];
  std::vector<int> where(pages);
  std::iota(where.begin(), where.end(), 0);
  std::shuffle(where.begin(), where.end(), rng);
  const std::int64_t page_bytes = c.k_pool.bytes() / pages;
  HostTensor k2 = c.k_pool, v2 = c.v_pool;
  for (std::int64_t pg = 0; pg < pages; ++pg) {
    std::memcpy(static_cast<char*>(k2.raw()) + where[pg] * page_bytes,
                static_cast<const char*>(c.k_pool.raw()) + pg * page_bytes, page_bytes);
    std::memcpy(static_cast<char*>(v2.raw()) + where[pg] * page_bytes,
                static_cast<const char*>(c.v_pool.raw()) + pg * page_bytes, page_bytes);
  }
  c.k_pool = std::move(k2), c.v_pool = std::move(v2);
  for (int b = 0; b < spec.batch; ++b) {
    for (int j = 0; j < (c.lens[b] + spec.page_size - 1) / spec.page_size; ++j) {
      int& e = c.page_table.data<int>()[b * c.page_table.shape()[1] + j];
      e = where[e];
    }
  }
  c.bind();
  poison_outputs(c);
  cpu::gqa_decode(c.params);
  EXPECT_TRUE(same_bytes(out, c.out));
  EXPECT_TRUE(same_bytes(lse, c.lse));
}

TEST(GqaReferenceInvariant, NhdEqualsHnd) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec = invariant_spec();
  spec.q_len = 3;
  auto rng1 = make_rng(12), rng2 = make_rng(12);
  GqaCase nhd = build_gqa_case(spec, rng1);
  spec.layout = KvLayout::kHND;
  GqaCase hnd = build_gqa_case(spec, rng2);
  ASSERT_EQ(nhd.k_logical, hnd.k_logical);  // the same data, laid out differently
  ASSERT_FALSE(same_bytes(nhd.k_pool, hnd.k_pool));
  cpu::gqa_decode(nhd.params);
  cpu::gqa_decode(hnd.params);
  EXPECT_TRUE(same_bytes(nhd.out, hnd.out));
  EXPECT_TRUE(same_bytes(nhd.lse, hnd.lse));
}

TEST(GqaReferenceInvariant, SinkOfMinusInfinityEqualsNoSink) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec = invariant_spec();
  spec.sinks = true;
  auto rng = make_rng(13);
  GqaCase c = build_gqa_case(spec, rng);
  cpu::gqa_decode(c.params);
  const HostTensor with_sink = c.out;
  std::fill_n(c.sinks.data<float>(), spec.num_q_heads, -std::numeric_limits<float>::infinity());
  poison_outputs(c);
  cpu::gqa_decode(c.params);
  const HostTensor minus_inf = c.out, lse_minus_inf = c.lse;
  c.params.sinks = nullptr;
  poison_outputs(c);
  cpu::gqa_decode(c.params);
  EXPECT_TRUE(same_bytes(minus_inf, c.out));
  EXPECT_TRUE(same_bytes(lse_minus_inf, c.lse));
  EXPECT_FALSE(same_bytes(with_sink, c.out));  // a finite sink does change the output
}

TEST(GqaReferenceInvariant, WindowCoveringEverythingEqualsNoWindow) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec = invariant_spec();
  spec.q_len = 2;
  auto rng = make_rng(14);
  GqaCase c = build_gqa_case(spec, rng);
  cpu::gqa_decode(c.params);
  const HostTensor out = c.out, lse = c.lse;
  c.params.window = 70;  // the longest request: every key is inside it
  poison_outputs(c);
  cpu::gqa_decode(c.params);
  EXPECT_TRUE(same_bytes(out, c.out));
  EXPECT_TRUE(same_bytes(lse, c.lse));
  c.params.window = 10;  // and a real window does change it
  cpu::gqa_decode(c.params);
  EXPECT_FALSE(same_bytes(lse, c.lse));
}

// Speculative decoding without a tree mask is causal: draft i equals a plain decode of the
// first seq_len - q_len + i + 1 tokens.
TEST(GqaReferenceInvariant, DraftsEqualSequentialDecodes) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec = invariant_spec();
  spec.q_len = 4;
  spec.seq_lens = {70, 33, 4, 48};
  auto rng = make_rng(15);
  GqaCase c = build_gqa_case(spec, rng);
  cpu::gqa_decode(c.params);
  const std::int64_t row = static_cast<std::int64_t>(spec.num_q_heads) * spec.head_dim;
  for (int i = 0; i < spec.q_len; ++i) {
    std::vector<int> shorter(c.lens);
    for (int& l : shorter) l = l - spec.q_len + i + 1;
    HostTensor out(spec.out_dtype, {spec.batch, 1, spec.num_q_heads, spec.head_dim});
    GqaParams p = c.params;
    p.q_len = 1;
    p.q = static_cast<const std::uint16_t*>(c.q.raw()) + i * p.q_stride_token;
    p.seq_lens = shorter.data();
    p.out = out.raw();
    p.out_stride_batch = p.out_stride_token = row;
    p.lse = nullptr;
    cpu::gqa_decode(p);
    for (int b = 0; b < spec.batch; ++b) {
      EXPECT_EQ(std::memcmp(static_cast<const std::uint16_t*>(c.out.raw()) + (b * spec.q_len + i) * row,
                            static_cast<const std::uint16_t*>(out.raw()) + b * row, row * 2),
                0)
          << "request " << b << " draft " << i;
    }
  }
}

TEST(GqaReferenceInvariant, EmptyRowsAreZeroWithMinusInfLse) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec = base(3);
  spec.seq_lens = {0, 5, 0};
  spec.sinks = true;
  auto rng = make_rng(16);
  GqaCase c = build_gqa_case(spec, rng);
  cpu::gqa_decode(c.params);
  const std::int64_t row = static_cast<std::int64_t>(spec.num_q_heads) * spec.head_dim;
  for (int b : {0, 2}) {
    for (std::int64_t n = 0; n < row; ++n) EXPECT_EQ(c.out.get(b * row + n), 0.f);
    for (int h = 0; h < spec.num_q_heads; ++h) {
      EXPECT_EQ(c.lse.data<float>()[b * spec.num_q_heads + h], -std::numeric_limits<float>::infinity());
    }
  }
  for (std::int64_t n = 0; n < row; ++n) EXPECT_TRUE(std::isfinite(c.out.get(row + n)));
}

// ---------------------------------------------------------------------------------------------
// Size: the l70-b99-4k shape (Llama-70B-like heads, batch 99, 4096 tokens, page 32) must run
// well within a minute on two cores. The pages come from a shared pool to keep memory small;
// the arithmetic is that of the full shape.
TEST(GqaReferenceTiming, L70B99x4k) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec;
  spec.batch = 99;
  spec.num_q_heads = 64;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.page_size = 32;
  spec.max_len = 4096;
  spec.shared_pool_pages = 256;
  auto rng = make_rng(17);
  GqaCase c = build_gqa_case(spec, rng);
  const auto start = std::chrono::steady_clock::now();
  cpu::gqa_decode(c.params);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[   TIME   ] l70-b99-4k CPU reference: %.2f s on %u threads\n", seconds,
              std::thread::hardware_concurrency());
  EXPECT_LT(seconds, 60.0);
  for (std::int64_t n = 0; n < c.out.numel(); n += 977) ASSERT_TRUE(std::isfinite(c.out.get(n))) << n;
  for (std::int64_t n = 0; n < c.lse.numel(); ++n) ASSERT_TRUE(std::isfinite(c.lse.data<float>()[n])) << n;
}

}  // namespace
}  // namespace deca::test
