// MODEL1 sparse decode (MlaCacheFormat::kModel1, the second cache) through the public API: every
// config and argument error names the function, the argument, the one expected value and what
// came, before anything is written; valid calls run on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "api/api_fixtures.hpp"
#include "common/model1_case.hpp"
#include "common/test_seed.hpp"

namespace deca::test {
namespace {

::testing::AssertionResult plan_rejects(const MlaConfig& config,
                                        std::initializer_list<std::string> needles) {
  return rejected([&] { plan_mla_decode(config); }, needles, {});
}

// heads 2, page 4 x 5 blocks, topk 4; the second cache: page 2 x 40 blocks, extra_topk 8; both
// lengths and the sink given.
Model1Spec small_spec() {
  Model1Spec s;
  s.num_heads = 2;
  s.page_size = 4;
  s.blocks = 5;
  s.topk = 4;
  s.extra_topk = 8;
  s.topk_length = true;
  s.extra_topk_length = true;
  s.attn_sink = true;
  s.skip = 0.f;
  s.duplicates = 0;
  return s;
}

TEST(Model1Plan, ConfigFields) {
  auto rng = make_rng(81);
  Model1Case c = build_model1_case(small_spec(), rng);
  EXPECT_NO_THROW(plan_mla_decode(c.config));
  EXPECT_STREQ(mla_cache_format_name(MlaCacheFormat::kModel1), "model1");

  MlaConfig d = c.config;
  d.sparse = false;
  d.topk = 0;
  d.max_seq_len = 8;
  d.attn_sink = d.topk_length = false;
  d.extra_topk = 0;
  d.extra_topk_length = false;
  EXPECT_TRUE(plan_rejects(d, {"plan_mla_decode: config.kv_format",
                               "kModel1 is read by sparse decode only", "got kModel1 (model1)"}));
  d.kv_format = MlaCacheFormat::kBF16;
  d.extra_topk = 8;
  EXPECT_TRUE(plan_rejects(d, {"config.extra_topk", "kModel1 sparse decode only; sparse is false",
                               "got 8"}));

  MlaConfig v = c.config;
  v.kv_format = MlaCacheFormat::kFP8Sparse;
  EXPECT_TRUE(plan_rejects(v, {"config.extra_topk", "expected 0",
                               "kv_format is kFP8Sparse (fp8_sparse)", "got 8"}));
  v.extra_topk = 0;
  EXPECT_TRUE(plan_rejects(v, {"config.extra_topk_length",
                               "false without a second cache (extra_topk is 0)", "got true"}));

  MlaConfig m = c.config;
  m.extra_topk = -1;
  EXPECT_TRUE(plan_rejects(m, {"config.extra_topk", ">= 0", "got -1"}));
  m.extra_topk = 8;
  m.extra_page_size = 0;
  EXPECT_TRUE(plan_rejects(m, {"config.extra_page_size", ">= 1", "got 0"}));
  m.extra_topk = 0;
  m.extra_topk_length = false;
  EXPECT_NO_THROW(plan_mla_decode(m)) << "extra_page_size is not read without a second cache";
}

class Model1ArgsTest : public ::testing::Test {
 protected:
  void SetUp() override { c = build_model1_case(small_spec(), rng); }
  ::testing::AssertionResult rejects(std::initializer_list<std::string> needles) {
    return rejected([&] { mla_decode_sparse(plan_mla_decode(c.config), c.args); }, needles,
                    {&c.out, &c.lse});
  }
  std::mt19937_64 rng = make_rng(82);
  Model1Case c;
};

TEST_F(Model1ArgsTest, ValidCaseIsAccepted) {
  ASSERT_NO_THROW(mla_decode_sparse(plan_mla_decode(c.config), c.args));
  EXPECT_FALSE(all_bytes_are(c.out, kPoison));
}
TEST_F(Model1ArgsTest, QHeadDim) {
  HostTensor q(DType::kBF16, {2, 1, 2, 576});
  c.args.q = q.view();
  EXPECT_TRUE(rejects({"mla_decode_sparse: q: dim 3 (head_dim): expected 512",
                       "plan.config.kv_format kModel1", "got 576"}));
}
TEST_F(Model1ArgsTest, V32PlanRefusesA512DimQ) {
  c.config.kv_format = MlaCacheFormat::kFP8Sparse;
  c.config.extra_topk = 0;
  c.config.extra_topk_length = false;
  EXPECT_TRUE(rejects({"q: dim 3 (head_dim): expected 576", "got 512"}));
}
TEST_F(Model1ArgsTest, KvDtype) {
  c.args.kv_cache.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(rejects({"kv_cache", "dtype uint8", "584-byte MODEL1 token", "got fp8_e4m3"}));
}
TEST_F(Model1ArgsTest, KvTokenBytes) {
  c.args.kv_cache.shape[3] = 656;
  EXPECT_TRUE(rejects({"kv_cache: dim 3 (token_bytes): expected 584", "got 656"}));
}
TEST_F(Model1ArgsTest, KvPageSize) {
  c.config.page_size = 8;
  EXPECT_TRUE(rejects({"kv_cache: dim 1 (page_size): expected 8", "plan.config.page_size",
                       "got 4"}));
}
TEST_F(Model1ArgsTest, KvSlotStride) {
  c.args.kv_cache.stride[1] = 576;
  EXPECT_TRUE(rejects({"kv_cache", "stride of dim 1 (page_size) 584 bytes", "got 576 bytes"}));
}
TEST_F(Model1ArgsTest, KvBlockStrideBelowThePage) {
  c.args.kv_cache.stride[0] = 4 * 584;  // 2336 < 2880 = mla_model1_page_bytes(4)
  EXPECT_TRUE(rejects({"kv_cache", "stride of dim 0 (num_blocks) >= 2880 bytes",
                       "mla_model1_page_bytes(4)", "got 2336 bytes"}));
}
TEST_F(Model1ArgsTest, KvBlockStrideMisaligned) {
  c.args.kv_cache.shape[0] = 4;
  c.args.kv_cache.stride[0] = 2888;
  EXPECT_TRUE(rejects({"kv_cache", "stride of dim 0 a multiple of 16 bytes", "2888 bytes"}));
}
TEST_F(Model1ArgsTest, KvDataMisaligned) {
  c.args.kv_cache.shape[0] = 4;
  c.args.kv_cache.data = static_cast<std::uint8_t*>(c.args.kv_cache.data) + 8;
  EXPECT_TRUE(rejects({"kv_cache", "a data pointer aligned to 16 bytes"}));
}
TEST_F(Model1ArgsTest, ExtraCacheAbsentButPlanned) {
  c.args.extra_kv_cache = TensorView{};
  EXPECT_TRUE(rejects({"extra_kv_cache", "plan.config.extra_topk > 0 is true", "got absent"}));
}
TEST_F(Model1ArgsTest, ExtraIndicesAbsentButPlanned) {
  c.args.extra_indices = TensorView{};
  EXPECT_TRUE(rejects({"extra_indices", "plan.config.extra_topk > 0 is true", "got absent"}));
}
TEST_F(Model1ArgsTest, ExtraArgumentsWithoutASecondCache) {
  c.config.extra_topk = 0;
  c.config.extra_topk_length = false;
  EXPECT_TRUE(rejects({"extra_kv_cache", "absent (plan.config.extra_topk > 0 is false)"}));
  c.args.extra_kv_cache = TensorView{};
  EXPECT_TRUE(rejects({"extra_indices", "absent (plan.config.extra_topk > 0 is false)"}));
  c.args.extra_indices = TensorView{};
  EXPECT_TRUE(rejects({"extra_topk_length", "absent (plan.config.extra_topk_length is false)"}));
  c.args.extra_topk_length = TensorView{};
  EXPECT_NO_THROW(mla_decode_sparse(plan_mla_decode(c.config), c.args));
}
TEST_F(Model1ArgsTest, ExtraTopkLengthPresenceFollowsPlan) {
  c.args.extra_topk_length = TensorView{};
  EXPECT_TRUE(rejects({"extra_topk_length", "plan.config.extra_topk_length is true", "got absent"}));
}
TEST_F(Model1ArgsTest, ExtraPageSize) {
  c.config.extra_page_size = 4;
  EXPECT_TRUE(rejects({"extra_kv_cache: dim 1 (page_size): expected 4",
                       "plan.config.extra_page_size", "got 2"}));
}
TEST_F(Model1ArgsTest, ExtraCacheLayout) {
  c.args.extra_kv_cache.stride[0] = 1168;  // 2 * 584 < 1728
  EXPECT_TRUE(rejects({"extra_kv_cache", "stride of dim 0 (num_blocks) >= 1728 bytes",
                       "got 1168 bytes"}));
}
TEST_F(Model1ArgsTest, ExtraCacheDevice) {
  c.args.extra_kv_cache.device = Device::cuda(0);
  EXPECT_TRUE(rejects({"extra_kv_cache:", "expected device cpu", "got cuda:0"}));
}
TEST_F(Model1ArgsTest, ExtraIndicesShape) {
  c.args.extra_indices.shape[2] = 4;
  EXPECT_TRUE(rejects({"extra_indices: dim 2 (extra_topk): expected 8", "plan.config.extra_topk",
                       "got 4"}));
  c.args.extra_indices.shape[2] = 8;
  c.args.extra_indices.shape[0] = 1;
  EXPECT_TRUE(rejects({"extra_indices: dim 0 (batch): expected 2", "q's batch", "got 1"}));
  c.args.extra_indices.shape[0] = 2;
  c.args.extra_indices.rank = 2;
  EXPECT_TRUE(rejects({"extra_indices", "rank 3 [batch, q_len, extra_topk]", "got rank 2"}));
}
TEST_F(Model1ArgsTest, ExtraIndicesDtype) {
  c.args.extra_indices.dtype = DType::kUINT32;
  EXPECT_TRUE(rejects({"extra_indices", "dtype int32", "got uint32"}));
}
TEST_F(Model1ArgsTest, ExtraIndexOutOfRange) {
  c.extra_topk_length.data<std::int32_t>()[0] = 8;
  c.extra_indices.data<std::int32_t>()[1] = 80;  // 40 blocks * 2 = 80 tokens
  EXPECT_TRUE(rejects({"extra_indices[0][0][1]",
                       "-1 (skip) or a token id in [0, 80) (extra_num_blocks 40 * extra_page_size 2)",
                       "got 80"}));
  c.extra_indices.data<std::int32_t>()[1] = -3;
  EXPECT_TRUE(rejects({"extra_indices[0][0][1]", "got -3"}));
}
TEST_F(Model1ArgsTest, ExtraIndicesPastTheirLengthAreNotChecked) {
  c.extra_topk_length.data<std::int32_t>()[0] = 2;
  c.extra_indices.data<std::int32_t>()[5] = 1 << 30;
  EXPECT_NO_THROW(mla_decode_sparse(plan_mla_decode(c.config), c.args));
}
TEST_F(Model1ArgsTest, ExtraTopkLengthRange) {
  c.extra_topk_length.data<std::int32_t>()[1] = 9;
  EXPECT_TRUE(rejects({"extra_topk_length[1]", "0..8 (plan.config.extra_topk)", "got 9"}));
  c.extra_topk_length.data<std::int32_t>()[1] = -1;
  EXPECT_TRUE(rejects({"extra_topk_length[1]", "got -1"}));
}
TEST_F(Model1ArgsTest, ExtraTopkLengthShape) {
  c.args.extra_topk_length.shape[0] = 3;
  EXPECT_TRUE(rejects({"extra_topk_length: dim 0 (batch): expected 2", "got 3"}));
}
TEST_F(Model1ArgsTest, FirstIndexOutOfRange) {
  c.topk_length.data<std::int32_t>()[1] = 4;
  c.indices.data<std::int32_t>()[4 + 2] = 20;  // 5 blocks * 4
  EXPECT_TRUE(rejects({"indices[1][0][2]", "[0, 20) (num_blocks 5 * page_size 4)", "got 20"}));
}
TEST_F(Model1ArgsTest, OutOverlapsTheExtraCache) {
  c.args.out.data = c.extra.base();
  EXPECT_TRUE(rejected([&] { mla_decode_sparse(plan_mla_decode(c.config), c.args); },
                       {"out", "shares no byte with extra_kv_cache"}, {&c.lse}));
}
TEST_F(Model1ArgsTest, SoftmaxScale) {
  c.args.softmax_scale = -1.f;
  EXPECT_TRUE(rejects({"softmax_scale", "a finite value >= 0 (0 = 1 / sqrt(512))", "got -1"}));
}

}  // namespace
}  // namespace deca::test
