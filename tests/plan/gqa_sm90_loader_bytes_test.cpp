// The Hopper GQA kernels' loader (kernels/gqa/sm90/tile_loader.cuh) against first principles, for
// every cache dtype it takes (fp8, and bf16 / fp16 unless DECA_GQA_SM90_16BIT=0): the bytes it
// addresses are the ones the CPU reference reads, and a tile's geometry (traits.cuh make_shape)
// moves tokens x head_dim x the element's bytes. GqaParams counts its cache strides in elements;
// a loader that took them as bytes reads, for a 2-byte cache, half-way offsets (other tokens'
// halves, poisoned slots): this fails on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/paged_gqa_case.hpp"
#include "kernels/gqa/sm90/layout.cuh"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::gqa::sm90 {
namespace {

using test::GqaCase;
using test::GqaCaseSpec;

// The loader's byte strides (tile_loader.cuh: cache_bytes of each GqaParams stride).
struct ByteStrides {
  long long head, page, slot;
};
ByteStrides byte_strides(const GqaParams& p, bool v, int kv_bytes) {
  auto b = [&](long long stride) { return kv_bytes == 2 ? cache_bytes<2>(stride) : cache_bytes<1>(stride); };
  return v ? ByteStrides{b(p.v_stride_head), b(p.v_stride_page), b(p.v_stride_slot)}
           : ByteStrides{b(p.k_stride_head), b(p.k_stride_page), b(p.k_stride_slot)};
}

struct LoaderCase {
  DType kv;
  int head_dim;
  int page_size;
  KvLayout layout;
  bool one_allocation;  // K and V interleaved per page in one buffer
};

std::string name_of(const LoaderCase& c) {
  return std::string(dtype_name(c.kv)) + " d" + std::to_string(c.head_dim) + " p" + std::to_string(c.page_size) +
         (c.layout == KvLayout::kNHD ? " nhd" : " hnd") + (c.one_allocation ? " one" : "");
}

const std::vector<LoaderCase>& loader_cases() {
  static const std::vector<LoaderCase> cases = {
      {DType::kFP8E4M3, 128, 16, KvLayout::kNHD, false}, {DType::kFP8E4M3, 128, 1, KvLayout::kHND, true},
      {DType::kBF16, 128, 16, KvLayout::kNHD, false},    {DType::kBF16, 128, 8, KvLayout::kHND, false},
      {DType::kFP16, 128, 1, KvLayout::kNHD, true},      {DType::kBF16, 64, 32, KvLayout::kHND, true},
      {DType::kFP16, 64, 48, KvLayout::kNHD, false},     {DType::kBF16, 256, 64, KvLayout::kNHD, false},
      {DType::kFP16, 256, 16, KvLayout::kHND, true},
  };
  return cases;
}

// Every 16-byte chunk the loader copies for a visible token (request b, key t, kv head h) starts
// at cache + h head + page page + slot slot + 16 c bytes (the loader's sum of its byte strides,
// the page id from the table); decoded there, each of its elements is the stored value the
// reference reads (the case's logical K and V).
TEST(GqaSm90LoaderBytes, ChunksHoldTheStoredValues) {
  for (const LoaderCase& lc : loader_cases()) {
    SCOPED_TRACE(name_of(lc));
    const int kv_bytes = kv_bytes_of(static_cast<int>(lc.kv));
    ASSERT_EQ(static_cast<std::size_t>(kv_bytes), dtype_size(lc.kv));
    GqaCaseSpec s;
    s.batch = 2, s.num_q_heads = 4, s.num_kv_heads = 2, s.head_dim = lc.head_dim, s.page_size = lc.page_size;
    s.kv_dtype = lc.kv, s.layout = lc.layout, s.kv_one_allocation = lc.one_allocation;
    s.seq_lens = {2 * lc.page_size + 3, 5};
    std::mt19937_64 rng(7);
    const GqaCase c = test::build_gqa_case(s, rng);
    const GqaParams& p = c.params;
    for (int v = 0; v < 2; ++v) {
      const ByteStrides bs = byte_strides(p, v == 1, kv_bytes);
      const auto* cache = static_cast<const unsigned char*>(v ? p.v_cache : p.k_cache);
      const test::HostTensor& pool = v && !lc.one_allocation ? c.v_pool : c.k_pool;
      const auto* pool_base = static_cast<const unsigned char*>(pool.raw());
      const auto& logical = v ? c.v_logical : c.k_logical;
      for (int b = 0; b < s.batch; ++b) {
        for (int t = 0; t < c.lens[b]; ++t) {
          const int page = c.page_table.data<int>()[b * c.page_table.shape()[1] + t / s.page_size];
          const int slot = t % s.page_size;
          for (int h = 0; h < s.num_kv_heads; ++h) {
            for (int ch = 0; ch < lc.head_dim * kv_bytes / 16; ++ch) {
              const unsigned char* chunk = cache + h * bs.head + page * bs.page + slot * bs.slot + 16 * ch;
              const std::ptrdiff_t off = chunk - pool_base;
              ASSERT_EQ(off % kv_bytes, 0);
              for (int e = 0; e < 16 / kv_bytes; ++e) {
                const int d = ch * 16 / kv_bytes + e;
                const float want = logical[b][(static_cast<std::size_t>(t) * s.num_kv_heads + h) * lc.head_dim + d];
                ASSERT_EQ(pool.get(off / kv_bytes + e), want) << (v ? "V" : "K") << " b" << b << " t" << t << " h" << h
                                                               << " d" << d;
              }
            }
          }
        }
      }
    }
  }
}

// The byte strides are the element strides times the element's size.
TEST(GqaSm90LoaderBytes, ByteStridesAreElementStridesTimesTheSize) {
  static_assert(cache_bytes<1>(4096) == 4096 && cache_bytes<2>(4096) == 8192);
  EXPECT_EQ(cache_bytes<2>(3LL << 30), 6LL << 30);
}

// A tile's geometry from first principles, at every head_dim and dtype the kernels take and
// every row layout: its tokens x head_dim x element bytes are one 16 KB stage; the loader's
// chunks (threads x loads x 16 B) are that many bytes; a token row is head_dim elements.
TEST(GqaSm90LoaderBytes, TileBytesAreTokensTimesRowBytes) {
  struct Geo {
    DType kv;
    int head_dim, tokens;
  };
  const Geo geos[] = {{DType::kFP8E4M3, 128, 128}, {DType::kBF16, 64, 128}, {DType::kFP16, 64, 128},
                      {DType::kBF16, 128, 64},     {DType::kFP16, 128, 64}, {DType::kBF16, 256, 32},
                      {DType::kFP16, 256, 32}};
  for (const Geo& g : geos) {
    const int kv = static_cast<int>(g.kv);
    const int bytes = static_cast<int>(dtype_size(g.kv));
    ASSERT_TRUE(supports(g.head_dim, kv, 1) || supports_16bit(g.head_dim, kv, 1));
    for (int rows : {8, 16, 32, 64}) {
      SCOPED_TRACE(std::string(dtype_name(g.kv)) + " d" + std::to_string(g.head_dim) + " rows " +
                   std::to_string(rows));
      const Shape sh = make_shape(rows, 0, rows >= 32, kv_bytes_of(kv), g.head_dim);
      EXPECT_EQ(sh.kv_bytes, bytes);
      EXPECT_EQ(sh.tile, g.tokens);
      EXPECT_EQ(sh.row_stride, g.head_dim * bytes);
      EXPECT_EQ(sh.chunks_per_row * 16, g.head_dim * bytes);
      EXPECT_EQ(sh.tile * g.head_dim * bytes, sh.stage_bytes);
      EXPECT_EQ(sh.threads * sh.loads_per_thread * 16, sh.tile * g.head_dim * bytes);
      EXPECT_EQ(sh.pipe_bytes, 2 * sh.stages * sh.tile * g.head_dim * bytes);
    }
  }
}

}  // namespace
}  // namespace deca::gqa::sm90
