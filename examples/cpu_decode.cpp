// GQA decode on the CPU backend: 8 query heads over 2 KV heads, a bf16 cache in pages of 16
// tokens, two requests of 37 and 64 tokens. Plan once per batch shape, run once per layer.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <deca/deca.hpp>

int main() {
  const int batch = 2, q_heads = 8, kv_heads = 2, dim = 128, page = 16, max_pages = 4;
  const int pages = batch * max_pages;
  std::vector<std::uint16_t> q(batch * q_heads * dim), out(q.size());         // bf16 bits
  std::vector<std::uint16_t> k(pages * page * kv_heads * dim), v(k.size());   // NHD pages
  auto fill = [](std::vector<std::uint16_t>& x, float f) {  // any values: sin(f * i)
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = deca::float_to_bf16(std::sin(f * i));
  };
  fill(q, 0.1f), fill(k, 0.3f), fill(v, 0.7f);
  std::vector<std::int32_t> page_table = {7, 2, 5, 0, 1, 6, 3, 4};  // [batch, max_pages]
  std::vector<std::int32_t> seq_lens = {37, 64};                    // the new token included

  // Device::cpu() by default; on a GPU: .device = deca::Device::cuda(0) and device pointers.
  const deca::GqaConfig config{.num_q_heads = q_heads, .num_kv_heads = kv_heads, .head_dim = dim,
                               .page_size = page, .max_batch = batch,
                               .max_seq_len = page * max_pages};
  deca::GqaDecodeArgs args;
  args.q = deca::make_tensor(q.data(), deca::DType::kBF16, {batch, 1, q_heads, dim});
  args.k_cache = deca::make_tensor(k.data(), deca::DType::kBF16, {pages, page, kv_heads, dim});
  args.v_cache = deca::make_tensor(v.data(), deca::DType::kBF16, {pages, page, kv_heads, dim});
  args.page_table = deca::make_tensor(page_table.data(), deca::DType::kINT32, {batch, max_pages});
  args.seq_lens = deca::make_tensor(seq_lens.data(), deca::DType::kINT32, {batch});
  args.out = deca::make_tensor(out.data(), deca::DType::kBF16, {batch, 1, q_heads, dim});
  try {
    const deca::GqaPlan plan = deca::plan_gqa_decode(config);  // once per batch shape
    deca::gqa_decode(plan, args);                               // once per layer
  } catch (const deca::Error& e) {  // names the function, the argument, expected and got
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const float first = deca::bf16_to_float(out[0]), last = deca::bf16_to_float(out.back());
  std::printf("out[0][0][0][0] = %.4f, out[1][0][7][127] = %.4f\n", first, last);
  return std::isfinite(first) && std::isfinite(last) ? 0 : 1;
}
