#include "jit/disk_cache.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "jit/hash.hpp"

namespace deca::jit {

namespace fs = std::filesystem;

namespace {

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::uint64_t checksum(const std::string& key, const std::string& log, const std::vector<char>& cubin) {
  return Fnv1a64().bytes(key.data(), key.size()).bytes(log.data(), log.size())
      .bytes(cubin.data(), cubin.size()).value();
}

// Writes all of `data` to a new file and fsyncs it, so that the rename publishes complete bytes
// even across a power loss. Returns an error text, empty on success.
std::string write_synced(const fs::path& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      return err;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    std::string err = std::strerror(errno);
    ::close(fd);
    return err;
  }
  return ::close(fd) == 0 ? std::string() : std::strerror(errno);
}

fs::path temp_path(const fs::path& final_path) {
  static std::atomic<std::uint64_t> counter{0};
  const std::size_t tid = std::hash<std::thread::id>()(std::this_thread::get_id());
  return final_path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(tid) +
         "." + std::to_string(counter.fetch_add(1));
}

}  // namespace

DiskCache::DiskCache(fs::path dir) : dir_(std::move(dir)) {}

fs::path DiskCache::default_dir() {
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* d = env("DECA_CACHE_DIR")) return d;
  if (const char* d = env("XDG_CACHE_HOME")) return fs::path(d) / "deca";
  if (const char* d = env("HOME")) return fs::path(d) / ".cache" / "deca";
  return {};
}

fs::path DiskCache::path_for(const std::string& key) const { return dir_ / (key + ".cubin"); }

void DiskCache::warn_unwritable(const std::string& what) {
  std::call_once(warned_, [&] {
    std::fprintf(stderr,
                 "deca: warning: kernel cache directory \"%s\" is not usable (%s); compiled "
                 "kernels are kept in memory only (set DECA_CACHE_DIR to change it)\n",
                 dir_.c_str(), what.c_str());
  });
}

bool DiskCache::ensure_dir() {
  std::call_once(created_, [&] {
    if (dir_.empty()) {
      warn_unwritable("no directory: DECA_CACHE_DIR, XDG_CACHE_HOME and HOME are unset");
      return;
    }
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec || !fs::is_directory(dir_, ec)) {
      warn_unwritable("cannot create it: " + (ec ? ec.message() : std::string("not a directory")));
      return;
    }
    dir_ok_ = true;
    remove_stale_temps();
  });
  return dir_ok_;
}

void DiskCache::remove_stale_temps() {
  // A process killed between creating its temp file and the rename leaves the temp behind. One
  // older than this is no longer being written (writes take milliseconds).
  constexpr auto kStale = std::chrono::minutes(10);
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".cubin.tmp.") == std::string::npos) continue;
    std::error_code ec2;
    const auto mtime = fs::last_write_time(e.path(), ec2);
    if (!ec2 && now - mtime > kStale) fs::remove(e.path(), ec2);
  }
}

DiskRead DiskCache::read(const std::string& key, DiskEntry* out) {
  if (dir_.empty()) return DiskRead::miss;
  const fs::path path = path_for(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return DiskRead::miss;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  using namespace disk_format;
  std::string problem;
  std::uint64_t key_size = 0, log_size = 0, cubin_size = 0;
  if (bytes.size() < kHeaderSize) {
    problem = "truncated header (" + std::to_string(bytes.size()) + " bytes)";
  } else if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    problem = "bad magic";
  } else if (get_le(bytes.data() + 8, 4) != kVersion) {
    problem = "format version " + std::to_string(get_le(bytes.data() + 8, 4)) + ", expected " +
              std::to_string(kVersion);
  } else {
    key_size = get_le(bytes.data() + 12, 4);
    log_size = get_le(bytes.data() + 16, 8);
    cubin_size = get_le(bytes.data() + 24, 8);
    // Compared piecewise so that a damaged size field cannot overflow the sum.
    const std::uint64_t body = bytes.size() - kHeaderSize;
    if (key_size > body || log_size > body - key_size || cubin_size != body - key_size - log_size) {
      problem = "size mismatch (file " + std::to_string(bytes.size()) + " bytes, header says " +
                std::to_string(kHeaderSize + key_size + log_size + cubin_size) + ")";
    } else if (bytes.compare(kHeaderSize, key_size, key) != 0) {
      problem = "holds a different key";
    }
  }
  if (problem.empty()) {
    const char* body = bytes.data() + kHeaderSize + key_size;
    DiskEntry entry;
    entry.log.assign(body, log_size);
    entry.cubin.assign(body + log_size, body + log_size + cubin_size);
    if (checksum(key, entry.log, entry.cubin) != get_le(bytes.data() + 32, 8)) {
      problem = "checksum mismatch";
    } else {
      *out = std::move(entry);
      return DiskRead::hit;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (reported_corrupt_.insert(path.string()).second) {
    std::fprintf(stderr, "deca: warning: kernel cache entry \"%s\" is damaged (%s); recompiling\n",
                 path.c_str(), problem.c_str());
  }
  return DiskRead::corrupt;
}

bool DiskCache::write(const std::string& key, const DiskEntry& entry) {
  if (!ensure_dir()) return false;
  std::string data;
  data.reserve(disk_format::kHeaderSize + key.size() + entry.log.size() + entry.cubin.size());
  data.append(disk_format::kMagic, sizeof(disk_format::kMagic));
  put_u32(data, disk_format::kVersion);
  put_u32(data, static_cast<std::uint32_t>(key.size()));
  put_u64(data, entry.log.size());
  put_u64(data, entry.cubin.size());
  put_u64(data, checksum(key, entry.log, entry.cubin));
  data += key;
  data += entry.log;
  data.append(entry.cubin.data(), entry.cubin.size());

  const fs::path final_path = path_for(key);
  const fs::path tmp = temp_path(final_path);
  std::string err = write_synced(tmp, data);
  if (err.empty() && std::rename(tmp.c_str(), final_path.c_str()) != 0) err = std::strerror(errno);
  if (!err.empty()) {
    std::error_code ec;
    fs::remove(tmp, ec);
    warn_unwritable("cannot write " + final_path.filename().string() + ": " + err);
    return false;
  }
  return true;
}

}  // namespace deca::jit
