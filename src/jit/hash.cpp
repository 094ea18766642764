#include "jit/hash.hpp"

namespace deca::jit {

Fnv1a64& Fnv1a64::bytes(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    state_ ^= p[i];
    state_ *= kPrime;
  }
  return *this;
}

Fnv1a64& Fnv1a64::field(std::string_view s) {
  field(static_cast<std::int64_t>(s.size()));
  return bytes(s.data(), s.size());
}

Fnv1a64& Fnv1a64::field(std::int64_t v) {
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i));
  return bytes(le, sizeof(le));
}

std::uint64_t fnv1a64(const void* data, std::size_t size) {
  return Fnv1a64().bytes(data, size).value();
}

std::string to_hex(std::uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 0xf];
  return s;
}

}  // namespace deca::jit
