// The GQA kernels a SASS comparison covers (docs/perf-notes.md, "SASS unchanged"): a matrix of
// plan configs (every KV dtype and 8-bit path per arch, head_dim 64 / 128 / 256, q_len 1 / 2 / 4 / 8
// with tree masks, checked mode, window + soft-cap + sinks at a page size and group that are not
// powers of two, fp16 q with fp8 out at page 1, beams, the l70-b99-4k grid's two stages, fixed
// splits, one long request, group 128, sm_90's fp8 fused step and skip-softmax) compiled by precompile_gqa_decode for sm_90a, sm_89 and
// sm_80 into $DECA_CACHE_DIR, two at a time; prints "arch name" per distinct kernel. Build it
// against the library of each tree to compare, run it with a fresh cache directory for each, and
// compare them with tools/sass_diff.py:
//
//   g++ -std=c++20 -O1 -Iinclude tools/gqa_sass_matrix.cpp -o /tmp/gqa_sass_matrix \
//       -Lbuild/src -ldeca -Wl,-rpath,$PWD/build/src -lpthread
//   DECA_CACHE_DIR=/tmp/after /tmp/gqa_sass_matrix
//   python3 tools/sass_diff.py /tmp/before /tmp/after
#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "deca/gqa.hpp"

using namespace deca;

int main() {
  std::vector<std::pair<int, GqaConfig>> cfgs;
  auto add = [&](int arch, GqaConfig c) { cfgs.push_back({arch, c}); };
  auto base = [](int qh, int kvh, int d, int page, DType kv) {
    GqaConfig c;
    c.num_q_heads = qh, c.num_kv_heads = kvh, c.head_dim = d, c.page_size = page;
    c.kv_dtype = kv, c.max_batch = 8, c.max_seq_len = 4096, c.max_q_len = 1;
    c.checked = false;
    return c;
  };
  const DType kvs[] = {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kINT8};
  auto plain = [&](int d, DType kv) {
    GqaConfig c = base(64, 8, d, 64, kv);
    c.q_dtype = kv == DType::kFP16 ? DType::kFP16 : DType::kBF16;
    c.out_dtype = c.q_dtype;
    return c;
  };
  auto feat = [&](int d, DType kv) {  // group 5, page 48, window, soft-cap, sinks
    GqaConfig f = base(10, 2, d, 48, kv);
    f.window = 128, f.softcap = 30.f, f.sinks = true;
    return f;
  };
  auto spec = [&](int d, DType kv, int q_len) {
    GqaConfig c = plain(d, kv);
    c.max_q_len = q_len, c.tree_mask = true;
    return c;
  };
  auto beams = [&](int d, DType kv) {
    GqaConfig b = base(32, 4, d, 16, kv);
    b.beam_width = 4, b.max_batch = 16;
    return b;
  };
  auto chk = [](GqaConfig c) { c.checked = true; return c; };
  // sm_90: every kernel class a plan selects there.
  for (DType kv : kvs) {
    for (int d : {64, 128, 256}) {
      add(90, plain(d, kv));
      add(90, chk(plain(d, kv)));
    }
    add(90, spec(128, kv, 2));
    add(90, spec(128, kv, 4));
    add(90, spec(128, kv, 8));
    add(90, chk(spec(128, kv, 8)));
    add(90, feat(128, kv));
    add(90, chk(feat(128, kv)));
    GqaConfig g = base(12, 1, 128, 1, kv);  // fp16 q, fp8 out, page 1, group 12
    g.q_dtype = DType::kFP16, g.out_dtype = DType::kFP8E4M3;
    add(90, g);
    add(90, beams(128, kv));
    GqaConfig l = base(64, 8, 128, 32, kv);  // l70-b99-4k: two stages on sm_90
    l.max_batch = 99;
    add(90, l);
    add(90, chk(l));
    l.split_mode = SplitMode::kFixed, l.split_tokens = 512;
    add(90, l);
    GqaConfig one = base(64, 8, 128, 64, kv);  // l70-b1-128k: splits
    one.max_batch = 1, one.max_seq_len = 131072;
    add(90, one);
    GqaConfig grp = base(128, 1, 128, 32, kv);  // group 128: row blocks of 64
    add(90, grp);
  }
  add(90, feat(256, DType::kBF16));
  add(90, feat(256, DType::kINT8));
  add(90, feat(64, DType::kFP8E4M3));
  add(90, chk(beams(128, DType::kFP8E4M3)));
  add(90, chk(beams(128, DType::kBF16)));
  add(90, beams(256, DType::kINT8));
  // sm_90's fp8 fused step (rope) and skip-softmax kernels (sm90/append.cuh, sm90/skip.cuh).
  GqaConfig fz = plain(128, DType::kFP8E4M3);
  fz.rope_style = RopeStyle::kNeox;
  add(90, fz);
  add(90, chk(spec(128, DType::kFP8E4M3, 4)));
  fz.max_q_len = 4;
  add(90, chk(fz));
  GqaConfig sk = plain(128, DType::kFP8E4M3);
  sk.skip_softmax_factor = 0.5f;
  add(90, sk);
  add(90, chk(sk));
  // sm_89 and sm_80: the portable kernel's paths there.
  for (int arch : {89, 80}) {
    for (int d : {64, 128, 256}) add(arch, plain(d, DType::kFP8E4M3));
    add(arch, chk(plain(128, DType::kFP8E4M3)));
    add(arch, spec(128, DType::kFP8E4M3, 8));
    add(arch, feat(128, DType::kFP8E4M3));
    add(arch, beams(128, DType::kFP8E4M3));
    add(arch, plain(128, DType::kINT8));
    add(arch, plain(256, DType::kINT8));
    add(arch, plain(128, DType::kBF16));
    add(arch, spec(128, DType::kBF16, 4));
  }
  std::mutex mu;
  std::set<std::string> seen;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (;;) {
      const size_t i = next++;
      if (i >= cfgs.size()) return;
      try {
        const std::string name = precompile_gqa_decode(cfgs[i].second, cfgs[i].first);
        std::lock_guard<std::mutex> lock(mu);
        if (seen.insert(name).second) std::printf("%d %s\n", cfgs[i].first, name.c_str()), std::fflush(stdout);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        std::printf("ERROR %zu: %s\n", i, e.what());
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t) ts.emplace_back(work);
  for (auto& t : ts) t.join();
  std::fprintf(stderr, "%zu configs, %zu kernels\n", cfgs.size(), seen.size());
}
