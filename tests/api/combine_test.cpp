// combine through the public API: validation before any write, and the merge it runs.
#include <gtest/gtest.h>

#include <cmath>

#include "api/api_fixtures.hpp"
#include "cuda/backend.hpp"

namespace deca::test {
namespace {

class CombineArgsTest : public ::testing::Test {
 protected:
  void SetUp() override { c.build(); }
  CombineCase c;
};

TEST_F(CombineArgsTest, PartialOutDtype) {
  c.args.partial_out.dtype = DType::kBF16;
  EXPECT_TRUE(c.rejects({"combine: partial_out", "dtype fp32", "got bf16"}));
}
TEST_F(CombineArgsTest, OutDtype) {
  c.args.out.dtype = DType::kINT8;
  EXPECT_TRUE(c.rejects({"out:", "dtype bf16 | fp16 | fp32", "got int8"}));
}
TEST_F(CombineArgsTest, PartialLseRank) {
  c.args.partial_lse = view_as(c.partial_lse, {3, 2, 2}, {4, 2, 1});
  EXPECT_TRUE(c.rejects({"partial_lse", "rank 4", "got rank 3"}));
}
TEST_F(CombineArgsTest, PartialLseSplits) {
  c.args.partial_lse = view_as(c.partial_lse, {2, 2, 1, 2}, {4, 2, 2, 1});
  EXPECT_TRUE(c.rejects({"partial_lse: dim 0 (num_splits): expected 3", "got 2"}));
}
TEST_F(CombineArgsTest, OutShape) {
  HostTensor wrong(DType::kFP32, {2, 1, 2, 8});
  wrong.fill_bytes(kPoison);
  c.args.out = wrong.view();
  EXPECT_TRUE(c.rejects({"out: dim 3 (dim_v): expected 16", "got 8"}));
  EXPECT_TRUE(all_bytes_are(wrong, kPoison));
}
TEST_F(CombineArgsTest, ZeroSplits) {
  c.args.partial_out.shape[0] = 0;
  EXPECT_TRUE(c.rejects({"partial_out: dim 0 (num_splits)", "1..", "got 0"}));
}
TEST_F(CombineArgsTest, NegativeSize) {
  c.args.partial_out.shape[2] = -1;
  EXPECT_TRUE(c.rejects({"partial_out", "size in 0..", "got -1"}));
}
TEST_F(CombineArgsTest, LastDimStride) {
  c.args.partial_out.stride[4] = 2;
  EXPECT_TRUE(c.rejects({"partial_out", "stride 1", "got stride 2"}));
}
TEST_F(CombineArgsTest, OverlappingLse) {
  c.args.lse.stride[0] = 1;
  EXPECT_TRUE(c.rejects({"lse:", "must not overlap"}));
}
TEST_F(CombineArgsTest, CudaTensor) {
  c.args.partial_lse.device = Device::cuda(0);
  EXPECT_TRUE(c.rejects({"partial_lse", "expected device cpu",
                         "every tensor on partial_out's device", "got cuda:0"}));
}
TEST_F(CombineArgsTest, CudaDeviceThatIsNotThere) {
  // Every tensor claims cuda:7; with fewer devices (or none, as in CI) the first check names it.
  for (TensorView* t : {&c.args.partial_out, &c.args.partial_lse, &c.args.out, &c.args.lse}) {
    t->device = Device::cuda(7);
  }
  if (cuda::device_count() > 7) GTEST_SKIP() << "this machine has a cuda:7";
  EXPECT_TRUE(c.rejects({"combine: partial_out", "a tensor on cpu", "got a tensor on cuda:7"}));
}
TEST_F(CombineArgsTest, NullOut) {
  c.args.out.data = nullptr;
  EXPECT_TRUE(c.rejects({"out:", "non-null", "got nullptr"}));
}
TEST_F(CombineArgsTest, MisalignedOut) {
  c.args.out = view_as(c.out, {2, 1, 2, 8}, {16, 16, 8, 1}, 2);
  EXPECT_TRUE(c.rejects({"out:", "aligned to 4 bytes", "2 bytes past"}));
}
TEST_F(CombineArgsTest, SinkShape) {
  HostTensor wrong(DType::kFP32, {3});
  c.args.attn_sink = wrong.view();
  EXPECT_TRUE(c.rejects({"attn_sink: dim 0 (num_heads): expected 2", "got 3"}));
}

// out = sum_i exp(lse_i) * partial_i / (sum_i exp(lse_i) + exp(sink)); lse = log(sum_i exp(lse_i)).
void expect_merged(const CombineCase& c, bool with_sink) {
  for (int r = 0; r < c.batch * c.q_len * c.heads; ++r) {
    double z = 0;
    for (int s = 0; s < c.splits; ++s)
      z += std::exp(double(c.partial_lse.data<float>()[s * 4 + r]));
    const double denom =
        z + (with_sink ? std::exp(double(c.sink.data<float>()[r % c.heads])) : 0.0);
    for (int d = 0; d < c.dim_v; ++d) {
      double num = 0;
      for (int s = 0; s < c.splits; ++s) {
        num += std::exp(double(c.partial_lse.data<float>()[s * 4 + r])) *
               c.partial_out.data<float>()[(s * 4 + r) * c.dim_v + d];
      }
      ASSERT_NEAR(c.out.get(r * c.dim_v + d), num / denom, 1e-4) << "row " << r << " d " << d;
    }
    EXPECT_NEAR(c.lse.data<float>()[r], std::log(z), 1e-5);
  }
}

TEST(CombineRun, MergesByLse) {
  CombineCase c;
  c.build();
  combine(c.args);
  expect_merged(c, false);
}

TEST(CombineRun, MergesWithSink) {
  CombineCase c;
  c.build();
  c.args.attn_sink = c.sink.view();
  combine(c.args);
  expect_merged(c, true);
}

}  // namespace
}  // namespace deca::test
