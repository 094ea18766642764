// Test fixtures for the API layer: small valid calls (GQA, MLA dense / sparse, combine) built on
// host tensors, which a test then breaks in exactly one way. Outputs are filled with a poison
// byte pattern so that a test can tell whether a rejected call wrote anything.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/host_tensor.hpp"
#include "deca/deca.hpp"

// An inline namespace of its own: deca_test_api also links tests/common's paged_gqa_case.hpp
// (through the differential tests), whose deca::test::GqaCase is another struct. Two classes of
// one name in one program break the one-definition rule (their inline destructors are merged by
// the linker: the api tests crashed in ~GqaCase); here it is deca::test::api_cases::GqaCase.
namespace deca::test {
inline namespace api_cases {

inline constexpr std::uint8_t kPoison = 0xA5;

inline bool all_bytes_are(const HostTensor& t, std::uint8_t b) {
  const auto* p = static_cast<const std::uint8_t*>(t.raw());
  for (std::size_t i = 0; i < t.bytes(); ++i) {
    if (p[i] != b) return false;
  }
  return true;
}

// Runs `call`; passes when it throws deca::Error whose message contains every needle and every
// tensor in `outputs` still holds only poison bytes.
inline ::testing::AssertionResult rejected(const std::function<void()>& call,
                                           std::initializer_list<std::string> needles,
                                           std::initializer_list<const HostTensor*> outputs) {
  std::string message;
  try {
    call();
    return ::testing::AssertionFailure() << "no deca::Error was thrown";
  } catch (const Error& e) {
    message = e.what();
  }
  // DECA_TEST_VERBOSE=1 prints every message, to read them as a user would.
  if (const char* v = std::getenv("DECA_TEST_VERBOSE"); v && *v == '1') {
    std::printf("    message: %s\n", message.c_str());
  }
  for (const std::string& n : needles) {
    if (message.find(n) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << n << "\"";
    }
  }
  for (const HostTensor* t : outputs) {
    if (!all_bytes_are(*t, kPoison)) {
      return ::testing::AssertionFailure()
             << "an output was written by a rejected call (\"" << message << "\")";
    }
  }
  return ::testing::AssertionSuccess() << message;
}

// What precompile_gqa_decode and precompile_mla_decode (`fn`) both refuse before NVRTC runs:
// a compute capability NVRTC does not target (below 8.0, or unknown), and none at all (0) for a
// config on the CPU or on a CUDA device that does not exist (which, given a capability, is never
// looked at). precompile(cc, device) makes the call with a valid config on `device`.
inline void expect_precompile_capability_checks(const std::string& fn,
                                                const std::function<void(int, Device)>& precompile) {
  for (int cc : {-90, 52, 75, 79, 91, 95}) {
    EXPECT_TRUE(rejected([&] { precompile(cc, Device::cpu()); },
                         {fn + ": compute_capability", "80", "got " + std::to_string(cc)}, {}))
        << cc;
  }
  EXPECT_TRUE(rejected([&] { precompile(0, Device::cpu()); },
                       {fn + ": config.device", "a CUDA device", "compute_capability", "got cpu"}, {}));
  EXPECT_TRUE(
      rejected([&] { precompile(0, Device::cuda(4096)); }, {fn + ": config.device", "got cuda:4096"}, {}));
}

// A view of `t` with its own shape and strides (elements) and a byte offset from its start.
inline TensorView view_as(const HostTensor& t, std::initializer_list<std::int64_t> shape,
                          std::initializer_list<std::int64_t> strides,
                          std::size_t byte_offset = 0) {
  auto* base = static_cast<std::uint8_t*>(const_cast<void*>(t.raw()));
  return make_tensor(base + byte_offset, t.dtype(), shape, strides);
}

// GQA: 2 requests, 4 q heads over 2 KV heads, head_dim 32, pages of 4 tokens, a pool of 6 pages,
// 4 page-table columns; seq_lens {5, 9}; LSE on.
struct GqaCase {
  GqaConfig config;
  int batch = 2;
  int q_len = 1;
  int num_pages = 6;
  int max_pages = 4;
  std::vector<int> lens = {5, 9};

  HostTensor q, k, v, page_table, seq_lens, out, lse, tree_mask, sinks, k_scales, v_scales;
  GqaDecodeArgs args;

  GqaCase() {
    config.num_q_heads = 4;
    config.num_kv_heads = 2;
    config.head_dim = 32;
    config.page_size = 4;
    config.max_batch = 2;
    config.max_q_len = 4;
    config.max_seq_len = 16;
    config.lse = true;
  }

  GqaPlan plan() const { return plan_gqa_decode(config); }

  // Allocates every tensor for the current config and sizes, fills inputs, poisons outputs.
  void build() {
    const int hq = config.num_q_heads, hk = config.num_kv_heads, d = config.head_dim;
    const int ps = config.page_size;
    q = HostTensor(config.q_dtype, {batch, q_len, hq, d});
    const bool nhd = config.layout == KvLayout::kNHD;
    std::vector<std::int64_t> cache_shape = nhd ? std::vector<std::int64_t>{num_pages, ps, hk, d}
                                                : std::vector<std::int64_t>{num_pages, hk, ps, d};
    k = HostTensor(config.kv_dtype, cache_shape);
    v = HostTensor(config.kv_dtype, cache_shape);
    page_table = HostTensor(DType::kINT32, {batch, max_pages});
    seq_lens = HostTensor(DType::kINT32, {batch});
    out = HostTensor(config.out_dtype, {batch, q_len, hq, d});
    lse = HostTensor(DType::kFP32, {batch, q_len, hq});
    tree_mask = HostTensor(DType::kUINT32, {batch, q_len, (q_len + 31) / 32});
    sinks = HostTensor(DType::kFP32, {hq});
    k_scales = HostTensor(DType::kFP32, {hk});
    v_scales = HostTensor(DType::kFP32, {hk});

    for (std::int64_t i = 0; i < q.numel(); ++i)
      q.set(i, static_cast<float>(i % 7) * 0.125f - 0.375f);
    for (std::int64_t i = 0; i < k.numel(); ++i) k.set(i, static_cast<float>(i % 5) * 0.25f - 0.5f);
    for (std::int64_t i = 0; i < v.numel(); ++i) v.set(i, static_cast<float>(i % 9) - 4.f);
    // Request b uses pages in reverse order from the end of the pool; unused columns hold a huge
    // id that only a wrong check (or a wrong read) would touch.
    for (int b = 0; b < batch; ++b) {
      const int len = b < static_cast<int>(lens.size()) ? lens[b] : 1;
      seq_lens.data<std::int32_t>()[b] = len;
      const int used = (len + ps - 1) / ps;
      for (int j = 0; j < max_pages; ++j) {
        page_table.data<std::int32_t>()[b * max_pages + j] =
            j < used ? (num_pages - 1 - (b * 2 + j) % num_pages) : 0x3FFFFFFF;
      }
    }
    for (std::int64_t i = 0; i < tree_mask.numel(); ++i) tree_mask.data<std::uint32_t>()[i] = ~0u;
    for (int h = 0; h < hq; ++h) sinks.data<float>()[h] = 0.5f;
    for (int h = 0; h < hk; ++h) k_scales.data<float>()[h] = v_scales.data<float>()[h] = 1.f;
    poison();

    args = GqaDecodeArgs{};
    args.q = q.view();
    args.k_cache = k.view();
    args.v_cache = v.view();
    args.page_table = page_table.view();
    args.seq_lens = seq_lens.view();
    args.out = out.view();
    if (config.lse) args.lse = lse.view();
    if (config.tree_mask) args.tree_mask = tree_mask.view();
    if (config.sinks) args.sinks = sinks.view();
    if (config.per_head_kv_scale) {
      args.k_scales = k_scales.view();
      args.v_scales = v_scales.view();
    }
  }

  void poison() {
    out.fill_bytes(kPoison);
    lse.fill_bytes(kPoison);
  }

  ::testing::AssertionResult rejects(std::initializer_list<std::string> needles) const {
    const GqaPlan p = plan();
    const GqaDecodeArgs a = args;
    return rejected([&] { gqa_decode(p, a); }, needles, {&out, &lse});
  }
  ::testing::AssertionResult plan_rejects(std::initializer_list<std::string> needles) const {
    const GqaConfig c = config;
    return rejected([&] { plan_gqa_decode(c); }, needles, {});
  }
};

// MLA dense / sparse: 2 requests, 2 heads, pages of 4 tokens, 5 blocks.
struct MlaCase {
  MlaConfig config;
  int batch = 2;
  int q_len = 1;
  int num_blocks = 5;
  int max_blocks = 3;
  std::vector<int> lens = {3, 9};

  HostTensor q, kv, kv_bf16, block_table, seqlens, indices, topk_length, attn_sink, out, lse;
  float kv_scale = 1.f;  // dense kFP8E4M3: the scale quantize_mla_fp8_e4m3 chose
  MlaDenseArgs dense;
  MlaSparseArgs sparse;

  explicit MlaCase(bool is_sparse) {
    config.num_heads = 2;
    config.page_size = 4;
    config.sparse = is_sparse;
    config.max_batch = 2;
    config.max_q_len = 2;
    config.max_seq_len = is_sparse ? 0 : 12;
    config.topk = is_sparse ? 4 : 0;
    config.lse = true;
  }

  MlaPlan plan() const { return plan_mla_decode(config); }

  void build() {
    const int h = config.num_heads, ps = config.page_size;
    q = HostTensor(DType::kBF16, {batch, q_len, h, kMlaDimQK});
    out = HostTensor(DType::kBF16, {batch, q_len, h, kMlaDimV});
    lse = HostTensor(DType::kFP32, {batch, q_len, h});
    for (std::int64_t i = 0; i < q.numel(); ++i) q.set(i, static_cast<float>(i % 5) * 0.0625f);
    if (config.sparse) {
      HostTensor plain(DType::kBF16, {num_blocks, ps, 1, kMlaDimQK});
      for (std::int64_t i = 0; i < plain.numel(); ++i)
        plain.set(i, static_cast<float>(i % 11) - 5.f);
      kv = HostTensor(DType::kUINT8, {num_blocks, ps, 1, kMlaFp8TokenBytes});
      pack_mla_fp8(plain.view(), kv.view());
      const int topk = config.topk;
      indices = HostTensor(DType::kINT32, {batch, q_len, topk});
      const int tokens = num_blocks * ps;
      for (std::int64_t i = 0; i < indices.numel(); ++i) {
        indices.data<std::int32_t>()[i] = (i % 3 == 2) ? -1 : static_cast<int>((i * 7) % tokens);
      }
      topk_length = HostTensor(DType::kINT32, {batch});
      for (int b = 0; b < batch; ++b) topk_length.data<std::int32_t>()[b] = topk - b % 2;
      attn_sink = HostTensor(DType::kFP32, {h});
      for (int i = 0; i < h; ++i) attn_sink.data<float>()[i] = 0.25f;
    } else {
      // The bf16 values; the 8-bit formats quantize them (kv_bf16 keeps them for comparisons).
      kv_bf16 = HostTensor(DType::kBF16, {num_blocks, ps, 1, kMlaDimQK});
      for (std::int64_t i = 0; i < kv_bf16.numel(); ++i) {
        kv_bf16.set(i, static_cast<float>(i % 11) - 5.f);
      }
      kv_scale = 1.f;
      if (config.kv_format == MlaCacheFormat::kFP8E4M3) {
        kv = HostTensor(DType::kFP8E4M3, {num_blocks, ps, 1, kMlaDimQK});
        kv_scale = quantize_mla_fp8_e4m3(kv_bf16.view(), kv.view());
      } else if (config.kv_format == MlaCacheFormat::kFP8Sparse) {
        kv = HostTensor(DType::kUINT8, {num_blocks, ps, 1, kMlaFp8TokenBytes});
        pack_mla_fp8(kv_bf16.view(), kv.view());
      } else {
        kv = HostTensor(kv_bf16);
      }
      block_table = HostTensor(DType::kINT32, {batch, max_blocks});
      seqlens = HostTensor(DType::kINT32, {batch});
      for (int b = 0; b < batch; ++b) {
        seqlens.data<std::int32_t>()[b] = lens[b];
        const int used = (lens[b] + ps - 1) / ps;
        for (int j = 0; j < max_blocks; ++j) {
          block_table.data<std::int32_t>()[b * max_blocks + j] =
              j < used ? (b + 2 * j) % num_blocks : 0x3FFFFFFF;
        }
      }
    }
    out.fill_bytes(kPoison);
    lse.fill_bytes(kPoison);

    dense = MlaDenseArgs{};
    sparse = MlaSparseArgs{};
    if (config.sparse) {
      sparse.q = q.view();
      sparse.kv_cache = kv.view();
      sparse.indices = indices.view();
      if (config.topk_length) sparse.topk_length = topk_length.view();
      if (config.attn_sink) sparse.attn_sink = attn_sink.view();
      sparse.out = out.view();
      if (config.lse) sparse.lse = lse.view();
    } else {
      dense.q = q.view();
      dense.kv_cache = kv.view();
      dense.kv_scale = kv_scale;
      dense.block_table = block_table.view();
      dense.cache_seqlens = seqlens.view();
      dense.out = out.view();
      if (config.lse) dense.lse = lse.view();
    }
  }

  ::testing::AssertionResult rejects(std::initializer_list<std::string> needles) const {
    const MlaPlan p = plan();
    if (config.sparse) {
      const MlaSparseArgs a = sparse;
      return rejected([&] { mla_decode_sparse(p, a); }, needles, {&out, &lse});
    }
    const MlaDenseArgs a = dense;
    return rejected([&] { mla_decode_dense(p, a); }, needles, {&out, &lse});
  }
};

// combine: 3 splits, 2 requests, q_len 1, 2 heads, dim_v 16.
struct CombineCase {
  int splits = 3, batch = 2, q_len = 1, heads = 2, dim_v = 16;
  DType out_dtype = DType::kFP32;
  HostTensor partial_out, partial_lse, sink, out, lse;
  CombineArgs args;

  void build() {
    partial_out = HostTensor(DType::kFP32, {splits, batch, q_len, heads, dim_v});
    partial_lse = HostTensor(DType::kFP32, {splits, batch, q_len, heads});
    sink = HostTensor(DType::kFP32, {heads});
    out = HostTensor(out_dtype, {batch, q_len, heads, dim_v});
    lse = HostTensor(DType::kFP32, {batch, q_len, heads});
    for (std::int64_t i = 0; i < partial_out.numel(); ++i) {
      partial_out.data<float>()[i] = static_cast<float>(i % 13) - 6.f;
    }
    for (std::int64_t i = 0; i < partial_lse.numel(); ++i) {
      partial_lse.data<float>()[i] = static_cast<float>(i % 4) * 0.5f;
    }
    for (int h = 0; h < heads; ++h) sink.data<float>()[h] = 0.f;
    out.fill_bytes(kPoison);
    lse.fill_bytes(kPoison);
    args = CombineArgs{};
    args.partial_out = partial_out.view();
    args.partial_lse = partial_lse.view();
    args.out = out.view();
    args.lse = lse.view();
  }

  ::testing::AssertionResult rejects(std::initializer_list<std::string> needles) const {
    const CombineArgs a = args;
    return rejected([&] { combine(a); }, needles, {&out, &lse});
  }
};

}  // namespace api_cases
}  // namespace deca::test
