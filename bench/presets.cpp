#include "presets.hpp"

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <random>
#include <set>

#include "deca/error.hpp"
#include "kernels/mla/params.cuh"

namespace deca::bench {
namespace {

const char* dtype_suffix(DType dtype) {
  switch (dtype) {
    case DType::kFP8E4M3: return "fp8";
    case DType::kINT8: return "int8";
    case DType::kFP16: return "fp16";
    default: return "bf16";
  }
}

struct Table {
  std::vector<BenchCase> cases;

  // One GQA row of docs/benchmarks.md, expanded into one case per kv dtype.
  void gqa(const std::string& name, GqaShape shape, std::initializer_list<DType> kv_dtypes,
           const std::string& source) {
    for (DType dtype : kv_dtypes) {
      BenchCase c;
      c.name = name + "/" + dtype_suffix(dtype);
      c.family = Family::kGqa;
      c.gqa = shape;
      c.gqa.kv_dtype = dtype;
      c.source = source;
      cases.push_back(std::move(c));
    }
  }
  void mla(const std::string& name, MlaShape shape, const std::string& source) {
    BenchCase c;
    c.name = name;
    c.family = Family::kMla;
    c.mla = std::move(shape);
    c.source = source;
    cases.push_back(std::move(c));
  }
  // One dense MLA row, expanded into one case per cache format (MlaKvFormat).
  void mla_dense(const std::string& name, MlaShape shape, std::initializer_list<int> formats,
                 const std::string& source) {
    static const char* const kSuffix[] = {"bf16", "fp8", "fp8-656"};
    for (int f : formats) {
      shape.kv_format = f;
      mla(name + "/" + kSuffix[f], shape, source);
    }
  }
};

GqaShape llama(int q_heads, int kv_heads, int batch, int seq_len, int page) {
  GqaShape s;
  s.num_q_heads = q_heads;
  s.num_kv_heads = kv_heads;
  s.batch = batch;
  s.seq_len = seq_len;
  s.page_size = page;
  return s;
}

MlaShape mla_shape(int heads, int batch, int seq_len, int q_len, bool sparse, int topk) {
  MlaShape s;
  s.num_heads = heads;
  s.batch = batch;
  s.seq_len = seq_len;
  s.q_len = q_len;
  s.sparse = sparse;
  s.topk = topk;
  return s;
}

std::vector<BenchCase> build_table() {
  constexpr DType bf16 = DType::kBF16;
  constexpr DType fp8 = DType::kFP8E4M3;
  // int8 KV on the rows issue 8 tracks: the widening path's speed beside fp8's in one run.
  constexpr DType int8 = DType::kINT8;
  Table t;

  // small: seconds on the CPU reference; lengths off the page grid on purpose.
  t.gqa("small-gqa-b4-1k", llama(16, 4, 4, 1000, 16), {bf16, fp8}, "small: CPU smoke test");
  {
    GqaShape s = llama(16, 2, 6, 1500, 32);
    s.lengths = draw_lengths(6, 1, 1500, 7);
    t.gqa("small-mix-b6", s, {fp8}, "small: ragged lengths 1..1500");
  }
  {
    GqaShape s = llama(16, 4, 2, 300, 16);
    s.q_len = 4;
    s.tree_mask = true;
    t.gqa("small-spec-b2-300/q4", s, {fp8}, "small: speculative decoding, tree mask");
  }
  {
    GqaShape s = llama(16, 4, 4, 700, 16);
    s.head_dim = 64;
    s.window = 128;
    s.sinks = true;
    t.gqa("small-swa-b4-700", s, {bf16}, "small: sliding window 128 + attention sinks");
  }
  t.mla("small-mla-dense-b2-h16-1k", mla_shape(16, 2, 1000, 2, false, 0), "small: MLA dense");
  t.mla_dense("small-mla-dense-b2-h16-1k", mla_shape(16, 2, 1000, 2, false, 0), {1, 2},
              "small: MLA dense, 8-bit caches");
  t.mla("small-mla-sparse-b2-h64-t256", mla_shape(64, 2, 2048, 2, true, 256),
        "small: MLA sparse FP8");

  // GQA decode: docs/benchmarks.md, head_dim 128 unless said, q and output bf16.
  t.gqa("l70-b99-4k", llama(64, 8, 99, 4096, 32), {bf16, fp8, int8}, "XQA perf test (llama 70B)");
  t.gqa("l70-b560-2k", llama(64, 8, 560, 2048, 32), {bf16, fp8, int8}, "XQA perf test");
  t.gqa("l70-b960-512", llama(64, 8, 960, 512, 32), {fp8}, "XQA perf test, huge batch");
  t.gqa("l70-b128-2k", llama(64, 8, 128, 2048, 64), {fp8, int8}, "published H200 figure 3672 GB/s");
  t.gqa("l70-b1-128k", llama(64, 8, 1, 131072, 64), {bf16, fp8}, "long context, one request");
  t.gqa("l70-b1-16k", llama(64, 8, 1, 16384, 64), {bf16, fp8},
        "issue 3 target row (64/8 heads, 1 x 16384): split-KV");
  t.gqa("l70tp8-b32-8k", llama(8, 1, 32, 8192, 64), {bf16, fp8}, "70B at tensor-parallel 8");
  t.gqa("l8-b64-8k", llama(32, 8, 64, 8192, 16), {bf16}, "Llama-3-8B, page 16");
  t.gqa("q235-b64-4k", llama(64, 4, 64, 4096, 64), {bf16, fp8, int8}, "group size 16");
  {
    GqaShape s = llama(64, 8, 64, 4096, 16);
    s.head_dim = 64;
    s.sinks = true;
    GqaShape w = s;
    w.window = 128;
    t.gqa("gptoss-b64-4k/w128", w, {bf16}, "gpt-oss window layer: sinks + window 128");
    t.gqa("gptoss-b64-4k/full", s, {bf16}, "gpt-oss full layer: sinks");
    GqaShape short_ctx = s;
    short_ctx.seq_len = 256;
    t.gqa("gptoss-b64-256", short_ctx, {bf16},
          "reference for the window target: same batch, 256-token requests");
  }
  {
    GqaShape s = llama(32, 16, 32, 8192, 64);
    s.head_dim = 256;
    t.gqa("g3-b32-8k", s, {bf16}, "large head dim");
  }
  t.gqa("mha-b64-4k", llama(32, 32, 64, 4096, 64), {bf16}, "plain MHA (group 1)");
  for (int q_len : {4, 8}) {
    GqaShape s = llama(64, 8, 32, 4096, 64);
    s.q_len = q_len;
    s.tree_mask = true;
    t.gqa("spec-b32-4k/q" + std::to_string(q_len), s, {fp8}, "speculative decoding, tree mask");
  }
  {
    GqaShape s = llama(64, 8, 64, 32768, 64);
    s.lengths = draw_lengths(64, 128, 32768, 64);
    t.gqa("mix-b64", s, {fp8}, "ragged batch, lengths 128..32768 (fixed seed)");
  }

  // anchors: the peers' extra rows (docs/peers.md, page 64), for side-by-side comparison.
  for (int batch : {128, 32, 8}) {
    t.gqa("anchor-l70-b" + std::to_string(batch) + "-16k", llama(64, 8, batch, 16384, 64),
          {bf16, fp8}, "a peers' row");
  }
  t.gqa("anchor-l70-b4-128k", llama(64, 8, 4, 131072, 64), {bf16, fp8}, "a peers' row");

  // sweep: KV bandwidth against batch and length (tools/plot_bench.py draws it).
  for (int batch : {1, 4, 16, 64, 128, 256}) {
    for (int seq_len : {512, 2048, 8192, 32768}) {
      t.gqa("sweep-b" + std::to_string(batch) + "-s" + std::to_string(seq_len),
            llama(64, 8, batch, seq_len, 64), {bf16, fp8}, "sweep: 64/8 heads, d128, page 64");
    }
  }

  // MLA decode: d_qk 576, d_v 512, page 64, q bf16.
  t.mla("mla-dense-b128-h16-4k", mla_shape(16, 128, 4096, 1, false, 0), "memory-bound");
  for (int q_len : {1, 2}) {
    t.mla("mla-dense-b128-h128-8k/q" + std::to_string(q_len),
          mla_shape(128, 128, 8192, q_len, false, 0), "compute-bound");
  }
  {
    MlaShape s = mla_shape(16, 4, 45118, 4, false, 0);
    s.lengths = {4641, 45118, 1730, 1696};
    t.mla("mla-dense-b4-var", s, "ragged, published H100 figures");
  }
  t.mla("mla-sparse-b128-h128-t2k", mla_shape(128, 128, 32768, 2, true, 2048),
        "FlashMLA's 410 TFLOP/s case");
  t.mla("mla-sparse-b128-h64-t2k", mla_shape(64, 128, 32768, 2, true, 2048), "64 heads");
  t.mla("mla-sparse-b148-h128-t16k", mla_shape(128, 148, 65536, 1, true, 16384),
        "FlashMLA's peak case");
  // FlashMLA's measured sparse rows (docs/peers.md; q_len 1, page 64, topk 2048 of 32768 tokens),
  // and 16 heads (tensor parallelism 8), which FlashMLA does not run.
  for (int batch : {128, 64}) {
    for (int heads : {128, 64}) {
      t.mla("mla-sparse-anchor-b" + std::to_string(batch) + "-h" + std::to_string(heads) + "-t2k",
            mla_shape(heads, batch, 32768, 1, true, 2048), "FlashMLA's row (docs/peers.md)");
    }
  }
  t.mla("mla-sparse-anchor-b128-h16-t2k", mla_shape(16, 128, 32768, 1, true, 2048),
        "16 heads: selected-token GB/s target");

  // MODEL1 (DeepSeek V4, 584-byte tokens) against FlashMLA 9241ae3 (docs/peers.md): topk of a
  // context in pages of 256 (+ the extra cache's of a context in pages of 64), and 16 heads.
  auto model1 = [](int heads, int batch, int q_len, int topk, int page, int extra_topk) {
    MlaShape s = mla_shape(heads, batch, std::max(4 * topk, 8192), q_len, true, topk);
    s.kv_format = kMlaKvModel1;
    s.page_size = page;
    s.extra_topk = extra_topk;
    s.extra_page_size = 64;
    s.extra_seq_len = extra_topk > 0 ? 4 * extra_topk : 0;
    return s;
  };
  t.mla("mla-model1-b128-h128-t128-x1024/q2", model1(128, 128, 2, 128, 256, 1024), "FlashMLA MODEL1 row");
  t.mla("mla-model1-b128-h64-t128-x1024/q2", model1(64, 128, 2, 128, 256, 1024), "FlashMLA MODEL1 row");
  t.mla("mla-model1-b64-h128-t128-x512/q2", model1(128, 64, 2, 128, 256, 512), "FlashMLA MODEL1 row");
  t.mla("mla-model1-b128-h128-t2k", model1(128, 128, 1, 2048, 64, 0), "FlashMLA MODEL1 row, no extra");
  t.mla("mla-model1-b148-h128-t16k/q2", model1(128, 148, 2, 16384, 64, 0), "FlashMLA MODEL1 peak row");
  t.mla("mla-model1-b128-h16-t128-x1024/q2", model1(16, 128, 2, 128, 256, 1024),
        "16 heads: selected-token GB/s target");
  t.mla("small-mla-model1-b2-h16-t128-x64/q2", model1(16, 2, 2, 128, 64, 64), "small: MLA MODEL1, two caches");

  // Dense MLA against FlashMLA 9241ae3 (docs/peers.md, page 64), each in bf16 and in fp8 (576 e4m3
  // values a token with one scale); b128 h128 4k also over the 656-byte sparse cache read densely.
  constexpr int kBf16Cache = 0, kE4m3Cache = 1, kTokenCache = 2;
  for (int q_len : {1, 2}) {
    t.mla_dense("mla-dense-anchor-b128-h128-8k/q" + std::to_string(q_len),
                mla_shape(128, 128, 8192, q_len, false, 0), {kBf16Cache, kE4m3Cache},
                "FlashMLA dense row (docs/peers.md): tensor-core bound");
  }
  t.mla_dense("mla-dense-anchor-b64-h128-8k", mla_shape(128, 64, 8192, 1, false, 0),
              {kBf16Cache, kE4m3Cache}, "FlashMLA dense row (docs/peers.md)");
  t.mla_dense("mla-dense-anchor-b128-h128-4k", mla_shape(128, 128, 4096, 1, false, 0),
              {kBf16Cache, kE4m3Cache, kTokenCache}, "FlashMLA dense row (docs/peers.md)");
  t.mla_dense("mla-dense-anchor-b128-h64-8k", mla_shape(64, 128, 8192, 1, false, 0),
              {kBf16Cache, kE4m3Cache}, "FlashMLA dense row (docs/peers.md): memory-bound");
  t.mla_dense("mla-dense-anchor-b64-h64-4k", mla_shape(64, 64, 4096, 1, false, 0),
              {kBf16Cache, kE4m3Cache}, "FlashMLA dense row (docs/peers.md): memory-bound");
  t.mla_dense("mla-dense-anchor-b128-h16-4k", mla_shape(16, 128, 4096, 1, false, 0),
              {kBf16Cache, kE4m3Cache}, "FlashMLA dense row (docs/peers.md): tensor parallel 8");
  t.mla_dense("mla-dense-small-b1-h128-32k", mla_shape(128, 1, 32768, 1, false, 0),
              {kBf16Cache, kE4m3Cache}, "FlashMLA dense row (docs/peers.md): one long request");
  t.mla_dense("mla-dense-small-b4-h16-16k", mla_shape(16, 4, 16384, 1, false, 0),
              {kBf16Cache, kE4m3Cache}, "FlashMLA dense row (docs/peers.md): a few long requests");
  return t.cases;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

struct Group {
  const char* name;
  const char* description;
  bool (*member)(const BenchCase&);
};

const Group kGroups[] = {
    {"small", "tiny GQA + MLA cases, seconds on the CPU",
     [](const BenchCase& c) { return starts_with(c.name, "small-"); }},
    {"gqa", "every named GQA shape (docs/benchmarks.md)",
     [](const BenchCase& c) {
       return c.family == Family::kGqa && !starts_with(c.name, "small-") &&
              !starts_with(c.name, "anchor-") && !starts_with(c.name, "sweep-");
     }},
    {"anchors", "the peers' extra GQA rows (docs/peers.md)",
     [](const BenchCase& c) { return starts_with(c.name, "anchor-"); }},
    {"sweep", "GQA 64/8 d128 page 64, batch 1..256 x seq_len 512..32k, bf16 and fp8",
     [](const BenchCase& c) { return starts_with(c.name, "sweep-"); }},
    {"mla", "every named MLA shape (docs/benchmarks.md)",
     [](const BenchCase& c) { return c.family == Family::kMla && !starts_with(c.name, "small-"); }},
    {"mla-sparse", "every sparse MLA shape, FlashMLA's measured rows included",
     [](const BenchCase& c) {
       return c.family == Family::kMla && starts_with(c.name, "mla-sparse-");
     }},
    {"mla-model1", "every MODEL1 MLA shape (584-byte tokens, a second cache), FlashMLA's rows",
     [](const BenchCase& c) {
       return c.family == Family::kMla && starts_with(c.name, "mla-model1-");
     }},
    {"mla-dense", "every dense MLA shape (docs/benchmarks.md and docs/peers.md rows, bf16 and fp8)",
     [](const BenchCase& c) {
       return c.family == Family::kMla && starts_with(c.name, "mla-dense-");
     }},
    {"all", "gqa + anchors + mla (not sweep)",
     [](const BenchCase& c) { return !starts_with(c.name, "small-") && !starts_with(c.name, "sweep-"); }},
};

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

// Fixed seed: a ragged case must have the same lengths in every run and on every machine, so
// that its figures compare across commits. std::mt19937 is specified bit-exactly; the
// distribution is not, so the draw is done by hand.
std::vector<int> draw_lengths(int count, int lo, int hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> lengths(count);
  const std::uint32_t span = static_cast<std::uint32_t>(hi - lo + 1);
  for (int& len : lengths) len = lo + static_cast<int>(gen() % span);
  return lengths;
}

std::vector<std::string> nearest_presets(const std::string& name, std::size_t count) {
  std::vector<std::pair<std::size_t, std::string>> scored;
  auto consider = [&](const std::string& candidate) {
    scored.emplace_back(edit_distance(name, candidate), candidate);
  };
  for (const Group& g : kGroups) consider(g.name);
  std::set<std::string> shapes;
  for (const BenchCase& c : all_cases()) {
    consider(c.name);
    // A shape name without its /variant selects all variants: suggest it too.
    const auto slash = c.name.find('/');
    if (slash != std::string::npos && shapes.insert(c.name.substr(0, slash)).second) {
      consider(c.name.substr(0, slash));
    }
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && out.size() < count; ++i) {
    out.push_back(scored[i].second);
  }
  return out;
}

const std::vector<BenchCase>& all_cases() {
  static const std::vector<BenchCase> cases = build_table();
  return cases;
}

std::vector<BenchCase> resolve_preset(const std::string& name) {
  std::vector<BenchCase> out;
  for (const Group& g : kGroups) {
    if (name == g.name) {
      for (const BenchCase& c : all_cases())
        if (g.member(c)) out.push_back(c);
      return out;
    }
  }
  for (const BenchCase& c : all_cases())
    if (c.name == name || starts_with(c.name, name + "/")) out.push_back(c);
  if (out.empty()) {
    std::string near;
    for (const std::string& n : nearest_presets(name)) near += (near.empty() ? "" : ", ") + n;
    throw Error("deca-bench: --preset: expected a group (small, gqa, anchors, sweep, mla, "
                "mla-sparse, mla-model1, mla-dense, all) or a case name from --list, got '" + name +
                "'; did you mean: " + near + "?");
  }
  return out;
}

void print_presets(std::ostream& os) {
  os << "groups:\n";
  for (const Group& g : kGroups) {
    int n = 0;
    for (const BenchCase& c : all_cases()) n += g.member(c) ? 1 : 0;
    os << "  " << std::left << std::setw(12) << g.name << std::setw(4) << n << g.description
       << "\n";
  }
  os << "cases (a shape name without its /suffix selects all its variants):\n";
  for (const BenchCase& c : all_cases()) {
    os << "  " << std::left << std::setw(40) << c.name;
    if (c.family == Family::kGqa) {
      const GqaShape& s = c.gqa;
      os << "gqa " << s.num_q_heads << "/" << s.num_kv_heads << " d" << s.head_dim << " "
         << s.batch << "x" << (s.lengths.empty() ? "" : "<=") << s.seq_len << " page "
         << s.page_size;
      if (s.q_len > 1) os << " q_len " << s.q_len;
      if (s.tree_mask) os << " tree";
      if (s.window) os << " window " << s.window;
      if (s.sinks) os << " sinks";
    } else {
      const MlaShape& s = c.mla;
      os << "mla " << (s.sparse ? "sparse" : "dense") << " h" << s.num_heads << " " << s.batch
         << "x" << (s.lengths.empty() ? "" : "<=") << s.seq_len << " q_len " << s.q_len;
      if (s.sparse) os << " topk " << s.topk;
      if (!s.sparse && s.kv_format == 1) os << " e4m3";
      if (!s.sparse && s.kv_format == 2) os << " 656-byte tokens";
    }
    os << "  (" << c.source << ")\n";
  }
}

std::vector<int> request_lengths(const GqaShape& shape) {
  return shape.lengths.empty() ? std::vector<int>(shape.batch, shape.seq_len) : shape.lengths;
}

std::vector<int> request_lengths(const MlaShape& shape) {
  return shape.lengths.empty() ? std::vector<int>(shape.batch, shape.seq_len) : shape.lengths;
}

}  // namespace deca::bench
