// The overlap rule and the 64-bit size checks, op by op (issue 9): an output that shares a byte
// with an input or another output is refused before anything runs, and huge stride-0 views are
// refused at once instead of being walked.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api_fixtures.hpp"

namespace deca::test {
namespace {

// A byte buffer whose contents a rejected call must leave alone.
struct Bytes {
  HostTensor t;
  explicit Bytes(std::int64_t n) : t(DType::kUINT8, {n}) { t.fill_bytes(kPoison); }
  std::uint8_t* at(std::size_t off) { return t.data<std::uint8_t>() + off; }
  std::vector<std::uint8_t> snapshot() const {
    const auto* p = t.data<std::uint8_t>();
    return {p, p + t.bytes()};
  }
};

::testing::AssertionResult refused_untouched(const std::function<void()>& call, const Bytes& b,
                                             std::initializer_list<std::string> needles) {
  const std::vector<std::uint8_t> before = b.snapshot();
  ::testing::AssertionResult r = rejected(call, needles, {});
  if (!r) return r;
  if (b.snapshot() != before) return ::testing::AssertionFailure() << "bytes were written";
  return r;
}

TEST(GqaOverlap, OutOverPageTableIsRefused) {
  GqaCase c;
  c.build();
  Bytes buf(4096);
  std::memcpy(buf.at(0), c.page_table.raw(), c.page_table.bytes());
  c.args.page_table = make_tensor(buf.at(0), DType::kINT32, {2, 4});
  c.args.out = make_tensor(buf.at(0), DType::kBF16, {2, 1, 4, 32});
  const GqaPlan p = c.plan();
  const GqaDecodeArgs a = c.args;
  EXPECT_TRUE(refused_untouched([&] { gqa_decode(p, a); }, buf,
                                {"gqa_decode: out:", "shares no byte with page_table"}));
}

TEST(GqaOverlap, LseInsideOutAndOutOverQAreRefused) {
  GqaCase c;
  c.build();
  GqaDecodeArgs a = c.args;
  a.lse = make_tensor(static_cast<std::uint8_t*>(c.out.raw()) + 64, DType::kFP32, {2, 1, 4});
  const GqaPlan p = c.plan();
  EXPECT_TRUE(rejected([&] { gqa_decode(p, a); }, {"lse:", "shares no byte with out"}, {}));
  a = c.args;
  a.out = c.q.view();  // in place over q: refused too (the kernels read q while writing out)
  EXPECT_TRUE(rejected([&] { gqa_decode(p, a); }, {"out:", "with q"}, {&c.lse}));
}

TEST(GqaOverlap, NanPerHeadScaleIsRefused) {
  GqaCase c;
  c.config.per_head_kv_scale = true;
  c.build();
  c.v_scales.data<float>()[1] = NAN;
  EXPECT_TRUE(c.rejects({"gqa_decode: v_scales[1]", "finite", "nan"}));
}

TEST(GqaOverlap, EmptyOutWithZeroStridesIsAccepted) {
  // numpy 2 gives empty arrays zero strides; gqa_decode's own empty out must pass.
  GqaCase c;
  c.batch = 0;
  c.lens = {};
  c.build();
  GqaDecodeArgs a = c.args;
  a.out = make_tensor(c.out.raw(), DType::kBF16, {0, 1, 4, 32}, {0, 0, 0, 0});
  a.lse = make_tensor(c.lse.raw(), DType::kFP32, {0, 1, 4}, {0, 0, 0});
  const GqaPlan p = c.plan();
  EXPECT_NO_THROW(gqa_decode(p, a));
}

TEST(GqaOneShot, MaxSeqLenOfTheCallerIsKept) {
  GqaCase c;
  c.build();
  GqaConfig config = c.config;
  config.max_seq_len = 1;
  const GqaDecodeArgs a = c.args;
  EXPECT_TRUE(rejected([&] { gqa_decode(config, a); }, {"seq_lens[0]", "max_seq_len (1)", "got 5"},
                       {&c.out, &c.lse}));
}

TEST(GqaOneShot, MessagesNameTheArgumentsNotTheDerivedConfig) {
  GqaCase c;
  c.build();
  const GqaConfig config = c.config;
  GqaDecodeArgs a = c.args;
  a.page_table = make_tensor(c.page_table.raw(), DType::kINT32, {8});
  EXPECT_TRUE(rejected([&] { gqa_decode(config, a); },
                       {"gqa_decode: page_table: expected rank 2 [batch, max_pages]", "rank 1"},
                       {&c.out, &c.lse}));
  a = c.args;
  a.q = make_tensor(c.q.raw(), DType::kBF16, {2, 1, 4, 16});
  EXPECT_TRUE(rejected([&] { gqa_decode(config, a); }, {"gqa_decode: q: dim 3 (head_dim)", "got 16"},
                       {&c.out, &c.lse}));
  a = c.args;
  a.q.dtype = DType::kFP32;
  EXPECT_TRUE(rejected([&] { gqa_decode(config, a); }, {"gqa_decode: q: expected dtype", "got fp32"},
                       {&c.out, &c.lse}));
  a = c.args;
  a.q = make_tensor(c.q.raw(), DType::kBF16, {2, 1, 3, 32});
  EXPECT_TRUE(rejected([&] { gqa_decode(config, a); },
                       {"gqa_decode: q: dim 2 (num_q_heads)", "multiple of k_cache's"},
                       {&c.out, &c.lse}));
}

TEST(MlaOverlap, OutOverTheLengthsOrTheIndicesIsRefused) {
  MlaCase dense(false);
  dense.build();
  Bytes buf(8192);
  std::memcpy(buf.at(0), dense.seqlens.raw(), dense.seqlens.bytes());
  MlaDenseArgs d = dense.dense;
  d.cache_seqlens = make_tensor(buf.at(0), DType::kINT32, {2});
  d.out = make_tensor(buf.at(0), DType::kBF16, {2, 1, 2, 512});
  const MlaPlan dp = dense.plan();
  EXPECT_TRUE(refused_untouched([&] { mla_decode_dense(dp, d); }, buf,
                                {"mla_decode_dense: out:", "cache_seqlens"}));

  MlaCase sparse(true);
  sparse.build();
  MlaSparseArgs s = sparse.sparse;
  std::memcpy(buf.at(0), sparse.indices.raw(), sparse.indices.bytes());
  s.indices = make_tensor(buf.at(0), DType::kINT32, {2, 1, 4});
  s.out = make_tensor(buf.at(0), DType::kBF16, {2, 1, 2, 512});
  const MlaPlan sp = sparse.plan();
  EXPECT_TRUE(refused_untouched([&] { mla_decode_sparse(sp, s); }, buf,
                                {"mla_decode_sparse: out:", "indices"}));
}

TEST(CombineOverlap, LseOverOutAndHugeSplitCountsAreRefused) {
  HostTensor po(DType::kFP32, {2, 1, 1, 2, 8}), pl(DType::kFP32, {2, 1, 1, 2});
  HostTensor out(DType::kFP32, {1, 1, 2, 8});
  out.fill_bytes(kPoison);
  CombineArgs a;
  a.partial_out = po.view();
  a.partial_lse = pl.view();
  a.out = out.view();
  a.lse = make_tensor(out.raw(), DType::kFP32, {1, 1, 2});
  EXPECT_TRUE(rejected([&] { combine(a); }, {"combine: lse:", "with out"}, {&out}));
  a.lse = TensorView{};
  a.out = po.view();
  a.out = make_tensor(po.raw(), DType::kFP32, {1, 1, 2, 8});
  EXPECT_TRUE(rejected([&] { combine(a); }, {"combine: out:", "partial_out"}, {}));
  // 2^31 - 1 splits as stride-0 views: refused at once rather than walked.
  a.out = out.view();
  a.partial_out = make_tensor(po.raw(), DType::kFP32, {INT_MAX, 1, 1, 2, 8}, {0, 16, 16, 8, 1});
  a.partial_lse = make_tensor(pl.raw(), DType::kFP32, {INT_MAX, 1, 1, 2}, {0, 2, 2, 1});
  EXPECT_TRUE(rejected([&] { combine(a); }, {"partial_out: dim 0 (num_splits)", "2147483647"},
                       {&out}));
}

TEST(QuantOverlap, OutOverSrcAndHugeStrideZeroOutAreRefused) {
  HostTensor x(DType::kFP32, {4, 8});
  for (int i = 0; i < 32; ++i) x.set(i, 0.25f * i);
  const std::vector<std::uint8_t> before(x.data<std::uint8_t>(), x.data<std::uint8_t>() + 128);
  TensorView over = make_tensor(x.raw(), DType::kFP8E4M3, {4, 8});
  EXPECT_TRUE(rejected([&] { quantize_fp8(x.view(), over, 1.f); },
                       {"quantize_fp8: out:", "shares no byte with src"}, {}));
  EXPECT_EQ(std::vector<std::uint8_t>(x.data<std::uint8_t>(), x.data<std::uint8_t>() + 128), before);
  // 2^31 - 1 rows through stride 0: out overlaps itself, refused before any walk.
  HostTensor o(DType::kINT8, {8});
  o.fill_bytes(kPoison);
  const std::int64_t rows = INT_MAX;
  TensorView src = make_tensor(x.raw(), DType::kFP32, {rows, 8}, {0, 1});
  TensorView out = make_tensor(o.raw(), DType::kINT8, {rows, 8}, {0, 1});
  EXPECT_TRUE(rejected([&] { quantize_int8(src, out, 1.f); }, {"quantize_int8: out:"}, {&o}));
  HostTensor tok(DType::kBF16, {1, 576}), packed(DType::kUINT8, {1, 656});
  packed.fill_bytes(kPoison);
  TensorView psrc = make_tensor(tok.raw(), DType::kBF16, {rows, 576}, {0, 1});
  TensorView pout = make_tensor(packed.raw(), DType::kUINT8, {rows, 656}, {0, 1});
  EXPECT_TRUE(rejected([&] { pack_mla_fp8(psrc, pout); }, {"pack_mla_fp8: out:"}, {&packed}));
}

}  // namespace
}  // namespace deca::test
