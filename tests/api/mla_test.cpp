// MLA plan / dense / sparse through the public API: bad inputs are rejected before any write
// with a message naming the argument, the expectation and the value; valid calls run on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api/api_fixtures.hpp"
#include "api/check.hpp"
#include "cuda/backend.hpp"

namespace deca::test {
namespace {

::testing::AssertionResult plan_rejects(const MlaConfig& config,
                                        std::initializer_list<std::string> needles) {
  return rejected([&] { plan_mla_decode(config); }, needles, {});
}

TEST(MlaPlan, ConfigFields) {
  MlaCase d(false);
  d.config.num_heads = 0;
  EXPECT_TRUE(plan_rejects(d.config, {"plan_mla_decode: config.num_heads", "> 0", "got 0"}));
  d.config.num_heads = 2;
  d.config.page_size = 0;
  EXPECT_TRUE(plan_rejects(d.config, {"config.page_size", ">= 1", "got 0"}));
  for (int page : {1, 2, 61, 69, 257, 576, 1 << 20}) {
    d.config.page_size = page;
    EXPECT_NO_THROW(plan_mla_decode(d.config)) << "page_size " << page;
  }
  d.config.page_size = 64;
  d.config.max_seq_len = 0;
  EXPECT_TRUE(plan_rejects(d.config, {"config.max_seq_len", "> 0", "got 0"}));
  d.config.max_seq_len = 10;
  d.config.topk = 8;
  EXPECT_TRUE(plan_rejects(d.config, {"config.topk", "0 for dense decode", "got 8"}));
  d.config.topk = 0;
  d.config.attn_sink = true;
  EXPECT_TRUE(plan_rejects(d.config, {"config.attn_sink", "false for dense decode", "got true"}));

  MlaCase s(true);
  s.config.topk = 0;
  EXPECT_TRUE(plan_rejects(s.config, {"config.topk", "> 0", "got 0"}));
  s.config.topk = 4;
  s.config.max_batch = -2;
  EXPECT_TRUE(plan_rejects(s.config, {"config.max_batch", "> 0", "got -2"}));
}

TEST(MlaPlan, KvFormat) {
  MlaCase d(false);
  d.config.kv_format = static_cast<MlaCacheFormat>(7);
  EXPECT_TRUE(plan_rejects(d.config, {"plan_mla_decode: config.kv_format",
                                      "kDefault, kBF16, kFP8E4M3, kFP8Sparse or kModel1", "got 7"}));
  for (const MlaCacheFormat f : {MlaCacheFormat::kDefault, MlaCacheFormat::kBF16,
                                 MlaCacheFormat::kFP8E4M3, MlaCacheFormat::kFP8Sparse}) {
    d.config.kv_format = f;
    EXPECT_NO_THROW(plan_mla_decode(d.config)) << mla_cache_format_name(f);
  }

  MlaCase s(true);
  s.config.kv_format = MlaCacheFormat::kBF16;
  EXPECT_TRUE(plan_rejects(s.config, {"config.kv_format", "kDefault, kFP8Sparse or kModel1 for sparse decode",
                                      "got kBF16 (bf16)"}));
  s.config.kv_format = MlaCacheFormat::kFP8E4M3;
  EXPECT_TRUE(plan_rejects(s.config, {"config.kv_format", "got kFP8E4M3 (fp8_e4m3)"}));
  s.config.kv_format = MlaCacheFormat::kFP8Sparse;
  EXPECT_NO_THROW(plan_mla_decode(s.config));
}

TEST(MlaPlan, CacheFormatNames) {
  EXPECT_STREQ(mla_cache_format_name(MlaCacheFormat::kDefault), "default");
  EXPECT_STREQ(mla_cache_format_name(MlaCacheFormat::kBF16), "bf16");
  EXPECT_STREQ(mla_cache_format_name(MlaCacheFormat::kFP8E4M3), "fp8_e4m3");
  EXPECT_STREQ(mla_cache_format_name(MlaCacheFormat::kFP8Sparse), "fp8_sparse");
  EXPECT_STREQ(mla_cache_format_name(static_cast<MlaCacheFormat>(9)), "?");
}

TEST(MlaPlan, DenseOnAMissingCudaDeviceIsRejected) {
  MlaCase d(false);
  d.config.device = Device::cuda(7);
  if (cuda::device_count() > 7) GTEST_SKIP() << "this machine has a cuda:7";
  EXPECT_TRUE(plan_rejects(d.config, {"plan_mla_decode: config.device", "got cuda:7"}));
  if (cuda::device_count() == 0) {
    EXPECT_TRUE(plan_rejects(d.config, {"cpu (no CUDA device is present)"}));
  }
}

TEST(MlaPlan, SparseOnAMissingCudaDeviceIsRejected) {
  MlaCase s(true);
  s.config.device = Device::cuda(7);
  if (cuda::device_count() > 7) GTEST_SKIP() << "this machine has a cuda:7";
  EXPECT_TRUE(plan_rejects(s.config, {"plan_mla_decode: config.device", "got cuda:7"}));
  if (cuda::device_count() == 0) {
    EXPECT_TRUE(plan_rejects(s.config, {"cpu (no CUDA device is present)"}));
  }
}

// ---------------------------------------------------------------- dense
class MlaDenseArgsTest : public ::testing::Test {
 protected:
  void SetUp() override { c.build(); }
  MlaCase c{false};
};

TEST_F(MlaDenseArgsTest, ValidCaseIsAccepted) {
  ASSERT_NO_THROW(mla_decode_dense(c.plan(), c.dense));
  EXPECT_FALSE(all_bytes_are(c.out, kPoison));
}
TEST_F(MlaDenseArgsTest, QDtype) {
  c.dense.q.dtype = DType::kFP16;
  EXPECT_TRUE(c.rejects({"mla_decode_dense: q:", "dtype bf16", "got fp16"}));
}
TEST_F(MlaDenseArgsTest, KvRank) {
  c.dense.kv_cache = view_as(c.kv, {5, 4, 576}, {2304, 576, 1});
  EXPECT_TRUE(c.rejects({"kv_cache", "rank 4", "got rank 3"}));
}
TEST_F(MlaDenseArgsTest, QHeadDim) {
  c.dense.q = view_as(c.q, {2, 1, 2, 512}, {1152, 1152, 576, 1});
  EXPECT_TRUE(c.rejects({"q: dim 3 (head_dim): expected 576", "got 512"}));
}
TEST_F(MlaDenseArgsTest, OutDimV) {
  HostTensor wide(DType::kBF16, {2, 1, 2, 576});
  wide.fill_bytes(kPoison);
  c.dense.out = wide.view();
  EXPECT_TRUE(c.rejects({"out: dim 3 (dim_v): expected 512", "got 576"}));
  EXPECT_TRUE(all_bytes_are(wide, kPoison));
}
TEST_F(MlaDenseArgsTest, KvHeads) {
  c.dense.kv_cache = view_as(c.kv, {5, 2, 2, 576}, {2304, 1152, 576, 1});
  EXPECT_TRUE(c.rejects({"kv_cache: dim 1 (page_size): expected 4", "got 2"}));
}
// A cache of one block never takes its block stride: any non-negative value is accepted (an
// engine's view of a one-block pool may carry one), and the output is the contiguous view's.
TEST(MlaDenseArgs, OneBlockCacheTakesAnyBlockStride) {
  MlaCase c(false);
  c.num_blocks = 1;
  c.max_blocks = 1;
  c.lens = {3, 4};
  c.build();
  ASSERT_NO_THROW(mla_decode_dense(c.plan(), c.dense));
  const HostTensor contiguous(c.out);
  for (const std::int64_t stride : {std::int64_t{4}, std::int64_t{0}, std::int64_t{1} << 40}) {
    c.out.fill_bytes(kPoison);
    c.dense.kv_cache.stride[0] = stride;
    ASSERT_NO_THROW(mla_decode_dense(c.plan(), c.dense)) << stride;
    EXPECT_TRUE(same_bytes(c.out, contiguous, static_cast<long long>(c.out.bytes()))) << stride;
  }
}
TEST_F(MlaDenseArgsTest, LastDimStride) {
  c.dense.q.stride[3] = 2;
  EXPECT_TRUE(c.rejects({"q:", "contiguous, stride 1", "got stride 2"}));
}
TEST_F(MlaDenseArgsTest, OverlappingOut) {
  c.dense.out.stride[2] = 0;
  EXPECT_TRUE(c.rejects({"out:", "must not overlap"}));
}
TEST_F(MlaDenseArgsTest, CudaTensor) {
  c.dense.kv_cache.device = Device::cuda(0);
  EXPECT_TRUE(c.rejects({"kv_cache", "expected device cpu (plan.config.device)", "got cuda:0"}));
  c.build();
  c.dense.cache_seqlens.device = Device::cuda(0);
  EXPECT_TRUE(c.rejects({"cache_seqlens", "expected device cpu", "got cuda:0"}));
}
TEST_F(MlaDenseArgsTest, NullBlockTable) {
  c.dense.block_table.data = nullptr;
  EXPECT_TRUE(c.rejects({"block_table", "non-null data pointer", "got nullptr"}));
}
TEST_F(MlaDenseArgsTest, MisalignedQ) {
  c.dense.q = view_as(c.q, {2, 1, 2, 576}, {1152, 1152, 576, 1}, 4);
  // 4 bytes in: natural (2-byte) alignment holds, the 16-byte row rule does not.
  EXPECT_TRUE(c.rejects({"q:", "aligned to 16 bytes", "4 bytes past"}));
}
TEST_F(MlaDenseArgsTest, NegativeSize) {
  c.dense.block_table.shape[1] = -3;
  EXPECT_TRUE(c.rejects({"block_table", "dim 1 size in 0..", "got -3"}));
}
TEST_F(MlaDenseArgsTest, NegativeSeqLen) {
  c.seqlens.data<std::int32_t>()[0] = -1;
  EXPECT_TRUE(c.rejects({"cache_seqlens[0]", ">= 0", "got -1"}));
}
TEST_F(MlaDenseArgsTest, SeqLenBeyondBlocks) {
  c.config.max_seq_len = 100;
  c.seqlens.data<std::int32_t>()[1] = 13;
  EXPECT_TRUE(c.rejects({"cache_seqlens[1]", "max_blocks * page_size = 3 * 4 = 12", "got 13"}));
}
TEST_F(MlaDenseArgsTest, SeqLenBeyondPlan) {
  c.config.max_seq_len = 8;
  EXPECT_TRUE(c.rejects({"cache_seqlens[1]", "plan.config.max_seq_len (8)", "got 9"}));
}
TEST_F(MlaDenseArgsTest, QLenAboveSeqLen) {
  c.q_len = 2;
  c.lens = {1, 9};
  c.build();
  EXPECT_TRUE(c.rejects({"cache_seqlens[0]", ">= q_len (2)", "got 1"}));
}
TEST_F(MlaDenseArgsTest, BatchAboveMax) {
  c.config.max_batch = 1;
  EXPECT_TRUE(c.rejects({"q: dim 0 (batch)", "0..1", "got 2"}));
}
TEST_F(MlaDenseArgsTest, QLenAboveMax) {
  c.config.max_q_len = 1;
  c.q_len = 2;
  c.build();
  EXPECT_TRUE(c.rejects({"q: dim 1 (q_len)", "1..1", "got 2"}));
}
TEST_F(MlaDenseArgsTest, BlockIdOutOfRange) {
  c.block_table.data<std::int32_t>()[1 * 3 + 2] = 5;
  EXPECT_TRUE(c.rejects({"block_table[1][2]", "block id in [0, 5)", "got 5"}));
}
TEST_F(MlaDenseArgsTest, LsePresenceFollowsPlan) {
  c.dense.lse = TensorView{};
  EXPECT_TRUE(c.rejects({"lse", "plan.config.lse is true", "got absent"}));
}
TEST_F(MlaDenseArgsTest, SoftmaxScale) {
  c.dense.softmax_scale = -1.f;
  EXPECT_TRUE(c.rejects({"softmax_scale", "finite value >= 0", "got -1"}));
}
TEST_F(MlaDenseArgsTest, SparsePlanForDenseCall) {
  MlaCase s(true);
  const MlaPlan plan = s.plan();
  const MlaDenseArgs a = c.dense;
  EXPECT_TRUE(rejected([&] { mla_decode_dense(plan, a); },
                       {"plan.config.sparse", "false (a plan made for dense decode)", "got true"},
                       {&c.out, &c.lse}));
}

TEST(MlaDenseRun, UniformAttentionAveragesLatentValues) {
  MlaCase c(false);
  c.build();
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, 0.f);
  mla_decode_dense(c.plan(), c.dense);
  const int h = c.config.num_heads, ps = c.config.page_size;
  for (int b = 0; b < c.batch; ++b) {
    for (int d = 0; d < kMlaDimV; d += 7) {
      double sum = 0;
      for (int t = 0; t < c.lens[b]; ++t) {
        const std::int64_t block = c.block_table.data<std::int32_t>()[b * c.max_blocks + t / ps];
        sum += c.kv.get((block * ps + t % ps) * kMlaDimQK + d);
      }
      for (int head = 0; head < h; ++head) {
        ASSERT_NEAR(c.out.get((b * h + head) * kMlaDimV + d), sum / c.lens[b], 0.03);
      }
    }
    EXPECT_NEAR(c.lse.data<float>()[b * h], std::log(c.lens[b]), 1e-5);
  }
}

// ---------------------------------------------------------------- dense cache formats
// A dense plan of each kv_format over the fixture's cache, quantized where the format asks.
class MlaDenseFormatTest : public ::testing::TestWithParam<MlaCacheFormat> {
 protected:
  void SetUp() override {
    c.config.kv_format = GetParam();
    c.build();
  }
  MlaCase c{false};
};

std::string format_param_name(const ::testing::TestParamInfo<MlaCacheFormat>& info) {
  return mla_cache_format_name(info.param);
}

// The fixture's values (integers -5..5) are exact in e4m3 under the power-of-two scales the
// packers choose, so every format holds the same real values and gives the bf16 cache's bytes.
TEST_P(MlaDenseFormatTest, SameValuesGiveTheBf16CachesBytes) {
  ASSERT_NO_THROW(mla_decode_dense(c.plan(), c.dense));
  MlaCase ref(false);
  ref.build();
  mla_decode_dense(ref.plan(), ref.dense);
  EXPECT_EQ(0, std::memcmp(c.out.raw(), ref.out.raw(), c.out.bytes()));
  EXPECT_EQ(0, std::memcmp(c.lse.raw(), ref.lse.raw(), c.lse.bytes()));
}

TEST_P(MlaDenseFormatTest, CacheOfAnotherFormatIsRejected) {
  const MlaCacheFormat f = GetParam();
  if (f == MlaCacheFormat::kFP8E4M3) {
    c.dense.kv_cache = c.kv_bf16.view();
    EXPECT_TRUE(c.rejects({"mla_decode_dense: kv_cache", "dtype fp8_e4m3",
                           "plan.config.kv_format kFP8E4M3", "got bf16"}));
    HostTensor wide(DType::kFP8E4M3, {5, 4, 1, 656});
    c.dense.kv_cache = wide.view();
    EXPECT_TRUE(c.rejects({"kv_cache: dim 3 (head_dim): expected 576", "got 656"}));
  } else if (f == MlaCacheFormat::kFP8Sparse) {
    c.dense.kv_cache = c.kv_bf16.view();
    EXPECT_TRUE(c.rejects({"kv_cache", "dtype uint8", "plan.config.kv_format kFP8Sparse",
                           "got bf16"}));
    HostTensor narrow(DType::kUINT8, {5, 4, 1, 576});
    c.dense.kv_cache = narrow.view();
    EXPECT_TRUE(c.rejects({"kv_cache: dim 3 (token_bytes): expected 656", "got 576"}));
  } else {
    HostTensor tokens(DType::kUINT8, {5, 4, 1, 656});
    c.dense.kv_cache = tokens.view();
    EXPECT_TRUE(c.rejects({"kv_cache", "dtype bf16",
                           f == MlaCacheFormat::kBF16 ? "plan.config.kv_format kBF16"
                                                      : "kDefault: bf16 for dense decode",
                           "got uint8"}));
  }
}

TEST_P(MlaDenseFormatTest, KvScale) {
  const bool scaled = GetParam() == MlaCacheFormat::kFP8E4M3;
  for (const float bad : {0.f, -0.5f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 2.f}) {
    c.dense.kv_scale = bad;
    if (scaled && bad == 2.f) {
      EXPECT_NO_THROW(mla_decode_dense(c.plan(), c.dense));
      continue;
    }
    const std::string got = "got " + api::float_string(bad);
    if (scaled) {
      EXPECT_TRUE(c.rejects({"mla_decode_dense: kv_scale", "a finite value > 0", got}));
    } else {
      EXPECT_TRUE(c.rejects({"mla_decode_dense: kv_scale", "expected 1 (only a kFP8E4M3 cache has a "
                             "per-cache scale; plan.config.kv_format is k", got}));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MlaDenseFormatTest,
                         ::testing::Values(MlaCacheFormat::kDefault, MlaCacheFormat::kBF16,
                                           MlaCacheFormat::kFP8E4M3, MlaCacheFormat::kFP8Sparse),
                         format_param_name);

// kv_scale multiplies every real value of an e4m3 cache: doubling it is the bf16 cache of doubled
// values (exact: powers of two), so the output doubles and the LSE follows the doubled logits.
TEST(MlaDenseRun, KvScaleScalesTheRealValues) {
  MlaCase e(false);
  e.config.kv_format = MlaCacheFormat::kFP8E4M3;
  e.build();
  e.dense.kv_scale *= 2.f;
  mla_decode_dense(e.plan(), e.dense);
  MlaCase ref(false);
  ref.build();
  for (std::int64_t i = 0; i < ref.kv.numel(); ++i) ref.kv.set(i, 2.f * ref.kv.get(i));
  mla_decode_dense(ref.plan(), ref.dense);
  EXPECT_EQ(0, std::memcmp(e.out.raw(), ref.out.raw(), e.out.bytes()));
  EXPECT_EQ(0, std::memcmp(e.lse.raw(), ref.lse.raw(), e.lse.bytes()));
}

// reuse_schedule is a CUDA run's option: the CPU backend ignores it.
TEST(MlaDenseRun, ReuseScheduleIsIgnoredOnTheCpu) {
  MlaCase a(false), b(false);
  a.build();
  b.build();
  b.dense.reuse_schedule = true;
  mla_decode_dense(a.plan(), a.dense);
  mla_decode_dense(b.plan(), b.dense);
  EXPECT_EQ(0, std::memcmp(a.out.raw(), b.out.raw(), a.out.bytes()));
  EXPECT_NO_THROW(check_mla_run(b.plan(), nullptr, nullptr));
}

// ---------------------------------------------------------------- sparse
class MlaSparseArgsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c.config.topk_length = true;
    c.config.attn_sink = true;
    c.build();
  }
  MlaCase c{true};
};

TEST_F(MlaSparseArgsTest, ValidCaseIsAccepted) {
  ASSERT_NO_THROW(mla_decode_sparse(c.plan(), c.sparse));
  EXPECT_FALSE(all_bytes_are(c.out, kPoison));
}
TEST_F(MlaSparseArgsTest, KvDtype) {
  c.sparse.kv_cache.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(c.rejects({"mla_decode_sparse: kv_cache", "dtype uint8", "got fp8_e4m3"}));
}
TEST_F(MlaSparseArgsTest, KvTokenBytes) {
  c.sparse.kv_cache = view_as(c.kv, {5, 4, 1, 576}, {2624, 656, 656, 1});
  EXPECT_TRUE(c.rejects({"kv_cache: dim 3 (token_bytes): expected 656", "got 576"}));
}
TEST_F(MlaSparseArgsTest, MisalignedKvSlotStride) {
  HostTensor big(DType::kUINT8, {5 * 4 * 664});
  c.sparse.kv_cache = view_as(big, {5, 4, 1, 656}, {4 * 664, 660, 656, 1});
  EXPECT_TRUE(c.rejects({"kv_cache", "stride of dim 1 a multiple of 16 bytes", "660 bytes"}));
}
TEST_F(MlaSparseArgsTest, IndicesTopk) {
  HostTensor wrong(DType::kINT32, {2, 1, 8});
  c.sparse.indices = wrong.view();
  EXPECT_TRUE(c.rejects({"indices: dim 2 (topk): expected 4", "plan.config.topk", "got 8"}));
}
TEST_F(MlaSparseArgsTest, IndexOutOfRange) {
  c.indices.data<std::int32_t>()[1] = 20;  // 5 blocks * 4 = 20 tokens
  EXPECT_TRUE(c.rejects({"indices[0][0][1]", "-1 (skip) or a token id in [0, 20)", "got 20"}));
}
TEST_F(MlaSparseArgsTest, NegativeIndexOtherThanMinusOne) {
  c.indices.data<std::int32_t>()[0] = -2;
  EXPECT_TRUE(c.rejects({"indices[0][0][0]", "[0, 20)", "got -2"}));
}
TEST_F(MlaSparseArgsTest, IndicesPastTopkLengthAreNotChecked) {
  // Request 1 counts only its first 3 indices (topk_length = topk - 1).
  c.indices.data<std::int32_t>()[4 + 3] = 1 << 30;
  ASSERT_NO_THROW(mla_decode_sparse(c.plan(), c.sparse));
}
TEST_F(MlaSparseArgsTest, TopkLengthOutOfRange) {
  c.topk_length.data<std::int32_t>()[1] = 5;
  EXPECT_TRUE(c.rejects({"topk_length[1]", "0..4", "got 5"}));
}
TEST_F(MlaSparseArgsTest, AttnSinkShape) {
  HostTensor wrong(DType::kFP32, {3});
  c.sparse.attn_sink = wrong.view();
  EXPECT_TRUE(c.rejects({"attn_sink: dim 0 (num_heads): expected 2", "got 3"}));
}
TEST_F(MlaSparseArgsTest, AttnSinkAbsentButPlanned) {
  c.sparse.attn_sink = TensorView{};
  EXPECT_TRUE(c.rejects({"attn_sink", "plan.config.attn_sink is true", "got absent"}));
}
TEST_F(MlaSparseArgsTest, TopkLengthGivenButNotPlanned) {
  c.config.topk_length = false;
  EXPECT_TRUE(c.rejects({"topk_length", "absent (plan.config.topk_length is false)"}));
}
TEST_F(MlaSparseArgsTest, IndicesRank) {
  c.sparse.indices = view_as(c.indices, {2, 4}, {4, 1});
  EXPECT_TRUE(c.rejects({"indices", "rank 3 [batch, q_len, topk]", "got rank 2 [2, 4]"}));
}
TEST_F(MlaSparseArgsTest, NegativeTopkLength) {
  c.topk_length.data<std::int32_t>()[0] = -1;
  EXPECT_TRUE(c.rejects({"topk_length[0]", "0..4", "got -1"}));
}
TEST_F(MlaSparseArgsTest, NullIndices) {
  c.sparse.indices.data = nullptr;
  EXPECT_TRUE(c.rejects({"indices", "non-null", "got nullptr"}));
}
TEST_F(MlaSparseArgsTest, CudaOut) {
  c.sparse.out.device = Device::cuda(0);
  EXPECT_TRUE(c.rejects({"out:", "expected device cpu", "got cuda:0"}));
}

TEST(MlaSparseRun, UniformAttentionAveragesSelectedTokensWithSink) {
  MlaCase c(true);
  c.config.topk_length = true;
  c.config.attn_sink = true;
  c.build();
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, 0.f);
  mla_decode_sparse(c.plan(), c.sparse);

  HostTensor plain(DType::kFP32, {c.num_blocks, c.config.page_size, 1, kMlaDimQK});
  unpack_mla_fp8(c.kv.view(), plain.view());
  const int h = c.config.num_heads, topk = c.config.topk;
  for (int b = 0; b < c.batch; ++b) {
    const int used = c.topk_length.data<std::int32_t>()[b];
    std::vector<int> ids;
    for (int k = 0; k < used; ++k) {
      const int id = c.indices.data<std::int32_t>()[b * topk + k];
      if (id >= 0) ids.push_back(id);
    }
    ASSERT_FALSE(ids.empty());
    for (int head = 0; head < h; ++head) {
      // Every logit is 0: weights 1 / (n + e^sink); LSE = log(n) (the sink excluded).
      const double denom = ids.size() + std::exp(double(c.attn_sink.data<float>()[head]));
      for (int d = 0; d < kMlaDimV; d += 5) {
        double sum = 0;
        for (int id : ids) sum += plain.data<float>()[std::int64_t(id) * kMlaDimQK + d];
        ASSERT_NEAR(c.out.get((b * h + head) * kMlaDimV + d), sum / denom, 0.03) << b << " " << d;
      }
      EXPECT_NEAR(c.lse.data<float>()[b * h + head], std::log(double(ids.size())), 1e-5);
    }
  }
}

}  // namespace
}  // namespace deca::test
