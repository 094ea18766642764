// MODEL1 (DeepSeek V4) sparse decode on the CPU backend: the 584-byte page layout the packer
// writes (offsets computed by hand), and the reference with one or two caches against a float64
// brute force written from the semantics (docs/semantics.md, "MLA decode"), over poisoned pages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/model1_case.hpp"
#include "common/test_seed.hpp"
#include "deca/error.hpp"

namespace deca::test {
namespace {

// ---------------------------------------------------------------- the byte layout

TEST(Model1Layout, PageBytes) {
  // page * 584 rounded up to a multiple of 576, by hand.
  EXPECT_EQ(mla_model1_page_bytes(1), 1152u);     // 584 -> 2 * 576
  EXPECT_EQ(mla_model1_page_bytes(2), 1728u);     // 1168 -> 3 * 576
  EXPECT_EQ(mla_model1_page_bytes(3), 2304u);     // 1752 -> 4 * 576
  EXPECT_EQ(mla_model1_page_bytes(61), 35712u);   // 35624 -> 62 * 576
  EXPECT_EQ(mla_model1_page_bytes(64), 37440u);   // 37376 -> 65 * 576
  EXPECT_EQ(mla_model1_page_bytes(72), 42048u);   // 42048 = 73 * 576 exactly
  EXPECT_EQ(mla_model1_page_bytes(256), 149760u); // 149504 -> 260 * 576
  EXPECT_EQ(mla_model1_page_bytes(0), 0u);
}

// Token (blk, slot), tile t: x = (d % 64 - 32) * 2^k with k = (token + t) % 5 - 2, so max|x| =
// 32 * 2^k and the scale is 2^(k - 3) (the power of two >= max / 448 = 2^k / 14); tile 6 of
// token 0 is all zeros (scale 2^-13, FlashMLA's floor) and tile 5 of token 1 reaches 448 * 2^3
// (scale 2^3 exactly).
float layout_value(int token, int d) {
  const int t = d / 64;
  if (token == 0 && t == 6) return 0.f;
  if (token == 1 && t == 5) return d % 64 == 7 ? -448.f * 8 : static_cast<float>(d % 64);
  const int k = (token + t) % 5 - 2;
  return std::ldexp(static_cast<float>(d % 64 - 32), k);
}
int layout_scale_exp(int token, int t) {
  if (token == 0 && t == 6) return -13;
  if (token == 1 && t == 5) return 3;
  return (token + t) % 5 - 2 - 3;
}

TEST(Model1Layout, PackerWritesTheHandComputedOffsets) {
  for (const int page : {1, 2, 3, 64}) {
    SCOPED_TRACE("page " + std::to_string(page));
    const int blocks = 3;
    const std::int64_t stride = static_cast<std::int64_t>(mla_model1_page_bytes(page));
    HostTensor plain(DType::kBF16, {blocks, page, 1, 512});
    for (int tok = 0; tok < blocks * page; ++tok) {
      for (int d = 0; d < 448; ++d) plain.set(tok * 512 + d, layout_value(tok, d));
      for (int r = 0; r < 64; ++r) plain.set(tok * 512 + 448 + r, 0.25f * (r - tok));
    }
    HostTensor bytes(DType::kUINT8, {blocks * stride});
    bytes.fill_bytes(0x5A);
    const TensorView view =
        make_tensor(bytes.raw(), DType::kUINT8, {blocks, page, 1, 584}, {stride, 584, 584, 1});
    pack_mla_fp8(plain.view(), view, MlaCacheFormat::kModel1);
    const auto* b = bytes.data<std::uint8_t>();
    for (int blk = 0; blk < blocks; ++blk) {
      for (int slot = 0; slot < page; ++slot) {
        const int tok = blk * page + slot;
        const std::int64_t row = blk * stride + slot * 576;
        const std::int64_t sc = blk * stride + page * 576 + slot * 8;
        for (int d = 0; d < 448; ++d) {
          const float scale = std::ldexp(1.f, layout_scale_exp(tok, d / 64));
          ASSERT_EQ(b[row + d], float_to_fp8e4m3(layout_value(tok, d) / scale)) << tok << " " << d;
        }
        for (int r = 0; r < 64; ++r) {
          std::uint16_t bits;
          std::memcpy(&bits, b + row + 448 + 2 * r, 2);
          ASSERT_EQ(bits, float_to_bf16(0.25f * (r - tok))) << tok << " rope " << r;
        }
        for (int t = 0; t < 7; ++t) ASSERT_EQ(b[sc + t], 127 + layout_scale_exp(tok, t)) << tok;
        ASSERT_EQ(b[sc + 7], 0) << "pad byte of token " << tok;
      }
      // The padding past page * 584 bytes lies outside the view: never written.
      for (std::int64_t o = page * 584; o < stride; ++o) ASSERT_EQ(b[blk * stride + o], 0x5A) << o;
    }
    // And back: every value e4m3 * 2^e, the RoPE values unchanged.
    HostTensor back(DType::kFP32, {blocks, page, 1, 512});
    unpack_mla_fp8(view, back.view(), MlaCacheFormat::kModel1);
    for (int tok = 0; tok < blocks * page; ++tok) {
      for (int d = 0; d < 448; ++d) {
        const float scale = std::ldexp(1.f, layout_scale_exp(tok, d / 64));
        ASSERT_EQ(back.get(tok * 512 + d),
                  fp8e4m3_to_float(float_to_fp8e4m3(layout_value(tok, d) / scale)) * scale);
      }
      for (int r = 0; r < 64; ++r) ASSERT_EQ(back.get(tok * 512 + 448 + r), 0.25f * (r - tok));
    }
  }
}

TEST(Model1Layout, UnpackReadsStridedBlocksAndBf16) {
  DECA_SEED_TRACE();
  auto rng = make_rng(71);
  Model1Pool pool = make_model1_pool(5, 4, 48, rng);  // block stride 3456 + 48
  HostTensor f32(DType::kFP32, {4, 5, 1, 512}), b16(DType::kBF16, {4, 5, 1, 512});
  unpack_mla_fp8(pool.view, f32.view(), MlaCacheFormat::kModel1);
  unpack_mla_fp8(pool.view, b16.view(), MlaCacheFormat::kModel1);
  for (int id = 0; id < pool.tokens(); ++id) {
    const std::vector<long double> k = model1_token(pool, id);
    for (int d = 0; d < 512; ++d) {
      ASSERT_EQ(f32.get(id * 512 + d), static_cast<float>(k[d])) << id << " " << d;
      ASSERT_EQ(b16.get(id * 512 + d), static_cast<float>(k[d])) << id << " " << d;
    }
  }
}

TEST(Model1Layout, FormatArgument) {
  HostTensor plain(DType::kBF16, {1, 2, 1, 512}), bytes(DType::kUINT8, {1728});
  const TensorView view = make_tensor(bytes.raw(), DType::kUINT8, {1, 2, 1, 584}, {1728, 584, 584, 1});
  try {
    pack_mla_fp8(plain.view(), view, MlaCacheFormat::kBF16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pack_mla_fp8: format: expected kFP8Sparse"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("got bf16"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- the reference

struct NamedSpec {
  std::string name;
  Model1Spec spec;
};
void PrintTo(const NamedSpec& s, std::ostream* os) { *os << s.name; }

std::vector<NamedSpec> specs() {
  std::vector<NamedSpec> v;
  { Model1Spec s; s.extra_topk = 0; v.push_back({"OneCache", s}); }
  { Model1Spec s; v.push_back({"TwoCaches", s}); }
  { Model1Spec s; s.batch = 4; s.topk_length = true; s.extra_topk_length = true;
    v.push_back({"RaggedLengthsBoth", s}); }
  { Model1Spec s; s.topk_length = true; s.extra_topk = 0; s.batch = 3; v.push_back({"RaggedOneCache", s}); }
  { Model1Spec s; s.num_heads = 8; s.q_len = 4; s.page_size = 2; s.blocks = 40; s.extra_page_size = 256;
    s.extra_blocks = 1; s.extra_topk = 64; s.attn_sink = true; v.push_back({"Heads8QLen4Pages2And256", s}); }
  { Model1Spec s; s.num_heads = 100; s.q_len = 2; s.page_size = 61; s.extra_page_size = 1;
    s.extra_blocks = 30; s.topk_length = true; s.extra_topk_length = true; s.attn_sink = true;
    s.batch = 3; v.push_back({"Heads100Pages61And1", s}); }
  { Model1Spec s; s.num_heads = 128; s.page_size = 256; s.blocks = 1; s.extra_page_size = 64;
    s.topk = 64; s.extra_topk = 128; s.softmax_scale = 0.03f; v.push_back({"Heads128Page256", s}); }
  { Model1Spec s; s.num_heads = 64; s.q_len = 2; s.all_invalid_row = true; s.attn_sink = true;
    v.push_back({"Heads64AllInvalidRow", s}); }
  { Model1Spec s; s.duplicates = 12; s.skip = 0.5f; s.lse = false; v.push_back({"DuplicatesNoLse", s}); }
  { Model1Spec s; s.strided = true; s.block_pad = 32; s.q_len = 2; s.topk_length = true;
    s.extra_topk_length = true; s.batch = 3; v.push_back({"StridedViews", s}); }
  return v;
}

class Model1Reference : public ::testing::TestWithParam<NamedSpec> {};

TEST_P(Model1Reference, MatchesFloat64Semantics) {
  DECA_SEED_TRACE();
  auto rng = make_rng(std::hash<std::string>{}(GetParam().name) + 7);
  Model1Case c = build_model1_case(GetParam().spec, rng);
  mla_decode_sparse(plan_mla_decode(c.config), c.args);
  EXPECT_EQ(expect_mla_close(c.out_rows(), c.lse_rows(), c.spec.lse, c.brute_force()), 0);
  if (!c.spec.lse) {
    for (std::int64_t i = 0; i < c.lse.numel(); ++i) {
      ASSERT_EQ(c.lse.data<std::uint8_t>()[i * 4], kModel1Poison) << "lse written without a plan lse";
    }
  }
  if (c.spec.strided) {  // the gaps between the strided rows are never written
    for (std::int64_t row = 0; row < c.out.numel() / c.out_dim(); ++row) {
      ASSERT_EQ(c.out.data<std::uint16_t>()[row * c.out_dim() + 515], 0xA5A5u) << row;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Model1Reference, ::testing::ValuesIn(specs()),
                         [](const auto& info) { return info.param.name; });

// Two caches, both lengths given (ragged, request 0 empty in one of them).
Model1Spec ragged_spec(int batch) {
  Model1Spec s;
  s.batch = batch;
  s.topk_length = true;
  s.extra_topk_length = true;
  return s;
}

// q = 0: every logit 0, so each counted entry (duplicates included, both caches) weighs the same:
// out = the mean of the listed rows, LSE = log(count).
TEST(Model1Reference, ZeroQueryAveragesEveryCountedEntry) {
  DECA_SEED_TRACE();
  auto rng = make_rng(72);
  Model1Spec s = ragged_spec(3);
  s.duplicates = 6;
  Model1Case c = build_model1_case(s, rng);
  for (std::int64_t i = 0; i < c.q.numel(); ++i) c.q.set(i, 0.f);
  mla_decode_sparse(plan_mla_decode(c.config), c.args);
  for (int b = 0; b < s.batch; ++b) {
    std::vector<long double> sum(512, 0.0L);
    int n = 0;
    for (const bool second : {false, true}) {
      for (int k = 0; k < (second ? c.extra_lens[b] : c.lens[b]); ++k) {
        const int id = c.id_at(second, b, 0, k);
        if (id < 0) continue;
        const auto row = model1_token(second ? c.extra : c.kv, id);
        for (int d = 0; d < 512; ++d) sum[d] += row[d];
        ++n;
      }
    }
    for (int h = 0; h < s.num_heads; ++h) {
      const std::int64_t r = static_cast<std::int64_t>(b) * s.num_heads + h;
      const float lse = c.lse.data<float>()[r];
      if (n == 0) {
        EXPECT_EQ(lse, -INFINITY);
      } else {
        EXPECT_NEAR(lse, std::log(static_cast<double>(n)), 1e-6);
      }
      for (int d = 0; d < 512; ++d) {
        const double want = n ? static_cast<double>(sum[d] / n) : 0.0;
        ASSERT_NEAR(c.out.get(r * 512 + d), want, std::fabs(want) * 0x1p-7 + 1e-6) << b << " " << d;
      }
    }
  }
}

// Rows without a counted key in either cache (lengths 0, or only -1): zeros and LSE -inf, a
// sink notwithstanding.
TEST(Model1Reference, RowsWithoutKeysGiveZerosAndMinusInf) {
  DECA_SEED_TRACE();
  auto rng = make_rng(73);
  Model1Spec s = ragged_spec(2);
  s.attn_sink = true;
  Model1Case c = build_model1_case(s, rng);
  c.topk_length.data<std::int32_t>()[0] = 0;
  c.extra_topk_length.data<std::int32_t>()[0] = 0;
  for (int k = 0; k < s.topk; ++k) c.indices.data<std::int32_t>()[s.topk + k] = -1;
  for (int k = 0; k < s.extra_topk; ++k) c.extra_indices.data<std::int32_t>()[s.extra_topk + k] = -1;
  mla_decode_sparse(plan_mla_decode(c.config), c.args);
  for (std::int64_t r = 0; r < 2 * s.num_heads; ++r) {
    EXPECT_EQ(c.lse.data<float>()[r], -INFINITY) << r;
    for (int d = 0; d < 512; ++d) ASSERT_EQ(c.out.get(r * 512 + d), 0.f) << r << " " << d;
  }
}

}  // namespace
}  // namespace deca::test
