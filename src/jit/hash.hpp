// A small, dependency-free 64-bit hash (FNV-1a) for cache keys and file checksums. Not
// cryptographic: it guards against stale and damaged entries, not against an attacker who can
// write to the cache directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deca::jit {

class Fnv1a64 {
 public:
  static constexpr std::uint64_t kOffset = 0xcbf29ce484222325ull;
  static constexpr std::uint64_t kPrime = 0x100000001b3ull;

  Fnv1a64& bytes(const void* data, std::size_t size);
  // Length-prefixed, so that ("ab", "c") and ("a", "bc") hash differently.
  Fnv1a64& field(std::string_view s);
  Fnv1a64& field(std::int64_t v);
  std::uint64_t value() const { return state_; }

 private:
  std::uint64_t state_ = kOffset;
};

std::uint64_t fnv1a64(const void* data, std::size_t size);
// 16 lowercase hex digits.
std::string to_hex(std::uint64_t v);

}  // namespace deca::jit
