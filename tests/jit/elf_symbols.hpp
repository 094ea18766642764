// Reads the names in an ELF64 file's .symtab (cubins are ELF64, little-endian): enough to check
// that a compiled cubin defines the expected kernel symbol, without a GPU or cuobjdump.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace deca::jit::testing {

// Symbol names, or an empty vector when `elf` is not a well-formed little-endian ELF64.
inline std::vector<std::string> elf_symbol_names(const std::vector<char>& elf) {
  auto rd = [&](std::size_t off, int bytes, std::uint64_t* out) {
    if (off + bytes > elf.size()) return false;
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(elf[off + i]);
    *out = v;
    return true;
  };
  std::vector<std::string> names;
  if (elf.size() < 64 || std::memcmp(elf.data(), "\x7f" "ELF", 4) != 0 || elf[4] != 2 || elf[5] != 1) {
    return names;
  }
  std::uint64_t shoff = 0, shentsize = 0, shnum = 0;
  if (!rd(0x28, 8, &shoff) || !rd(0x3a, 2, &shentsize) || !rd(0x3c, 2, &shnum)) return names;
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const std::size_t sh = shoff + i * shentsize;
    std::uint64_t type = 0, offset = 0, size = 0, link = 0, entsize = 0;
    if (!rd(sh + 4, 4, &type) || !rd(sh + 0x18, 8, &offset) || !rd(sh + 0x20, 8, &size) ||
        !rd(sh + 0x28, 4, &link) || !rd(sh + 0x38, 8, &entsize)) {
      return {};
    }
    if (type != 2 /* SHT_SYMTAB */ || entsize < 24) continue;
    std::uint64_t str_off = 0, str_size = 0;
    const std::size_t strsh = shoff + link * shentsize;
    if (!rd(strsh + 0x18, 8, &str_off) || !rd(strsh + 0x20, 8, &str_size)) return {};
    for (std::uint64_t s = offset; s + entsize <= offset + size; s += entsize) {
      std::uint64_t name = 0;
      if (!rd(s, 4, &name) || name >= str_size || str_off + str_size > elf.size()) return {};
      const char* p = elf.data() + str_off + name;
      names.emplace_back(p, strnlen(p, str_size - name));
    }
  }
  return names;
}

inline bool elf_has_symbol(const std::vector<char>& elf, const std::string& name) {
  for (const std::string& n : elf_symbol_names(elf)) {
    if (n == name) return true;
  }
  return false;
}

}  // namespace deca::jit::testing
