// MLA dense and sparse-FP8 decode references against independent brute force, hand cases and
// invariants (docs/semantics.md, "MLA decode").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/mla_brute.hpp"
#include "common/mla_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"

namespace deca::test {
namespace {

using Expected = MlaExpected;
constexpr auto softmax_row = mla_softmax_row;

std::vector<float> q_row(const HostTensor& q, std::int64_t row) {
  std::vector<float> v(kMlaQk);
  for (int d = 0; d < kMlaQk; ++d) v[d] = q.get(row * kMlaQk + d);
  return v;
}

Expected brute_force_dense(const MlaDenseCase& c) {
  const auto& s = c.spec;
  Expected e;
  e.out.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads * kMlaV, 0.0L);
  e.lse.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads, -kInf);
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < s.q_len; ++i) {
      std::vector<std::vector<long double>> keys;
      for (int t = 0; t < c.lens[b] && t <= c.lens[b] - s.q_len + i; ++t) {
        keys.emplace_back(c.kv_logical[b].begin() + static_cast<std::size_t>(t) * kMlaQk,
                          c.kv_logical[b].begin() + static_cast<std::size_t>(t + 1) * kMlaQk);
      }
      for (int h = 0; h < s.num_heads; ++h) {
        const std::int64_t row = (static_cast<std::int64_t>(b) * s.q_len + i) * s.num_heads + h;
        softmax_row(q_row(c.q, row), keys, c.params.softmax_scale, nullptr, &e.out[row * kMlaV], &e.lse[row]);
      }
    }
  }
  return e;
}

// Dequantizes a 656-byte record straight from its bytes.
std::vector<long double> read_token(const MlaSparseCase& c, int id) {
  const std::uint8_t* rec = c.kv.data<std::uint8_t>() + static_cast<std::int64_t>(id) * kMlaTokenBytes;
  std::vector<long double> k(kMlaQk);
  for (int d = 0; d < 512; ++d) {
    float scale;
    std::memcpy(&scale, rec + 512 + (d / 128) * 4, 4);
    k[d] = static_cast<long double>(fp8e4m3_to_float(rec[d])) * scale;
  }
  for (int r = 0; r < 64; ++r) {
    std::uint16_t bits;
    std::memcpy(&bits, rec + 528 + 2 * r, 2);
    k[512 + r] = bf16_to_float(bits);
  }
  return k;
}

Expected brute_force_sparse(const MlaSparseCase& c) {
  const auto& s = c.spec;
  Expected e;
  e.out.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads * kMlaV, 0.0L);
  e.lse.assign(static_cast<std::size_t>(s.batch) * s.q_len * s.num_heads, -kInf);
  for (int b = 0; b < s.batch; ++b) {
    const int count = s.topk_length ? c.topk_length.data<int>()[b] : s.topk;
    for (int i = 0; i < s.q_len; ++i) {
      std::vector<std::vector<long double>> keys;
      const int* ids = c.indices.data<int>() + (static_cast<std::int64_t>(b) * s.q_len + i) * s.topk;
      for (int k = 0; k < count; ++k) {
        if (ids[k] != -1) keys.push_back(read_token(c, ids[k]));
      }
      for (int h = 0; h < s.num_heads; ++h) {
        const std::int64_t row = (static_cast<std::int64_t>(b) * s.q_len + i) * s.num_heads + h;
        softmax_row(q_row(c.q, row), keys, c.params.softmax_scale,
                    s.attn_sink ? c.attn_sink.data<float>() + h : nullptr, &e.out[row * kMlaV], &e.lse[row]);
      }
    }
  }
  return e;
}

int expect_close(const HostTensor& out, const HostTensor& lse, bool check_lse, const Expected& e) {
  return expect_mla_close(out, lse, check_lse, e);
}

struct NamedMla {
  std::string name;
  MlaCaseSpec spec;
};
void PrintTo(const NamedMla& s, std::ostream* os) { *os << s.name; }

std::vector<NamedMla> dense_specs() {
  std::vector<NamedMla> v;
  { MlaCaseSpec s; s.batch = 6; s.seq_lens = {0, 1, 63, 64, 65, 150}; v.push_back({"PageEdgeLengths", s}); }
  { MlaCaseSpec s; s.q_len = 2; s.max_len = 90; v.push_back({"QLen2Causal", s}); }
  { MlaCaseSpec s; s.q_len = 3; s.seq_lens = {3, 70}; s.page_size = 16; v.push_back({"QLen3ShortRequest", s}); }
  // Lengths below q_len (refused by the CPU API, possible on CUDA): the first rows see no key.
  { MlaCaseSpec s; s.q_len = 3; s.seq_lens = {2, 70}; s.page_size = 16; v.push_back({"QLenBeyondLength", s}); }
  { MlaCaseSpec s; s.softmax_scale = 0.1f; s.num_heads = 128; s.batch = 1; s.max_len = 30; v.push_back({"Heads128Scale", s}); }
  { MlaCaseSpec s; s.lse = false; s.page_size = 1; s.max_len = 20; v.push_back({"PageSize1NoLse", s}); }
  // The 8-bit formats: e4m3 under the packer's power-of-two scale and under an arbitrary one
  // (each product rounded to bf16), the 656-byte token read through the block table.
  for (const int f : {kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
    const std::string n = f == kMlaKvFP8E4M3 ? "E4m3" : "Fp8Sparse";
    { MlaCaseSpec s; s.kv_format = f; s.batch = 5; s.q_len = 4; s.num_heads = 3; s.page_size = 16;
      s.seq_lens = {0, 4, 15, 17, 100}; v.push_back({n + "RaggedQLen4", s}); }
    { MlaCaseSpec s; s.kv_format = f; s.q_len = 2; s.num_heads = 24; s.page_size = 64; s.max_len = 129;
      v.push_back({n + "Heads24", s}); }
    { MlaCaseSpec s; s.kv_format = f; s.page_size = 1; s.max_len = 9; s.lse = false; v.push_back({n + "Page1", s}); }
  }
  { MlaCaseSpec s; s.kv_format = kMlaKvFP8E4M3; s.kv_scale = 0.0123f; s.q_len = 3; s.max_len = 77;
    v.push_back({"E4m3ArbitraryScale", s}); }
  return v;
}

class MlaDenseBruteForce : public ::testing::TestWithParam<NamedMla> {};

TEST_P(MlaDenseBruteForce, MatchesBruteForce) {
  DECA_SEED_TRACE();
  auto rng = make_rng(std::hash<std::string>{}(GetParam().name) + 1);
  MlaDenseCase c = build_mla_dense_case(GetParam().spec, rng);
  cpu::mla_dense_decode(c.params);
  EXPECT_EQ(expect_close(c.out, c.lse, c.spec.lse, brute_force_dense(c)), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDenseBruteForce, ::testing::ValuesIn(dense_specs()),
                         [](const auto& info) { return info.param.name; });

// One cached token: every head returns its V exactly, and the LSE is the one logit.
TEST(MlaDense, SingleKeyReturnsItsValue) {
  DECA_SEED_TRACE();
  MlaCaseSpec s;
  s.batch = 1;
  s.seq_lens = {1};
  auto rng = make_rng(31);
  MlaDenseCase c = build_mla_dense_case(s, rng);
  cpu::mla_dense_decode(c.params);
  for (int h = 0; h < s.num_heads; ++h) {
    double dot = 0;
    for (int d = 0; d < kMlaQk; ++d) dot += static_cast<double>(c.q.get(h * kMlaQk + d)) * c.kv_logical[0][d];
    EXPECT_NEAR(c.lse.data<float>()[h], dot / std::sqrt(576.0), 1e-5);
    for (int d = 0; d < kMlaV; ++d) ASSERT_EQ(c.out.get(h * kMlaV + d), c.kv_logical[0][d]) << h << " " << d;
  }
}

std::vector<NamedMla> sparse_specs() {
  std::vector<NamedMla> v;
  { MlaCaseSpec s; v.push_back({"Plain", s}); }
  { MlaCaseSpec s; s.topk_length = true; s.batch = 4; v.push_back({"TopkLength", s}); }
  { MlaCaseSpec s; s.attn_sink = true; v.push_back({"AttnSink", s}); }
  { MlaCaseSpec s; s.q_len = 2; s.topk = 64; s.duplicates = 8; s.attn_sink = true; s.topk_length = true;
    v.push_back({"QLen2AllFeatures", s}); }
  { MlaCaseSpec s; s.skip_fraction = 0.6f; s.page_size = 16; s.pool_blocks = 3; v.push_back({"ManySkipped", s}); }
  { MlaCaseSpec s; s.num_heads = 64; s.topk = 128; s.batch = 1; s.softmax_scale = 0.05f; v.push_back({"Heads64Topk128", s}); }
  return v;
}

class MlaSparseBruteForce : public ::testing::TestWithParam<NamedMla> {};

TEST_P(MlaSparseBruteForce, MatchesBruteForce) {
  DECA_SEED_TRACE();
  auto rng = make_rng(std::hash<std::string>{}(GetParam().name) + 2);
  MlaSparseCase c = build_mla_sparse_case(GetParam().spec, rng);
  cpu::mla_sparse_decode(c.params);
  EXPECT_EQ(expect_close(c.out, c.lse, c.spec.lse, brute_force_sparse(c)), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaSparseBruteForce, ::testing::ValuesIn(sparse_specs()),
                         [](const auto& info) { return info.param.name; });

MlaCaseSpec one_row_spec(int topk) {
  MlaCaseSpec s;
  s.batch = 1;
  s.topk = topk;
  s.skip_fraction = 0;
  s.duplicates = 0;
  return s;
}

TEST(MlaSparse, DuplicateIndexCountsTwice) {
  DECA_SEED_TRACE();
  auto rng = make_rng(32);
  MlaSparseCase one = build_mla_sparse_case(one_row_spec(1), rng);
  auto rng2 = make_rng(32);
  MlaSparseCase two = build_mla_sparse_case(one_row_spec(2), rng2);
  two.q = HostTensor(one.q), two.kv = HostTensor(one.kv);
  two.indices.data<int>()[0] = two.indices.data<int>()[1] = one.indices.data<int>()[0];
  two.bind();
  cpu::mla_sparse_decode(one.params);
  cpu::mla_sparse_decode(two.params);
  // softmax over {x, x} gives x the same output; the sum of exponentials doubles.
  EXPECT_EQ(std::memcmp(one.out.raw(), two.out.raw(), one.out.bytes()), 0);
  for (int h = 0; h < one.spec.num_heads; ++h) {
    EXPECT_NEAR(two.lse.data<float>()[h], one.lse.data<float>()[h] + std::log(2.0), 1e-5);
  }
}

TEST(MlaSparse, NoValidIndexGivesZerosAndMinusInf) {
  DECA_SEED_TRACE();
  MlaCaseSpec s = one_row_spec(8);
  s.batch = 2;
  s.attn_sink = true;
  s.topk_length = true;
  auto rng = make_rng(33);
  MlaSparseCase c = build_mla_sparse_case(s, rng);
  std::fill_n(c.indices.data<int>(), 8, -1);  // request 0: all skipped
  c.topk_length.data<int>()[0] = 8;
  c.topk_length.data<int>()[1] = 0;           // request 1: nothing counts
  cpu::mla_sparse_decode(c.params);
  for (std::int64_t n = 0; n < c.out.numel(); ++n) ASSERT_EQ(c.out.get(n), 0.f) << n;
  for (std::int64_t n = 0; n < c.lse.numel(); ++n) ASSERT_EQ(c.lse.data<float>()[n], -kInf) << n;
}

TEST(MlaSparse, SinkOfMinusInfinityEqualsNoSink) {
  DECA_SEED_TRACE();
  MlaCaseSpec s;
  s.attn_sink = true;
  auto rng = make_rng(34);
  MlaSparseCase c = build_mla_sparse_case(s, rng);
  std::fill_n(c.attn_sink.data<float>(), s.num_heads, -std::numeric_limits<float>::infinity());
  cpu::mla_sparse_decode(c.params);
  const HostTensor out = c.out, lse = c.lse;
  c.params.attn_sink = nullptr;
  c.out.fill_bytes(0xFF);
  cpu::mla_sparse_decode(c.params);
  EXPECT_EQ(std::memcmp(out.raw(), c.out.raw(), out.bytes()), 0);
  EXPECT_EQ(std::memcmp(lse.raw(), c.lse.raw(), lse.bytes()), 0);
}

// The 656-byte cache read densely is sparse decode over each request's tokens in order (the
// same tokens, the same decode, the same sum order): the same bytes.
TEST(MlaDense, Fp8SparseCacheEqualsSparseDecodeOverEveryToken) {
  DECA_SEED_TRACE();
  MlaCaseSpec s;
  s.kv_format = kMlaKvFP8Sparse;
  s.batch = 3;
  s.seq_lens = {1, 40, 70};
  s.page_size = 16;
  auto rng = make_rng(37);
  MlaDenseCase dn = build_mla_dense_case(s, rng);
  cpu::mla_dense_decode(dn.params);
  for (int b = 0; b < s.batch; ++b) {
    const int len = dn.lens[b];
    HostTensor ids(DType::kINT32, {1, 1, len});
    for (int t = 0; t < len; ++t) {
      ids.data<int>()[t] = dn.block_table.data<int>()[b * dn.block_table.shape()[1] + t / 16] * 16 + t % 16;
    }
    HostTensor out(DType::kBF16, {1, 1, s.num_heads, kMlaV}), lse(DType::kFP32, {1, 1, s.num_heads});
    MlaSparseParams p{};
    p.batch = 1, p.q_len = 1, p.num_heads = s.num_heads, p.page_size = 16, p.topk = len;
    p.num_blocks = dn.params.num_blocks;
    p.q = static_cast<const char*>(dn.q.raw()) + b * std::int64_t{dn.params.q_stride_batch} * 2;
    p.q_stride_batch = dn.params.q_stride_batch, p.q_stride_token = dn.params.q_stride_token;
    p.q_stride_head = dn.params.q_stride_head;
    p.kv = dn.kv.data<unsigned char>();
    p.kv_stride_block = dn.params.kv_stride_block, p.kv_stride_slot = dn.params.kv_stride_slot;
    p.indices = ids.data<int>(), p.indices_stride_batch = len, p.indices_stride_token = len;
    p.out = out.raw(), p.out_stride_head = kMlaV, p.out_stride_token = kMlaV * s.num_heads;
    p.out_stride_batch = p.out_stride_token;
    p.lse = lse.data<float>(), p.lse_stride_head = 1, p.lse_stride_token = s.num_heads;
    p.lse_stride_batch = s.num_heads;
    p.softmax_scale = dn.params.softmax_scale;
    cpu::mla_sparse_decode(p);
    const std::size_t rows = static_cast<std::size_t>(s.num_heads);
    EXPECT_EQ(0, std::memcmp(out.raw(), static_cast<const char*>(dn.out.raw()) + b * rows * kMlaV * 2,
                             rows * kMlaV * 2)) << b;
    EXPECT_EQ(0, std::memcmp(lse.raw(), dn.lse.data<float>() + b * rows, rows * 4)) << b;
  }
}

// An e4m3 cache under a power-of-two scale is the bf16 cache of its real values, exactly.
TEST(MlaDense, E4m3CacheEqualsBf16CacheOfItsRealValues) {
  DECA_SEED_TRACE();
  MlaCaseSpec s;
  s.kv_format = kMlaKvFP8E4M3;
  s.q_len = 2;
  s.max_len = 50;
  auto rng = make_rng(38);
  MlaDenseCase e = build_mla_dense_case(s, rng);
  ASSERT_EQ(e.kv_scale, std::exp2(std::round(std::log2(e.kv_scale)))) << "a power of two";
  cpu::mla_dense_decode(e.params);
  MlaCaseSpec bs = s;
  bs.kv_format = kMlaKvBF16;
  auto rng2 = make_rng(38);
  MlaDenseCase b = build_mla_dense_case(bs, rng2);
  b.q = HostTensor(e.q);
  b.block_table = HostTensor(e.block_table);
  HostTensor kv(DType::kBF16, {e.kv.shape()[0], s.page_size, 1, kMlaQk});
  for (std::int64_t i = 0; i < kv.numel(); ++i) {
    kv.set(i, static_cast<float>(fp8e4m3_to_float(e.kv.data<std::uint8_t>()[i])) * e.kv_scale);
  }
  b.kv = std::move(kv);
  b.bind();
  cpu::mla_dense_decode(b.params);
  EXPECT_EQ(0, std::memcmp(e.out.raw(), b.out.raw(), e.out.bytes()));
  EXPECT_EQ(0, std::memcmp(e.lse.raw(), b.lse.raw(), e.lse.bytes()));
}

// Sparse attention over every token of a request, in order, is dense attention over a bf16
// cache holding the dequantized tokens.
TEST(MlaSparse, AllTokensInOrderEqualsDense) {
  DECA_SEED_TRACE();
  MlaCaseSpec s = one_row_spec(100);
  s.page_size = 32;
  s.pool_blocks = 4;
  auto rng = make_rng(35);
  MlaSparseCase sp = build_mla_sparse_case(s, rng);
  for (int k = 0; k < 100; ++k) sp.indices.data<int>()[k] = k;
  cpu::mla_sparse_decode(sp.params);

  MlaCaseSpec ds = s;
  ds.seq_lens = {100};
  auto rng2 = make_rng(36);
  MlaDenseCase dn = build_mla_dense_case(ds, rng2);
  dn.q = HostTensor(sp.q);
  HostTensor deq(DType::kBF16, {4, 32, 1, kMlaQk});
  unpack_mla_fp8(sp.kv.view(), deq.view());
  dn.kv = std::move(deq);
  for (int j = 0; j < 4; ++j) dn.block_table.data<int>()[j] = j;
  dn.bind();
  cpu::mla_dense_decode(dn.params);
  EXPECT_EQ(std::memcmp(sp.out.raw(), dn.out.raw(), sp.out.bytes()), 0);
  EXPECT_EQ(std::memcmp(sp.lse.raw(), dn.lse.raw(), sp.lse.bytes()), 0);
}

}  // namespace
}  // namespace deca::test
