// The full cache key of a specialization: its readable name plus a hash of everything that
// decides the generated code, so that a changed kernel header, option, NVRTC or target never
// reuses a stale cubin.
#pragma once

#include <cstdint>
#include <string>

#include "jit/spec.hpp"

namespace deca::jit {

struct CacheKey {
  std::string name;        // spec.name
  std::uint64_t hash = 0;  // of the embedded sources, spec.source/entry, options, NVRTC, arch
  // "<name>-<16 hex digits>": the in-memory map key and the disk file's stem.
  std::string str() const;
};

CacheKey cache_key(const JitSpec& spec);

// The hash of every embedded kernels/ file (path and content), computed once per process.
std::uint64_t embedded_sources_hash();

}  // namespace deca::jit
