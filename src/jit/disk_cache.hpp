// The on-disk cubin cache: one file per cache key, <dir>/<name>-<hash>.cubin, so that a process
// (or a server restart) finds what an earlier one compiled. Safe under concurrent processes and
// crashes: entries are written to a temp file and renamed, and checked on every read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace deca::jit {

struct DiskEntry {
  std::vector<char> cubin;
  std::string log;  // NVRTC's log, kept so a disk hit still reports registers and spills
};

enum class DiskRead { hit, miss, corrupt };

class DiskCache {
 public:
  // An empty `dir` disables the cache (every read misses, writes do nothing).
  explicit DiskCache(std::filesystem::path dir);

  // DECA_CACHE_DIR, else $XDG_CACHE_HOME/deca, else $HOME/.cache/deca; empty if none is set.
  static std::filesystem::path default_dir();

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path_for(const std::string& key) const;

  // A corrupt entry (bad magic, version, size, key or checksum; truncated) is reported on
  // stderr once per file and returned as `corrupt`: the caller recompiles and writes it again.
  DiskRead read(const std::string& key, DiskEntry* out);

  // Atomic: temp file in the same directory, fsync, rename. The first write of an instance also
  // removes temp files that crashed writers left more than ten minutes ago. Returns false when the directory
  // cannot be created or written; the first such failure prints one warning naming the
  // directory and the error.
  bool write(const std::string& key, const DiskEntry& entry);

 private:
  bool ensure_dir();
  void warn_unwritable(const std::string& what);
  void remove_stale_temps();

  std::filesystem::path dir_;
  std::once_flag created_;
  bool dir_ok_ = false;
  std::once_flag warned_;
  std::mutex mu_;
  std::set<std::string> reported_corrupt_;
};

// Bytes of the file format, exposed for tests that damage files on purpose.
namespace disk_format {
inline constexpr char kMagic[8] = {'D', 'E', 'C', 'A', 'C', 'U', 'B', '\0'};
inline constexpr std::uint32_t kVersion = 1;
// magic[8] version:u32 key_size:u32 log_size:u64 cubin_size:u64 checksum:u64, then key, log,
// cubin. The checksum (FNV-1a 64) covers key, log and cubin.
inline constexpr std::size_t kHeaderSize = 8 + 4 + 4 + 8 + 8 + 8;
}  // namespace disk_format

}  // namespace deca::jit
