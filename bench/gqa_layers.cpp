#include "gqa_layers.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "api/gqa_prepare.hpp"
#include "cuda/backend.hpp"
#include "gpu_timer.hpp"

namespace deca::bench {

LayerTimes time_layers(const GqaPlan& plan, const GqaDecodeArgs& args, std::size_t cache_bytes,
                       const RunOptions& opt) {
  LayerTimes t;
  t.layers = opt.layers;
  // Distinct caches, as a model's layers have: each layer's K and V come from DRAM. One cache
  // read L times would stay partly in L2 on the small rows (a 16k-token request's cache is
  // 32-64 MB), shortening the streaming that the launch overlaps and so overstating the gain.
  std::size_t free_bytes = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const std::size_t per_copy = 2 * std::max<std::size_t>(cache_bytes, 1);
  const std::size_t fit = free_bytes / 2 / per_copy;
  t.caches = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(opt.layers), 1 + fit));
  std::vector<DeviceBuffer> copies;
  std::vector<const void*> k(t.caches), v(t.caches);
  k[0] = args.k_cache.data;
  v[0] = args.v_cache.data;
  for (int c = 1; c < t.caches; ++c) {
    for (int kv = 0; kv < 2; ++kv) {
      DeviceBuffer& b = copies.emplace_back(cache_bytes);
      check_cuda(cudaMemcpy(b.get(), kv ? args.v_cache.data : args.k_cache.data, cache_bytes,
                            cudaMemcpyDeviceToDevice),
                 "cache copy for --layers (cudaMemcpy D2D)");
      (kv ? v : k)[c] = b.get();
    }
  }
  api::check_gqa_decode(plan, args, /*check_workspace=*/true);
  const GqaParams base = api::gqa_params(plan, args, args.workspace);
  std::vector<GqaParams> layer(opt.layers, base);
  for (int i = 0; i < opt.layers; ++i) {
    layer[i].k_cache = k[i % t.caches];
    layer[i].v_cache = v[i % t.caches];
  }
  auto graph_us = [&](bool pdl, std::string& why) {
    int next = 0;
    return opt.timer->time_graph(
        [&](cudaStream_t stream) { cuda::gqa_decode(plan, layer[next++ % opt.layers], stream, true, pdl); },
        opt.layers, 10, &why);
  };
  // Alternated, so that a drift in clocks over the case falls on both figures alike.
  std::vector<double> with, without;
  for (int round = 0; round < 2; ++round) {
    if (auto us = graph_us(false, t.note)) without.push_back(*us);
    if (auto us = graph_us(true, t.note)) with.push_back(*us);
  }
  if (!with.empty()) t.pdl_us = *std::min_element(with.begin(), with.end());
  if (!without.empty()) t.plain_us = *std::min_element(without.begin(), without.end());
  return t;
}

}  // namespace deca::bench
