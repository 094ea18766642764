// What the precompile tests share: the timed call and the disk cache they check its entries in.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "jit/cache_key.hpp"
#include "jit/disk_cache.hpp"
#include "jit/elf_symbols.hpp"

namespace deca::jit::testing {

// Runs precompile() (it returns the kernel's name) and prints how long it took.
inline std::string timed_precompile(const std::function<std::string()>& precompile) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string name = precompile();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[precompile] %s: %.0f ms\n", name.c_str(), ms);
  return name;
}

// The default disk cache directory; empty (and said so) where there is none to check.
inline std::filesystem::path cache_dir_to_check() {
  const std::filesystem::path dir = DiskCache::default_dir();
  if (dir.empty()) {
    std::printf("[precompile] no cache directory (DECA_CACHE_DIR, XDG_CACHE_HOME, HOME unset): "
                "the disk entries are not checked\n");
  }
  return dir;
}

// The disk cache at `dir` holds spec's cubin (exporting its entry); returns the entry.
inline DiskEntry expect_cached(const std::filesystem::path& dir, const JitSpec& spec) {
  DiskCache disk(dir);
  DiskEntry entry;
  const std::string key = cache_key(spec).str();
  EXPECT_EQ(disk.read(key, &entry), DiskRead::hit) << spec.name << ": " << disk.path_for(key);
  EXPECT_TRUE(elf_has_symbol(entry.cubin, spec.entry)) << spec.name;
  return entry;
}

}  // namespace deca::jit::testing
