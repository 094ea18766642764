// Valid gqa_decode calls run on the CPU and write what the semantics say, checked on cases whose
// answer is known in closed form (uniform attention averages the visible values; one dominant
// logit selects one key), so that every params field the API fills is exercised.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "api/api_fixtures.hpp"

namespace deca::test {
namespace {

// V (or K) element d of token t, KV head h, request b, read through the page table.
float cache_at(const GqaCase& c, const HostTensor& cache, int b, int t, int h, int d) {
  const int ps = c.config.page_size, hk = c.config.num_kv_heads, hd = c.config.head_dim;
  const std::int64_t page = c.page_table.data<std::int32_t>()[b * c.max_pages + t / ps];
  const std::int64_t slot = t % ps;
  const std::int64_t idx = c.config.layout == KvLayout::kNHD
                               ? ((page * ps + slot) * hk + h) * hd + d
                               : ((page * hk + h) * ps + slot) * hd + d;
  return cache.get(idx);
}

class GqaRun : public ::testing::TestWithParam<KvLayout> {};

TEST_P(GqaRun, UniformAttentionAveragesVisibleValues) {
  GqaCase c;
  c.config.layout = GetParam();
  c.build();
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, 0.f);
  gqa_decode(c.plan(), c.args);
  const int group = c.config.num_q_heads / c.config.num_kv_heads;
  for (int b = 0; b < c.batch; ++b) {
    const int len = c.lens[b];
    for (int h = 0; h < c.config.num_q_heads; ++h) {
      for (int d = 0; d < c.config.head_dim; ++d) {
        double sum = 0;
        for (int t = 0; t < len; ++t) sum += cache_at(c, c.v, b, t, h / group, d);
        const std::int64_t o = (b * c.config.num_q_heads + h) * c.config.head_dim + d;
        ASSERT_NEAR(c.out.get(o), sum / len, 0.03) << "b " << b << " h " << h << " d " << d;
      }
      EXPECT_NEAR(c.lse.data<float>()[b * c.config.num_q_heads + h], std::log(len), 1e-5);
    }
  }
}

TEST_P(GqaRun, DominantLogitSelectsOneKey) {
  GqaCase c;
  c.config.layout = GetParam();
  c.build();
  const int hq = c.config.num_q_heads, hk = c.config.num_kv_heads, hd = c.config.head_dim;
  const int group = hq / hk;
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, i % hd == 0 ? 8.f : 0.f);
  for (std::int64_t i = 0; i < c.k.numel(); ++i) c.k.set(i, 0.f);
  // Key (b + 2 * kvh) % len of each (request, KV head) gets logit 64; all others 0.
  auto target = [&](int b, int kvh) { return (b + 2 * kvh) % c.lens[b]; };
  const int ps = c.config.page_size;
  for (int b = 0; b < c.batch; ++b) {
    for (int kvh = 0; kvh < hk; ++kvh) {
      const int t = target(b, kvh);
      const std::int64_t page = c.page_table.data<std::int32_t>()[b * c.max_pages + t / ps];
      const std::int64_t idx = c.config.layout == KvLayout::kNHD
                                   ? ((page * ps + t % ps) * hk + kvh) * hd
                                   : ((page * hk + kvh) * ps + t % ps) * hd;
      c.k.set(idx, 8.f);
    }
  }
  c.args.softmax_scale = 1.f;
  gqa_decode(c.plan(), c.args);
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < hq; ++h) {
      for (int d = 0; d < hd; ++d) {
        const float want = cache_at(c, c.v, b, target(b, h / group), h / group, d);
        ASSERT_NEAR(c.out.get((b * hq + h) * hd + d), want, 1e-3) << "b " << b << " h " << h;
      }
      EXPECT_NEAR(c.lse.data<float>()[b * hq + h], 64.f, 1e-3);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GqaRun, ::testing::Values(KvLayout::kNHD, KvLayout::kHND),
                         [](const auto& info) {
                           return std::string(info.param == KvLayout::kNHD ? "NHD" : "HND");
                         });

TEST(GqaRunEdges, EmptyRequestOutputsZerosAndMinusInfLse) {
  GqaCase c;
  c.lens = {0, 9};
  c.build();
  gqa_decode(c.plan(), c.args);
  for (int i = 0; i < c.config.num_q_heads * c.config.head_dim; ++i) ASSERT_EQ(c.out.get(i), 0.f);
  for (int h = 0; h < c.config.num_q_heads; ++h) {
    EXPECT_EQ(c.lse.data<float>()[h], -std::numeric_limits<float>::infinity());
  }
  EXPECT_FALSE(all_bytes_are(c.out, kPoison));
}

TEST(GqaRunEdges, EmptyBatchWritesNothing) {
  GqaCase c;
  c.build();
  c.args.q = view_as(c.q, {0, 1, 4, 32}, {128, 128, 32, 1});
  c.args.out = view_as(c.out, {0, 1, 4, 32}, {128, 128, 32, 1});
  c.args.lse = view_as(c.lse, {0, 1, 4}, {4, 4, 1});
  c.args.page_table = view_as(c.page_table, {0, 4}, {4, 1});
  c.args.seq_lens = view_as(c.seq_lens, {0}, {1});
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
  EXPECT_TRUE(all_bytes_are(c.out, kPoison));
}

TEST(GqaRunEdges, OneShotMatchesPlanned) {
  GqaCase c;
  c.build();
  gqa_decode(c.plan(), c.args);
  HostTensor planned = c.out;
  c.poison();
  gqa_decode(c.config, c.args);
  EXPECT_EQ(std::memcmp(planned.raw(), c.out.raw(), c.out.bytes()), 0);
}

TEST(GqaRunEdges, StridedViewsGiveTheSameResult) {
  GqaCase c;
  c.build();
  gqa_decode(c.plan(), c.args);
  HostTensor contiguous = c.out;

  // q and out with heads padded to 48 elements (96 bytes, still 16-byte aligned rows).
  HostTensor q_pad(DType::kBF16, {2, 1, 4, 48}), out_pad(DType::kBF16, {2, 1, 4, 48});
  for (int r = 0; r < 8; ++r) {
    std::memcpy(q_pad.data<std::uint16_t>() + r * 48, c.q.data<std::uint16_t>() + r * 32, 64);
  }
  out_pad.fill_bytes(kPoison);
  c.args.q = view_as(q_pad, {2, 1, 4, 32}, {192, 192, 48, 1});
  c.args.out = view_as(out_pad, {2, 1, 4, 32}, {192, 192, 48, 1});
  gqa_decode(c.plan(), c.args);
  for (int r = 0; r < 8; ++r) {
    ASSERT_EQ(std::memcmp(out_pad.data<std::uint16_t>() + r * 48,
                          contiguous.data<std::uint16_t>() + r * 32, 64),
              0)
        << "row " << r;
    // The padding between rows is not the output's: it stays poisoned.
    const auto* pad =
        reinterpret_cast<const std::uint8_t*>(out_pad.data<std::uint16_t>() + r * 48 + 32);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(pad[i], kPoison);
  }
}

TEST(GqaRunEdges, FeaturesRunWhenPlanned) {
  GqaCase c;
  c.config.sinks = true;
  c.config.tree_mask = true;
  c.config.per_head_kv_scale = true;
  c.config.window = 3;
  c.config.softcap = 30.f;
  c.q_len = 2;
  c.build();
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
  for (std::int64_t i = 0; i < c.out.numel(); ++i) ASSERT_TRUE(std::isfinite(c.out.get(i)));
}

}  // namespace
}  // namespace deca::test
