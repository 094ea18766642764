#include "shape_spec.hpp"

#include <charconv>
#include <map>
#include <string_view>

#include "deca/error.hpp"

namespace deca::bench {

const char* const kShapeHelp =
    "a GQA case of your own model, repeatable: comma-separated key=value with keys "
    "b (batch, default 1), s (seq_len: N or uniform:LO:HI for ragged lengths), hq (query heads), "
    "hkv (KV heads), d (head_dim, default 128), p (page size, default 64), "
    "kv (bf16 | fp16 | fp8 | int8, default bf16), q (q_len, default 1); "
    "e.g. b=64,s=4096,hq=64,hkv=8,d=128,p=32,kv=fp8,q=1";

namespace {

[[noreturn]] void bad(const std::string& spec, std::string_view key, std::string_view expected,
                      std::string_view got) {
  throw Error("deca-bench: --shape '" + spec + "': " + std::string(key) + ": expected " +
              std::string(expected) + ", got '" + std::string(got) + "'");
}

int to_int(const std::string& spec, std::string_view key, std::string_view text, int lo) {
  int v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || v < lo) {
    bad(spec, key, "an integer >= " + std::to_string(lo), text);
  }
  return v;
}

}  // namespace

BenchCase parse_shape(const std::string& spec) {
  std::map<std::string, std::string, std::less<>> kv;
  std::string_view rest = spec;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) bad(spec, item, "key=value", item);
    const std::string key(item.substr(0, eq));
    static const char* const kKeys[] = {"b", "s", "hq", "hkv", "d", "p", "kv", "q"};
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) bad(spec, "key", "one of b, s, hq, hkv, d, p, kv, q", key);
    if (!kv.emplace(key, std::string(item.substr(eq + 1))).second) {
      bad(spec, key, "once", "a second value " + std::string(item.substr(eq + 1)));
    }
  }
  for (const char* required : {"s", "hq", "hkv"}) {
    if (!kv.count(required)) bad(spec, required, "a value (s, hq and hkv have no default)", "");
  }
  auto get = [&](const char* key, int fallback, int lo) {
    auto it = kv.find(key);
    return it == kv.end() ? fallback : to_int(spec, key, it->second, lo);
  };
  GqaShape s;
  s.batch = get("b", 1, 1);
  s.num_q_heads = get("hq", 0, 1);
  s.num_kv_heads = get("hkv", 0, 1);
  s.head_dim = get("d", 128, 1);
  s.page_size = get("p", 64, 1);
  s.q_len = get("q", 1, 1);
  const std::string& len = kv.at("s");
  if (len.rfind("uniform:", 0) == 0) {
    const std::string_view range = std::string_view(len).substr(8);
    const auto colon = range.find(':');
    if (colon == std::string_view::npos) bad(spec, "s", "uniform:LO:HI", len);
    const int lo = to_int(spec, "s (LO)", range.substr(0, colon), 1);
    const int hi = to_int(spec, "s (HI)", range.substr(colon + 1), lo);
    s.lengths = draw_lengths(s.batch, lo, hi, 1);
    s.seq_len = hi;
  } else {
    s.seq_len = to_int(spec, "s", len, 1);
  }
  const std::string dtype = kv.count("kv") ? kv.at("kv") : "bf16";
  if (dtype == "bf16") {
    s.kv_dtype = DType::kBF16;
  } else if (dtype == "fp16") {
    s.kv_dtype = DType::kFP16;
  } else if (dtype == "fp8" || dtype == "fp8_e4m3") {
    s.kv_dtype = DType::kFP8E4M3;
  } else if (dtype == "int8") {
    s.kv_dtype = DType::kINT8;
  } else {
    bad(spec, "kv", "bf16, fp16, fp8 or int8", dtype);
  }
  if (s.q_len > s.seq_len) bad(spec, "q", "at most s (the drafts are part of the cache)", kv.at("q"));
  BenchCase c;
  c.name = spec;
  c.family = Family::kGqa;
  c.gqa = s;
  c.source = "--shape";
  return c;
}

}  // namespace deca::bench
