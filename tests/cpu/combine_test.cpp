// The split-KV combine reference: hand cases, empty splits, and splits of a real decode merged
// back into the unsplit result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/contiguous_params.hpp"
#include "common/host_tensor.hpp"
#include "common/paged_gqa_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"

namespace deca::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Partials [splits, batch, q_len, heads, dim_v] fp32 and LSE; output of any dtype.
struct CombineCase {
  int splits, batch, q_len, heads, dim_v;
  HostTensor po, pl, out, lse, sink;
  CombineParams p{};

  CombineCase(int s, int b, int q, int h, int d, DType out_dtype)
      : splits(s), batch(b), q_len(q), heads(h), dim_v(d),
        po(DType::kFP32, {s, b, q, h, d}), pl(DType::kFP32, {s, b, q, h}),
        out(out_dtype, {b, q, h, d}), lse(DType::kFP32, {b, q, h}), sink(DType::kFP32, {h}) {
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    p.num_splits = s, p.batch = b, p.q_len = q, p.num_heads = h, p.dim_v = d;
    p.out_dtype = static_cast<int>(out_dtype);
    p.partial_out = po.data<float>();
    p.po_stride_head = d;
    p.po_stride_token = p.po_stride_head * h;
    p.po_stride_batch = p.po_stride_token * q;
    p.po_stride_split = p.po_stride_batch * b;
    p.partial_lse = pl.data<float>();
    p.pl_stride_head = 1;
    p.pl_stride_token = h;
    p.pl_stride_batch = static_cast<std::int64_t>(h) * q;
    p.pl_stride_split = p.pl_stride_batch * b;
    bind_contiguous_out_lse(p, h, q, out, d, lse, true);
  }
};

// Two splits of one row: sums of exponentials 1 and 3 (lse 0 and log 3), outputs 1 and 0:
// weights 1/4 and 3/4, so out = 0.25, lse = log 4. A sink of log 4 doubles the denominator.
TEST(Combine, HandTwoSplits) {
  for (DType dt : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    CombineCase c(2, 1, 1, 1, 2, dt);
    c.pl.data<float>()[0] = 0.f, c.pl.data<float>()[1] = std::log(3.f);
    c.po.data<float>()[0] = 1.f, c.po.data<float>()[1] = -2.f;
    c.po.data<float>()[2] = 0.f, c.po.data<float>()[3] = 2.f;
    cpu::combine(c.p);
    EXPECT_EQ(c.out.get(0), 0.25f) << dtype_name(dt);
    EXPECT_EQ(c.out.get(1), 1.0f) << dtype_name(dt);  // (-2 + 3 * 2) / 4
    EXPECT_NEAR(c.lse.data<float>()[0], std::log(4.0), 1e-6);
    c.sink.data<float>()[0] = std::log(4.f);
    c.p.attn_sink = c.sink.data<float>();
    cpu::combine(c.p);
    EXPECT_NEAR(c.out.get(0), 0.125f, 1e-6) << dtype_name(dt);
    EXPECT_NEAR(c.out.get(1), 0.5f, 1e-6) << dtype_name(dt);
    EXPECT_NEAR(c.lse.data<float>()[0], std::log(4.0), 1e-6);  // sink excluded
  }
}

TEST(Combine, EmptySplitsContributeNothing) {
  CombineCase c(3, 1, 1, 2, 4, DType::kFP32);
  c.po.fill_bytes(0xFF);  // NaN everywhere, then real data for the one live split of head 0
  std::fill_n(c.pl.data<float>(), 6, kNegInf);
  c.pl.data<float>()[1 * 2 + 0] = 0.7f;  // split 1, head 0
  for (int d = 0; d < 4; ++d) c.po.data<float>()[(1 * 2 + 0) * 4 + d] = d - 1.5f;
  c.sink.data<float>()[0] = c.sink.data<float>()[1] = 0.f;
  c.p.attn_sink = c.sink.data<float>();
  cpu::combine(c.p);
  const double share = std::exp(0.7) / (std::exp(0.7) + 1.0);  // the sink takes the rest
  for (int d = 0; d < 4; ++d) EXPECT_NEAR(c.out.get(d), (d - 1.5) * share, 1e-6);
  EXPECT_FLOAT_EQ(c.lse.data<float>()[0], 0.7f);
  // Head 1: every split empty -> zeros and -inf, even with a sink.
  for (int d = 0; d < 4; ++d) EXPECT_EQ(c.out.get(4 + d), 0.f);
  EXPECT_EQ(c.lse.data<float>()[1], kNegInf);
}

// A GQA decode split along the sequence (each split a request of its own over a page range),
// merged by combine, equals the unsplit decode.
TEST(Combine, GqaSplitsEqualUnsplit) {
  DECA_SEED_TRACE();
  GqaCaseSpec spec;
  spec.batch = 1;
  spec.seq_lens = {100};
  spec.page_size = 16;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.out_dtype = DType::kFP16;
  auto rng = make_rng(41);
  GqaCase c = build_gqa_case(spec, rng);
  cpu::gqa_decode(c.params);

  // Splits of pages [0, 2), [2, 5), [5, 7) and an empty one: 32, 48, 20 and 0 tokens.
  const int first_page[4] = {0, 2, 5, 7}, tokens[4] = {32, 48, 20, 0};
  const int rows = spec.num_q_heads, dim = spec.head_dim;
  CombineCase m(4, 1, 1, rows, dim, DType::kFP32);
  for (int s = 0; s < 4; ++s) {
    HostTensor part(DType::kFP16, {1, 1, rows, dim});
    GqaParams p = c.params;
    p.page_table = c.page_table.data<int>() + first_page[s];
    p.seq_lens = &tokens[s];
    p.out = part.raw();
    p.lse = m.pl.data<float>() + s * rows;
    cpu::gqa_decode(p);
    for (int n = 0; n < rows * dim; ++n) m.po.data<float>()[s * rows * dim + n] = part.get(n);
  }
  EXPECT_EQ(m.pl.data<float>()[3 * rows], kNegInf);
  cpu::combine(m.p);
  for (int n = 0; n < rows * dim; ++n) {
    const float want = c.out.get(n);
    // Each partial and the unsplit output went through fp16 once (half an ulp, 2^-11
    // relative); the partials' errors, weighted by shares that sum to one, are at most that of
    // the largest partial.
    float largest = 0;
    for (int s = 0; s < 3; ++s) largest = std::max(largest, std::fabs(m.po.data<float>()[s * rows * dim + n]));
    EXPECT_NEAR(m.out.get(n), want, (std::fabs(want) + largest) * 0x1p-11 * 1.01 + 1e-7) << n;
  }
  for (int h = 0; h < rows; ++h) EXPECT_NEAR(m.lse.data<float>()[h], c.lse.data<float>()[h], 2e-6);
}

// Random partials: combine equals a softmax over all the splits' keys at once.
TEST(Combine, RandomPartialsEqualFullSoftmax) {
  DECA_SEED_TRACE();
  auto rng = make_rng(42);
  std::normal_distribution<double> n(0.0, 2.0);
  const int splits = 5, keys_per_split = 7, dim = 16, rows = 2 * 3 * 4;
  CombineCase c(splits, 2, 3, 4, dim, DType::kFP32);
  for (int h = 0; h < 4; ++h) c.sink.data<float>()[h] = static_cast<float>(n(rng));
  c.p.attn_sink = c.sink.data<float>();
  std::vector<double> want_out(rows * dim), want_lse(rows);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> logit(splits * keys_per_split), value(splits * keys_per_split * dim);
    for (double& x : logit) x = n(rng);
    for (double& x : value) x = n(rng);
    // Splits: a row's last split is empty when r is odd.
    const int live = r % 2 ? splits - 1 : splits;
    long double z = 0, full[dim] = {};
    for (int s = 0; s < live; ++s) {
      long double zs = 0, os[dim] = {};
      for (int k = s * keys_per_split; k < (s + 1) * keys_per_split; ++k) {
        zs += std::exp(static_cast<long double>(logit[k]));
        for (int d = 0; d < dim; ++d) os[d] += std::exp(static_cast<long double>(logit[k])) * value[k * dim + d];
      }
      z += zs;
      for (int d = 0; d < dim; ++d) full[d] += os[d];
      c.pl.data<float>()[s * rows + r] = static_cast<float>(std::log(zs));
      for (int d = 0; d < dim; ++d) c.po.data<float>()[(s * rows + r) * dim + d] = static_cast<float>(os[d] / zs);
    }
    for (int s = live; s < splits; ++s) c.pl.data<float>()[s * rows + r] = kNegInf;
    const long double denom = z + std::exp(static_cast<long double>(c.sink.data<float>()[r % 4]));
    for (int d = 0; d < dim; ++d) want_out[r * dim + d] = static_cast<double>(full[d] / denom);
    want_lse[r] = static_cast<double>(std::log(z));
  }
  cpu::combine(c.p);
  for (int r = 0; r < rows; ++r) {
    for (int d = 0; d < dim; ++d) {
      const double want = want_out[r * dim + d];
      EXPECT_NEAR(c.out.get(r * dim + d), want, 1e-5 * (1 + std::fabs(want))) << r << " " << d;
    }
    EXPECT_NEAR(c.lse.data<float>()[r], want_lse[r], 1e-5);
  }
}

}  // namespace
}  // namespace deca::test
