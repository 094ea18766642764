// gqa_decode rejects every malformed argument with a message naming the argument, the expected
// and the actual value, before writing anything (outputs are poisoned and checked).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "api/api_fixtures.hpp"

namespace deca::test {
namespace {

class GqaArgs : public ::testing::Test {
 protected:
  void SetUp() override { c.build(); }
  GqaCase c;
};

TEST_F(GqaArgs, ValidCaseIsAccepted) {
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
  EXPECT_FALSE(all_bytes_are(c.out, kPoison));
}

// --- dtype ---
TEST_F(GqaArgs, QDtype) {
  c.args.q.dtype = DType::kFP16;
  EXPECT_TRUE(c.rejects({"gqa_decode: q:", "dtype bf16", "plan.config.q_dtype", "got fp16"}));
}
TEST_F(GqaArgs, KCacheDtype) {
  c.args.k_cache.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(c.rejects({"k_cache", "dtype bf16", "plan.config.kv_dtype", "got fp8_e4m3"}));
}
TEST_F(GqaArgs, OutDtypeMustMatchPlan) {
  c.args.out.dtype = DType::kFP16;
  EXPECT_TRUE(c.rejects({"out:", "dtype bf16", "plan.config.out_dtype", "got fp16"}));
}
TEST_F(GqaArgs, PageTableDtype) {
  c.args.page_table.dtype = DType::kUINT32;
  EXPECT_TRUE(c.rejects({"page_table", "dtype int32", "got uint32"}));
}
TEST_F(GqaArgs, LseDtype) {
  c.args.lse.dtype = DType::kBF16;
  EXPECT_TRUE(c.rejects({"lse", "dtype fp32", "got bf16"}));
}

// --- rank ---
TEST_F(GqaArgs, QRank) {
  c.args.q = view_as(c.q, {2, 4, 32}, {128, 32, 1});
  EXPECT_TRUE(c.rejects({"q:", "rank 4", "got rank 3 [2, 4, 32]"}));
}
TEST_F(GqaArgs, SeqLensRank) {
  c.args.seq_lens = view_as(c.seq_lens, {2, 1}, {1, 1});
  EXPECT_TRUE(c.rejects({"seq_lens", "rank 1 [batch]", "got rank 2"}));
}

// --- shape ---
TEST_F(GqaArgs, QNumHeads) {
  c.args.q = view_as(c.q, {2, 1, 2, 32}, {128, 128, 32, 1});
  EXPECT_TRUE(c.rejects({"q: dim 2 (num_q_heads): expected 4", "got 2"}));
}
TEST_F(GqaArgs, KCacheHeadDim) {
  c.args.k_cache = view_as(c.k, {6, 4, 2, 16}, {256, 64, 32, 1});
  EXPECT_TRUE(c.rejects({"k_cache: dim 3 (head_dim): expected 32", "got 16"}));
}
TEST_F(GqaArgs, KCachePageSize) {
  c.args.k_cache = view_as(c.k, {6, 2, 2, 32}, {256, 64, 32, 1});
  EXPECT_TRUE(c.rejects({"k_cache: dim 1 (page_size): expected 4", "got 2"}));
}
TEST_F(GqaArgs, HndLayoutDimsAreNamed) {
  c.config.layout = KvLayout::kHND;
  c.build();
  c.args.v_cache = view_as(c.v, {6, 1, 4, 32}, {256, 128, 32, 1});
  EXPECT_TRUE(c.rejects({"v_cache: dim 1 (num_kv_heads): expected 2", "got 1"}));
}
TEST_F(GqaArgs, VCacheNumPagesDiffersFromK) {
  c.args.v_cache = view_as(c.v, {5, 4, 2, 32}, {256, 64, 32, 1});
  EXPECT_TRUE(c.rejects({"v_cache: dim 0 (num_pages): expected 6", "got 5"}));
}
TEST_F(GqaArgs, OutQLen) {
  HostTensor other(DType::kBF16, {2, 2, 4, 32});
  other.fill_bytes(kPoison);
  c.args.out = other.view();
  EXPECT_TRUE(c.rejects({"out: dim 1 (q_len): expected 1", "got 2"}));
  EXPECT_TRUE(all_bytes_are(other, kPoison));
}
TEST_F(GqaArgs, PageTableBatch) {
  c.args.page_table = view_as(c.page_table, {1, 4}, {4, 1});
  EXPECT_TRUE(c.rejects({"page_table: dim 0 (batch): expected 2", "got 1"}));
}
TEST_F(GqaArgs, LseShape) {
  c.args.lse = view_as(c.lse, {2, 1, 3}, {4, 4, 1});
  EXPECT_TRUE(c.rejects({"lse: dim 2 (num_q_heads): expected 4", "got 3"}));
}

// --- strides ---
TEST_F(GqaArgs, LastDimNotContiguous) {
  c.args.q = view_as(c.q, {2, 1, 4, 16}, {128, 128, 32, 2});
  c.config.head_dim = 16;  // so that only the stride is wrong
  EXPECT_TRUE(c.rejects({"q:", "last dim (3) contiguous, stride 1", "got stride 2"}));
}
TEST_F(GqaArgs, NegativeStride) {
  c.args.k_cache.stride[0] = -256;
  EXPECT_TRUE(c.rejects({"k_cache", "a non-negative stride for dim 0", "got stride -256"}));
}
TEST_F(GqaArgs, OverlappingOutput) {
  c.args.out = view_as(c.out, {2, 1, 4, 32}, {32, 32, 0, 1});
  EXPECT_TRUE(c.rejects({"out:", "must not overlap", "stride 0 of dim 2"}));
}
TEST_F(GqaArgs, OverlappingLse) {
  c.args.lse = view_as(c.lse, {2, 1, 4}, {2, 4, 1});
  EXPECT_TRUE(c.rejects({"lse:", "must not overlap", "shape [2, 1, 4]"}));
}
TEST_F(GqaArgs, SharedKvAllocationIsAllowed) {
  // K and V as two views of one [num_pages, 2, page_size, heads, dim] allocation.
  HostTensor kv(DType::kBF16, {6, 2, 4, 2, 32});
  for (std::int64_t i = 0; i < kv.numel(); ++i) kv.set(i, 0.f);
  c.args.k_cache = view_as(kv, {6, 4, 2, 32}, {512, 64, 32, 1});
  c.args.v_cache = view_as(kv, {6, 4, 2, 32}, {512, 64, 32, 1}, 256 * 2);
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
}

// --- device ---
TEST_F(GqaArgs, TensorOnWrongDevice) {
  c.args.k_cache.device = Device::cuda(0);
  EXPECT_TRUE(c.rejects({"k_cache", "device cpu", "plan.config.device", "got cuda:0"}));
}
TEST_F(GqaArgs, OutOnWrongDevice) {
  c.args.out.device = Device::cuda(1);
  EXPECT_TRUE(c.rejects({"out:", "device cpu", "got cuda:1"}));
}

// --- sizes ---
TEST_F(GqaArgs, NegativeSize) {
  c.args.q.shape[1] = -1;
  EXPECT_TRUE(c.rejects({"q:", "dim 1 size in 0..2147483647", "got -1"}));
}
TEST_F(GqaArgs, NegativeSeqLen) {
  c.seq_lens.data<std::int32_t>()[1] = -3;
  EXPECT_TRUE(c.rejects({"seq_lens[1]", "expected >= 0", "got -3"}));
}
TEST_F(GqaArgs, BatchAboveMax) {
  c.config.max_batch = 1;
  EXPECT_TRUE(c.rejects({"q: dim 0 (batch)", "0..1", "plan.config.max_batch", "got 2"}));
}
TEST_F(GqaArgs, QLenAboveMax) {
  c.config.max_q_len = 1;
  c.q_len = 2;
  c.lens = {5, 9};
  c.build();
  EXPECT_TRUE(c.rejects({"q: dim 1 (q_len)", "1..1", "plan.config.max_q_len", "got 2"}));
}
TEST_F(GqaArgs, BatchNotMultipleOfBeam) {
  c.config.beam_width = 2;
  c.config.max_batch = 4;
  c.args.q = view_as(c.q, {1, 1, 4, 32}, {128, 128, 32, 1});
  EXPECT_TRUE(c.rejects({"q: dim 0 (batch)", "multiple of plan.config.beam_width (2)", "got 1"}));
}

// --- lengths against pages and the plan ---
TEST_F(GqaArgs, QLenAboveSeqLen) {
  c.config.max_q_len = 4;
  c.q_len = 3;
  c.lens = {2, 9};
  c.build();
  EXPECT_TRUE(c.rejects({"seq_lens[0]", ">= q_len (3)", "got 2"}));
}
TEST_F(GqaArgs, SeqLenBeyondPagesProvided) {
  c.seq_lens.data<std::int32_t>()[1] = 17;
  c.config.max_seq_len = 64;
  EXPECT_TRUE(c.rejects({"seq_lens[1]", "max_pages * page_size = 4 * 4 = 16", "got 17"}));
}
TEST_F(GqaArgs, SeqLenBeyondPlanMax) {
  c.config.max_seq_len = 8;
  EXPECT_TRUE(c.rejects({"seq_lens[1]", "plan.config.max_seq_len (8)", "got 9"}));
}

// --- page table entries ---
TEST_F(GqaArgs, PageIdTooLarge) {
  c.page_table.data<std::int32_t>()[1 * 4 + 2] = 6;
  EXPECT_TRUE(c.rejects({"page_table[1][2]", "page id in [0, 6)", "seq_lens[1] = 9", "got 6"}));
}
TEST_F(GqaArgs, PageIdNegative) {
  c.page_table.data<std::int32_t>()[0] = -1;
  EXPECT_TRUE(c.rejects({"page_table[0][0]", "[0, 6)", "got -1"}));
}
TEST_F(GqaArgs, UnusedPageEntriesAreNotChecked) {
  // Column 3 of request 1 (9 tokens = 3 pages) and columns 2..3 of request 0 hold 0x3FFFFFFF.
  ASSERT_NO_THROW(gqa_decode(c.plan(), c.args));
}

// --- alignment ---
TEST_F(GqaArgs, MisalignedQPointer) {
  c.args.q = view_as(c.q, {2, 1, 4, 16}, {128, 128, 32, 1}, 2);
  c.config.head_dim = 16;
  c.config.num_q_heads = 4;
  EXPECT_TRUE(c.rejects({"q:", "aligned to 16 bytes", "2 bytes past"}));
}
TEST_F(GqaArgs, MisalignedCachePageStride) {
  HostTensor big(DType::kBF16, {6 * 264});
  c.args.k_cache = view_as(big, {6, 4, 2, 32}, {259, 64, 32, 1});
  EXPECT_TRUE(
      c.rejects({"k_cache", "stride of dim 0 a multiple of 16 bytes", "518 bytes (259 elements)"}));
}
TEST_F(GqaArgs, MisalignedOutPointer) {
  HostTensor bigger(DType::kBF16, {2 * 128 + 8});
  bigger.fill_bytes(kPoison);
  c.args.out = view_as(bigger, {2, 1, 4, 32}, {128, 128, 32, 1}, 8);
  EXPECT_TRUE(c.rejects({"out:", "aligned to 16 bytes", "8 bytes past"}));
  EXPECT_TRUE(all_bytes_are(bigger, kPoison));
}

// --- null pointers ---
TEST_F(GqaArgs, NullQ) {
  c.args.q.data = nullptr;
  EXPECT_TRUE(c.rejects({"q:", "non-null data pointer", "got nullptr"}));
}
TEST_F(GqaArgs, NullSeqLens) {
  c.args.seq_lens.data = nullptr;
  EXPECT_TRUE(c.rejects({"seq_lens", "non-null data pointer", "got nullptr"}));
}
TEST_F(GqaArgs, MissingKCache) {
  c.args.k_cache = TensorView{};
  EXPECT_TRUE(c.rejects({"k_cache", "expected a tensor", "got absent"}));
}

// --- optional tensors against the plan's feature flags ---
TEST_F(GqaArgs, LseMissingButPlanned) {
  c.args.lse = TensorView{};
  EXPECT_TRUE(c.rejects({"lse", "plan.config.lse is true", "got absent"}));
}
TEST_F(GqaArgs, LseGivenButNotPlanned) {
  c.config.lse = false;
  c.args.lse = c.lse.view();
  EXPECT_TRUE(c.rejects({"lse", "absent (plan.config.lse is false)", "got [2, 1, 4] fp32 on cpu"}));
}
TEST_F(GqaArgs, SinksGivenButNotPlanned) {
  c.args.sinks = c.sinks.view();
  EXPECT_TRUE(c.rejects({"sinks", "absent (plan.config.sinks is false)"}));
}
TEST_F(GqaArgs, TreeMaskMissingButPlanned) {
  c.config.tree_mask = true;
  EXPECT_TRUE(c.rejects({"tree_mask", "plan.config.tree_mask is true", "got absent"}));
}
TEST_F(GqaArgs, PerHeadScalesMissingButPlanned) {
  c.config.per_head_kv_scale = true;
  EXPECT_TRUE(c.rejects({"k_scales", "plan.config.per_head_kv_scale is true", "got absent"}));
}

// --- feature tensor shapes ---
TEST_F(GqaArgs, TreeMaskShape) {
  c.config.tree_mask = true;
  c.config.max_q_len = 4;
  c.q_len = 2;
  c.build();
  HostTensor wide(DType::kUINT32, {2, 2, 2});
  c.args.tree_mask = wide.view();
  EXPECT_TRUE(c.rejects({"tree_mask: dim 2 (words): expected 1", "ceil(q_len / 32)", "got 2"}));
}
TEST_F(GqaArgs, TreeMaskDiagonalBitMissing) {
  c.config.tree_mask = true;
  c.q_len = 2;
  c.build();
  c.tree_mask.data<std::uint32_t>()[1 * 2 + 1] = 0x1u;  // request 1, draft 1: only bit 0
  EXPECT_TRUE(c.rejects(
      {"tree_mask[1][1][0]", "bit 1 set (draft token 1 sees itself)", "got word 0x00000001"}));
}
TEST_F(GqaArgs, SinksShape) {
  c.config.sinks = true;
  c.build();
  HostTensor wrong(DType::kFP32, {5});
  c.args.sinks = wrong.view();
  EXPECT_TRUE(c.rejects({"sinks: dim 0 (num_q_heads): expected 4", "got 5"}));
}
TEST_F(GqaArgs, PerHeadScaleShape) {
  c.config.per_head_kv_scale = true;
  c.build();
  HostTensor wrong(DType::kFP32, {4});
  c.args.v_scales = wrong.view();
  EXPECT_TRUE(c.rejects({"v_scales: dim 0 (num_kv_heads): expected 2", "got 4"}));
}

// --- scalars ---
TEST_F(GqaArgs, SoftmaxScaleNaN) {
  c.args.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(c.rejects({"softmax_scale", "finite value >= 0", "got nan"}));
}
TEST_F(GqaArgs, SoftmaxScaleNegative) {
  c.args.softmax_scale = -0.5f;
  EXPECT_TRUE(c.rejects({"softmax_scale", "finite value >= 0", "got -0.5"}));
}
TEST_F(GqaArgs, OutScaleZero) {
  c.args.out_scale = 0.f;
  EXPECT_TRUE(c.rejects({"out_scale", "finite value > 0", "got 0"}));
}
TEST_F(GqaArgs, KScaleInfinite) {
  c.args.k_scale = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(c.rejects({"k_scale", "finite", "got inf"}));
}

// --- a plan edited by hand is re-checked ---
TEST_F(GqaArgs, HandEditedPlanIsRechecked) {
  GqaPlan plan = c.plan();
  plan.config.head_dim = 40;
  const GqaDecodeArgs a = c.args;
  EXPECT_TRUE(rejected([&] { gqa_decode(plan, a); },
                       {"gqa_decode: plan.config.head_dim", "multiple of 16", "got 40"},
                       {&c.out, &c.lse}));
}

// --- the one-shot overload validates the same way ---
TEST_F(GqaArgs, OneShotRejectsWrongDtype) {
  c.args.q.dtype = DType::kFP16;
  const GqaConfig config = c.config;
  const GqaDecodeArgs a = c.args;
  EXPECT_TRUE(
      rejected([&] { gqa_decode(config, a); }, {"q:", "dtype bf16", "got fp16"}, {&c.out, &c.lse}));
}
TEST_F(GqaArgs, OneShotRejectsBadPageId) {
  c.page_table.data<std::int32_t>()[1] = 99;
  const GqaConfig config = c.config;
  const GqaDecodeArgs a = c.args;
  EXPECT_TRUE(rejected([&] { gqa_decode(config, a); }, {"page_table[0][1]", "[0, 6)", "got 99"},
                       {&c.out, &c.lse}));
}

}  // namespace
}  // namespace deca::test
