// The on-disk cache under concurrent processes (issue 9 item 4): forked children writing and
// reading the same and different keys of one directory at once, with a corrupted and a truncated
// entry planted first. And the checker tools/jit_cache_stress.sh runs over a directory that real
// deca-bench processes filled (DiskCacheVerify, skipped unless DECA_JIT_VERIFY_DIR is set).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "jit/disk_cache.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

namespace fs = std::filesystem;

// The one entry every writer of `key` writes: large enough (~300 KB) that a writer that is not
// atomic would be caught mid-write by a reader.
DiskEntry entry_for(const std::string& key) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  DiskEntry e;
  e.cubin.resize(300000 + h % 4096);
  for (std::size_t i = 0; i < e.cubin.size(); ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    e.cubin[i] = static_cast<char>(h >> 56);
  }
  e.log = "ptxas info    : Function properties for " + key;
  return e;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Child exit codes (0: every read was a whole entry of the right bytes).
enum ChildFailure {
  kWrongBytes = 10,          // a hit with another key's or garbled bytes
  kDamagedAfterGood = 11,    // a key seen whole (or written) later read damaged: a partial file
  kDamagedUnplanted = 12,    // a key nobody damaged read as corrupt: a reader saw a partial write
  kVanished = 13,            // a key seen whole later missing
  kWriteFailed = 14,
  kStartFailed = 15,
};

// One process: `rounds` passes over the planted keys, its own key and its neighbour's, reading
// each, repairing what it finds damaged or missing (as KernelCache does: recompile, write), and
// rewriting the shared keys and its own every few rounds so that writers race the readers.
int child(const fs::path& dir, int me, int procs, int rounds, const std::vector<std::string>& planted,
          int start_fd) {
  char c;
  if (::read(start_fd, &c, 1) != 0) return kStartFailed;  // EOF: the parent released everyone
  DiskCache cache(dir);  // one instance per process, as in deca
  std::vector<std::string> keys = planted;
  keys.push_back("own-" + std::to_string(me));
  keys.push_back("own-" + std::to_string((me + 1) % procs));
  std::map<std::string, DiskEntry> expected;
  for (const std::string& k : keys) expected[k] = entry_for(k);
  std::map<std::string, bool> seen_good;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::string& k = keys[(i + me + r) % keys.size()];
      const DiskEntry& want = expected[k];
      DiskEntry got;
      switch (cache.read(k, &got)) {
        case DiskRead::hit:
          if (got.cubin != want.cubin || got.log != want.log) return kWrongBytes;
          seen_good[k] = true;
          break;
        case DiskRead::corrupt: {
          if (seen_good[k]) return kDamagedAfterGood;
          bool was_planted = false;
          for (const std::string& p : planted) was_planted |= p == k;
          if (!was_planted) return kDamagedUnplanted;
          if (!cache.write(k, want)) return kWriteFailed;
          seen_good[k] = true;
          break;
        }
        case DiskRead::miss:
          if (seen_good[k]) return kVanished;
          if (k == keys[keys.size() - 2]) {  // its own key: write it (the neighbour writes its own)
            if (!cache.write(k, want)) return kWriteFailed;
            seen_good[k] = true;
          }
          break;
      }
    }
    if (r % 3 == me % 3) {
      for (std::size_t i = 0; i + 1 < keys.size(); ++i) {  // the shared keys and its own
        if (!cache.write(keys[i], expected[keys[i]])) return kWriteFailed;
        seen_good[keys[i]] = true;
      }
    }
  }
  return 0;
}

TEST(DiskCacheProcesses, ForkedWritersAndReadersWithPlantedDamage) {
  const fs::path dir = testing::fresh_dir("processes");
  constexpr int kProcs = 8;
  constexpr int kRounds = 60;
  const std::vector<std::string> planted = {"shared-corrupt", "shared-truncated"};
  {
    DiskCache seed(dir);
    for (const std::string& k : planted) ASSERT_TRUE(seed.write(k, entry_for(k)));
    const fs::path corrupt = seed.path_for(planted[0]);
    std::string bytes = slurp(corrupt);
    for (std::size_t i = bytes.size() / 2; i < bytes.size() / 2 + 16; ++i) bytes[i] ^= 0x5a;
    spit(corrupt, bytes);
    fs::resize_file(seed.path_for(planted[1]), fs::file_size(seed.path_for(planted[1])) / 3);
    DiskCache check(dir);
    DiskEntry got;
    ::testing::internal::CaptureStderr();
    ASSERT_EQ(check.read(planted[0], &got), DiskRead::corrupt);
    ASSERT_EQ(check.read(planted[1], &got), DiskRead::corrupt);
    ::testing::internal::GetCapturedStderr();
  }

  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(start[1]);
      // The damaged entries are reported on stderr by whichever child finds them: keep the test
      // output readable.
      std::freopen("/dev/null", "w", stderr);
      ::_exit(child(dir, p, kProcs, kRounds, planted, start[0]));  // no atexit: the parent cleans up
    }
    pids.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // all children start now
  for (int p = 0; p < kProcs; ++p) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[p], &status, 0), pids[p]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "process " << p << ": " << (WIFEXITED(status) ? "exit code " : "signal ")
        << (WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status))
        << " (10 wrong bytes, 11 damaged after good, 12 partial write seen, 13 vanished, "
           "14 write failed)";
  }

  // Afterwards: one whole entry per key, the planted ones repaired, no temp file left.
  std::size_t entries = 0;
  DiskCache after(dir);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    ASSERT_EQ(e.path().extension(), ".cubin") << "left behind: " << name;
    const std::string key = e.path().stem().string();
    DiskEntry got;
    ASSERT_EQ(after.read(key, &got), DiskRead::hit) << name;
    const DiskEntry want = entry_for(key);
    EXPECT_EQ(got.cubin, want.cubin) << name;
    EXPECT_EQ(got.log, want.log) << name;
    ++entries;
  }
  EXPECT_EQ(entries, planted.size() + kProcs);
}

// Checks a cache directory that other processes filled: every *.cubin reads back whole (magic,
// sizes, key, checksum) under its own key, and no temp file is left. Used by
// tools/jit_cache_stress.sh; skipped unless DECA_JIT_VERIFY_DIR names the directory.
TEST(DiskCacheVerify, DirectoryNamedByEnvironment) {
  const char* env = std::getenv("DECA_JIT_VERIFY_DIR");
  if (env == nullptr || *env == '\0') GTEST_SKIP() << "DECA_JIT_VERIFY_DIR is not set";
  const fs::path dir(env);
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  DiskCache cache(dir);
  std::size_t valid = 0, damaged = 0, temps = 0, other = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".cubin.tmp.") != std::string::npos) {
      ++temps;
      ADD_FAILURE() << "temp file left behind: " << name;
    } else if (e.path().extension() == ".cubin") {
      DiskEntry got;
      if (cache.read(e.path().stem().string(), &got) == DiskRead::hit && !got.cubin.empty()) {
        ++valid;
      } else {
        ++damaged;
        ADD_FAILURE() << "not a valid entry: " << name;
      }
    } else {
      ++other;
      ADD_FAILURE() << "unexpected file: " << name;
    }
  }
  std::printf("[verify] %s: %zu valid, %zu damaged, %zu temp, %zu other\n", dir.c_str(), valid,
              damaged, temps, other);
}

}  // namespace
}  // namespace deca::jit
