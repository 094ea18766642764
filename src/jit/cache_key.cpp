#include "jit/cache_key.hpp"

#include "jit/embedded.hpp"
#include "jit/hash.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::jit {

std::string CacheKey::str() const { return name + "-" + to_hex(hash); }

std::uint64_t embedded_sources_hash() {
  static const std::uint64_t value = [] {
    std::size_t count = 0;
    const EmbeddedFile* files = embedded_files(&count);
    Fnv1a64 h;
    h.field(static_cast<std::int64_t>(count));
    // All files, not only those a spec includes: finding the included set would need a
    // preprocessor, and a kernel header edit is rare enough that recompiling everything is fine.
    for (std::size_t i = 0; i < count; ++i) h.field(files[i].path).field(files[i].content);
    return h.value();
  }();
  return value;
}

CacheKey cache_key(const JitSpec& spec) {
  validate(spec);
  Fnv1a64 h;
  // A format tag: bump it when the meaning of the fields below changes, or when entries written
  // before may be wrong. v2: v1 entries could hold a log without the ptxas report (NVRTC's own
  // cache had answered the compile; see nvrtc_options), so their disk hits had no PtxasInfo.
  h.field("deca-jit-key-v2");
  h.field(static_cast<std::int64_t>(embedded_sources_hash()));
  h.field(spec.name).field(spec.source).field(spec.entry);
  h.field(static_cast<std::int64_t>(spec.arch));
  const std::vector<std::string> opts = codegen_options(spec);
  h.field(static_cast<std::int64_t>(opts.size()));
  for (const std::string& o : opts) h.field(o);
  h.field(nvrtc_version());
  return CacheKey{spec.name, h.value()};
}

}  // namespace deca::jit
