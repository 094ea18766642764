// The differential test's MODEL1 sparse decode family (DeepSeek V4's 584-byte token, one or two
// caches): common/model1_case.hpp's data as a caller would pass it, run as the V3.2 sparse cases
// are (diff_mla.hpp's MlaDecodeDiff: outputs and LSE against the CPU reference). A layer is what
// a kernel is compiled for (both caches' page sizes, one cache or two, checked or not); heads,
// q_len, both top-k sizes, the pools, ragged lengths (0 included), -1 entries, duplicates, a row
// of only -1, sinks (+-inf heads included), padded block strides and strided views are per case.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/diff_case.hpp"
#include "common/diff_mla.hpp"
#include "common/model1_case.hpp"
#include "deca/mla.hpp"

namespace deca::test::diff {

struct Model1Layer {
  int page_size = 64;
  int extra_page_size = 64;
  bool two_caches = false;
  bool checked = false;
};

inline int model1_page_size(Rng& rng) {
  return edge_or_uniform(rng, 0.5, {1, 2, 61, 64, 256}, 1, 256);
}

// Layer `index` of a pool: the first four take one cache and two, with the edge page sizes;
// checked and unchecked alternate (they run different kernels).
inline Model1Layer draw_model1_layer(Rng& rng, int index) {
  Model1Layer l;
  l.page_size = model1_page_size(rng);
  l.extra_page_size = model1_page_size(rng);
  l.two_caches = chance(rng, 0.6);
  l.checked = index % 2 == 1;
  switch (index) {
    case 0: l.two_caches = false, l.page_size = 64; break;
    case 1: l.two_caches = true, l.page_size = 1, l.extra_page_size = 256; break;
    case 2: l.two_caches = true, l.page_size = 61, l.extra_page_size = 2; break;
    case 3: l.two_caches = false, l.page_size = 256; break;
    default: break;
  }
  return l;
}

struct Model1Draw {
  Model1Spec spec;
  MlaConfig config;  // each side sets its device
  int passes = 1;    // 2: the second GPU run reuses the first's schedule
};

// Blocks of `page` tokens for a pool a row of `topk` entries picks from: a quarter of topk to
// twice it (the ids repeat or spread), at most 4096 tokens.
inline int model1_blocks(Rng& rng, int topk, int page) {
  const int tokens = uniform(rng, std::max(1, topk / 4), std::max(1, std::min(2 * topk, 4096)));
  return std::max(1, (tokens + page - 1) / page);
}

inline Model1Draw draw_model1(Rng& rng, const Model1Layer& l) {
  Model1Draw d;
  Model1Spec& s = d.spec;
  s.page_size = l.page_size;
  s.extra_page_size = l.extra_page_size;
  s.num_heads = edge_or_uniform(
      rng, 0.5, {1, 2, 3, 15, 16, 17, 32, 63, 64, 65, 100, 127, 128}, 1, 128);
  s.q_len = uniform(rng, 1, 4);
  s.topk = chance(rng, 0.5) ? 64 * log_uniform(rng, 1, 32) : log_uniform(rng, 1, 2048);
  s.extra_topk = !l.two_caches ? 0
                 : chance(rng, 0.5) ? 64 * log_uniform(rng, 1, 8)
                                    : log_uniform(rng, 1, 1024);
  s.batch = log_uniform(rng, 1, 16);
  // The reference's work stays bounded: batch x q_len x heads x (topk + extra_topk) keys.
  constexpr std::int64_t kBudget = 1 << 19;
  const auto work = [&] {
    return static_cast<std::int64_t>(s.batch) * s.q_len * s.num_heads * (s.topk + s.extra_topk);
  };
  while (work() > kBudget && s.batch > 1) s.batch = (s.batch + 1) / 2;
  while (work() > kBudget) {
    s.topk = std::max(1, s.topk / 2);
    s.extra_topk = s.extra_topk > 0 ? std::max(1, s.extra_topk / 2) : 0;
  }
  s.blocks = model1_blocks(rng, s.topk, s.page_size);
  s.extra_blocks = s.extra_topk > 0 ? model1_blocks(rng, s.extra_topk, s.extra_page_size) : 1;
  s.topk_length = chance(rng, 0.5);
  s.extra_topk_length = s.extra_topk > 0 && chance(rng, 0.5);
  s.attn_sink = chance(rng, 0.4);
  s.lse = chance(rng, 0.75);
  if (chance(rng, 0.3))
    s.softmax_scale = static_cast<float>(uniform_real(rng, 0.5, 1.5) / std::sqrt(512.0));
  s.block_pad = chance(rng, 0.25) ? 16 * uniform(rng, 1, 4) : 0;
  s.strided = chance(rng, 0.3);
  s.skip = pick(rng, {0.f, 0.05f, 0.15f, 0.5f});
  s.duplicates = uniform(rng, 0, 4);
  s.all_invalid_row = chance(rng, 0.2);

  d.passes = chance(rng, 0.3) ? 2 : 1;
  d.config = model1_config(s);
  draw_sparse_maxima(rng, d.config, 4, l.checked);
  return d;
}

class Model1Diff final : public MlaDecodeDiff<MlaSparseArgs> {
 public:
  Model1Diff(const Model1Draw& d, Rng& rng)
      : MlaDecodeDiff(d.config, d.passes), d_(d), c_(build_model1_case(d.spec, rng)) {
    args_ = c_.args;
    // The pools as host tensors (what a mirror copies), the cache views pointed at them.
    args_.kv_cache = pool_view(c_.kv, kv_bytes_);
    if (c_.spec.extra_topk > 0) args_.extra_kv_cache = pool_view(c_.extra, extra_bytes_);
  }

  Family family() const override { return Family::kMlaModel1; }

  std::string describe() const override {
    const Model1Spec& s = c_.spec;
    const MlaConfig& c = d_.config;
    return "mla_model1 batch=" + std::to_string(s.batch) + " q_len=" + std::to_string(s.q_len) +
           " heads=" + std::to_string(s.num_heads) + " page=" + std::to_string(s.page_size) +
           " blocks=" + std::to_string(s.blocks) + " topk=" + std::to_string(s.topk) +
           " topk_length=" + std::to_string(s.topk_length) + "[" + joined(c_.lens) + "]" +
           " extra_page=" + std::to_string(s.extra_page_size) +
           " extra_blocks=" + std::to_string(s.extra_blocks) +
           " extra_topk=" + std::to_string(s.extra_topk) +
           " extra_topk_length=" + std::to_string(s.extra_topk_length) + "[" +
           joined(c_.extra_lens) + "] skip=" + std::to_string(s.skip) +
           " dups=" + std::to_string(s.duplicates) +
           " invalid_row=" + std::to_string(s.all_invalid_row) +
           " sink=" + std::to_string(s.attn_sink) + " lse=" + std::to_string(s.lse) +
           " softmax_scale=" + std::to_string(s.softmax_scale) +
           " block_pad=" + std::to_string(s.block_pad) + " strided=" + std::to_string(s.strided) +
           " max_batch=" + std::to_string(c.max_batch) +
           " max_q_len=" + std::to_string(c.max_q_len) + " checked=" + std::to_string(c.checked) +
           " passes=" + std::to_string(d_.passes);
  }

  std::vector<HostTensor*> tensors() override {
    return case_tensors({&c_.q, &kv_bytes_, &c_.indices, &c_.out, &c_.lse},
                        {&c_.topk_length, &c_.attn_sink, &extra_bytes_, &c_.extra_indices,
                         &c_.extra_topk_length});
  }

  std::vector<Output> outputs() override {
    std::vector<Output> o = {{"out", &c_.out, args_.out, false}};
    if (c_.spec.lse) o.push_back({"lse", &c_.lse, args_.lse, true});
    return o;
  }

  const Model1Case& model1_case() const { return c_; }

 private:
  // `pool`'s bytes copied into `bytes`, and its [blocks, page, 1, 584] view over the copy.
  static TensorView pool_view(const Model1Pool& pool, HostTensor& bytes) {
    const std::int64_t n = static_cast<std::int64_t>(pool.storage.size() * sizeof(std::uint64_t));
    bytes = HostTensor(DType::kUINT8, {n});
    std::memcpy(bytes.raw(), pool.base(), static_cast<std::size_t>(n));
    TensorView v = pool.view;
    v.data = bytes.raw();
    return v;
  }

  std::vector<TensorView*> views(MlaSparseArgs& a) const override {
    return {&a.q,       &a.kv_cache,       &a.indices,       &a.topk_length,      &a.attn_sink,
            &a.out,     &a.lse,            &a.extra_kv_cache, &a.extra_indices, &a.extra_topk_length};
  }

  Model1Draw d_;
  Model1Case c_;
  HostTensor kv_bytes_, extra_bytes_;
};

}  // namespace deca::test::diff
