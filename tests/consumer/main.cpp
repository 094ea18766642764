// Downstream smoke test: a GQA decode on the CPU through the installed public API only.
// V is the same on every token, so each output row must equal its KV head's V row whatever
// the attention weights are: a check that cannot pass by accident.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <deca/deca.hpp>

int main() {
  constexpr int kBatch = 2, kQHeads = 4, kKvHeads = 2, kDim = 64, kPage = 16, kPages = 6;
  const std::vector<std::int32_t> seq_lens = {20, 33};
  const std::vector<std::int32_t> page_table = {4, 1, 0, 0, 5, 2, 3, 0};  // [batch, 4], shuffled

  std::vector<std::uint16_t> q(kBatch * kQHeads * kDim), k(kPages * kPage * kKvHeads * kDim),
      v(k.size()), out(q.size(), 0xFFFF);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = deca::float_to_bf16(std::sin(0.37f * i));
  for (std::size_t i = 0; i < k.size(); ++i) {
    const int d = static_cast<int>(i % kDim), h = static_cast<int>(i / kDim % kKvHeads);
    k[i] = deca::float_to_bf16(std::cos(0.11f * i));
    v[i] = deca::float_to_bf16(0.25f * (h + 1) - 0.01f * d);
  }

  deca::GqaConfig config;
  config.num_q_heads = kQHeads;
  config.num_kv_heads = kKvHeads;
  config.head_dim = kDim;
  config.page_size = kPage;
  config.max_batch = kBatch;
  config.max_seq_len = 64;
  deca::GqaDecodeArgs args;
  args.q = deca::make_tensor(q.data(), deca::DType::kBF16, {kBatch, 1, kQHeads, kDim});
  args.k_cache = deca::make_tensor(k.data(), deca::DType::kBF16, {kPages, kPage, kKvHeads, kDim});
  args.v_cache = deca::make_tensor(v.data(), deca::DType::kBF16, {kPages, kPage, kKvHeads, kDim});
  args.page_table = deca::make_tensor(const_cast<std::int32_t*>(page_table.data()),
                                      deca::DType::kINT32, {kBatch, 4});
  args.seq_lens = deca::make_tensor(const_cast<std::int32_t*>(seq_lens.data()),
                                    deca::DType::kINT32, {kBatch});
  args.out = deca::make_tensor(out.data(), deca::DType::kBF16, {kBatch, 1, kQHeads, kDim});
  try {
    deca::gqa_decode(deca::plan_gqa_decode(config), args);
  } catch (const deca::Error& e) {
    std::fprintf(stderr, "deca_consumer: gqa_decode threw: %s\n", e.what());
    return 1;
  }

  int bad = 0;
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kQHeads; ++h)
      for (int d = 0; d < kDim; ++d) {
        const float got = deca::bf16_to_float(out[(b * kQHeads + h) * kDim + d]);
        const float want = deca::bf16_to_float(deca::float_to_bf16(0.25f * (h / 2 + 1) - 0.01f * d));
        if (!std::isfinite(got) || std::abs(got - want) > 1e-2f) ++bad;
      }
  std::printf("deca %s consumer: %d of %d outputs wrong\n", deca::version(),
              bad, kBatch * kQHeads * kDim);
  return bad == 0 ? 0 : 1;
}
