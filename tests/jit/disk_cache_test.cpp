#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "jit/disk_cache.hpp"
#include "scoped_env.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

namespace fs = std::filesystem;

DiskEntry sample_entry(char fill, std::size_t size) {
  DiskEntry e;
  e.cubin.assign(size, fill);
  for (std::size_t i = 0; i < size; i += 7) e.cubin[i] = static_cast<char>(i);
  e.log = std::string("ptxas info    : Used ") + fill + " registers";
  return e;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::size_t count_files(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

TEST(DiskCache, RoundTrip) {
  const fs::path dir = testing::fresh_dir("roundtrip") / "nested" / "deca";  // created on write
  DiskCache cache(dir);
  DiskEntry got;
  EXPECT_EQ(cache.read("k-0123", &got), DiskRead::miss);
  const DiskEntry e = sample_entry('x', 10000);
  ASSERT_TRUE(cache.write("k-0123", e));
  EXPECT_EQ(cache.path_for("k-0123"), dir / "k-0123.cubin");
  ASSERT_EQ(cache.read("k-0123", &got), DiskRead::hit);
  EXPECT_EQ(got.cubin, e.cubin);
  EXPECT_EQ(got.log, e.log);
  // Atomic write: the temp file was renamed, nothing else is left behind.
  EXPECT_EQ(count_files(dir), 1u);
  // A second instance (another process, in effect) reads it too.
  DiskCache other(dir);
  ASSERT_EQ(other.read("k-0123", &got), DiskRead::hit);
  EXPECT_EQ(got.cubin, e.cubin);
}

TEST(DiskCache, EmptyPayloadRoundTrips) {
  DiskCache cache(testing::fresh_dir("empty"));
  ASSERT_TRUE(cache.write("k", DiskEntry{}));
  DiskEntry got = sample_entry('y', 5);
  ASSERT_EQ(cache.read("k", &got), DiskRead::hit);
  EXPECT_TRUE(got.cubin.empty());
  EXPECT_TRUE(got.log.empty());
}

// Each way of damaging a good file must read as `corrupt`, never as a hit.
TEST(DiskCache, DamagedFilesAreDetectedAndReportedOnce) {
  const fs::path dir = testing::fresh_dir("corrupt");
  DiskCache cache(dir);
  const DiskEntry e = sample_entry('z', 4096);
  ASSERT_TRUE(cache.write("key-a", e));
  const fs::path path = cache.path_for("key-a");
  const std::string good = read_file(path);

  struct Damage {
    const char* what;
    std::string bytes;
  };
  std::vector<Damage> damages;
  damages.push_back({"truncated in payload", good.substr(0, good.size() - 100)});
  damages.push_back({"truncated in header", good.substr(0, 10)});
  damages.push_back({"empty", ""});
  std::string flipped = good;
  flipped[good.size() - 50] ^= 0x40;
  damages.push_back({"payload bit flip", flipped});
  std::string magic = good;
  magic[0] = 'X';
  damages.push_back({"bad magic", magic});
  std::string version = good;
  version[8] = 99;
  damages.push_back({"bad version", version});
  std::string size = good;
  size[24] ^= 0x01;  // cubin size field
  damages.push_back({"size field", size});
  damages.push_back({"appended garbage", good + "garbage"});

  for (const Damage& d : damages) {
    write_file(path, d.bytes);
    DiskCache fresh(dir);  // a fresh instance: reports are once per file per cache
    DiskEntry got;
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(fresh.read("key-a", &got), DiskRead::corrupt) << d.what;
    EXPECT_EQ(fresh.read("key-a", &got), DiskRead::corrupt) << d.what;
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find(path.string()), std::string::npos) << d.what << ": " << err;
    // Reported once, not once per read.
    EXPECT_EQ(err.find("damaged"), err.rfind("damaged")) << d.what << ": " << err;
  }
  // Rewriting repairs it.
  ASSERT_TRUE(cache.write("key-a", e));
  DiskEntry got;
  EXPECT_EQ(cache.read("key-a", &got), DiskRead::hit);
}

TEST(DiskCache, FileOfAnotherKeyIsNotAHit) {
  const fs::path dir = testing::fresh_dir("otherkey");
  DiskCache cache(dir);
  ASSERT_TRUE(cache.write("key-a", sample_entry('a', 100)));
  fs::copy_file(cache.path_for("key-a"), cache.path_for("key-b"));
  DiskEntry got;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cache.read("key-b", &got), DiskRead::corrupt);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("different key"), std::string::npos);
}

TEST(DiskCache, UncreatableDirectoryWarnsOnceAndMisses) {
  const fs::path base = testing::fresh_dir("uncreatable");
  write_file(base / "a_file", "not a directory");
  const fs::path dir = base / "a_file" / "deca";
  DiskCache cache(dir);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.write("k1", sample_entry('a', 10)));
  EXPECT_FALSE(cache.write("k2", sample_entry('b', 10)));
  DiskEntry got;
  EXPECT_EQ(cache.read("k1", &got), DiskRead::miss);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(dir.string()), std::string::npos) << err;
  EXPECT_EQ(err.find("warning"), err.rfind("warning")) << "more than one warning: " << err;
}

// A directory that exists but refuses new files. As root, permission bits do not stop writes, so
// fall back to /proc, which no user can create files in.
fs::path read_only_dir() {
  const fs::path dir = testing::fresh_dir("readonly");
  ::chmod(dir.c_str(), 0555);
  const fs::path probe = dir / "probe";
  {
    std::ofstream out(probe);
    if (!out) return dir;
  }
  fs::remove(probe);
  return "/proc";
}

TEST(DiskCache, ReadOnlyDirectoryWarnsOnceAndStillReads) {
  const fs::path dir = read_only_dir();
  DiskCache cache(dir);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.write("k1", sample_entry('a', 10)));
  EXPECT_FALSE(cache.write("k2", sample_entry('b', 10)));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(dir.string()), std::string::npos) << err;
  EXPECT_EQ(err.find("warning"), err.rfind("warning")) << "more than one warning: " << err;
  DiskEntry got;
  EXPECT_EQ(cache.read("k1", &got), DiskRead::miss);
  if (dir != "/proc") ::chmod(dir.c_str(), 0755);
}

TEST(DiskCache, ConcurrentWritersLeaveOneValidFile) {
  const fs::path dir = testing::fresh_dir("concurrent");
  constexpr int kThreads = 8;
  constexpr int kRounds = 20;
  std::vector<DiskEntry> entries;
  for (int t = 0; t < kThreads; ++t) entries.push_back(sample_entry(static_cast<char>('a' + t), 50000 + t * 1000));
  DiskCache shared(dir);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half share one instance, half have their own (as separate processes would).
      DiskCache own(dir);
      DiskCache& c = t % 2 == 0 ? shared : own;
      for (int r = 0; r < kRounds; ++r) {
        EXPECT_TRUE(c.write("same-key", entries[t]));
        DiskEntry got;
        // Any reader at any moment sees a whole entry written by some thread.
        ASSERT_EQ(c.read("same-key", &got), DiskRead::hit);
        bool matches = false;
        for (const DiskEntry& e : entries) matches |= e.cubin == got.cubin && e.log == got.log;
        EXPECT_TRUE(matches);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(count_files(dir), 1u) << "temp files left behind";
}

TEST(DiskCache, StaleTempFilesOfCrashedWritersAreRemoved) {
  const fs::path dir = testing::fresh_dir("stale");
  const fs::path stale = dir / "k.cubin.tmp.123.456.0";
  const fs::path recent = dir / "k.cubin.tmp.123.456.1";
  const fs::path other = dir / "notes.txt";
  for (const fs::path& p : {stale, recent, other}) write_file(p, "partial");
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(1));
  fs::last_write_time(other, fs::file_time_type::clock::now() - std::chrono::hours(1));
  DiskCache cache(dir);
  ASSERT_TRUE(cache.write("k", sample_entry('s', 10)));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(recent));  // may still be in the middle of a write
  EXPECT_TRUE(fs::exists(other));
}

TEST(DiskCache, DefaultDirFollowsEnvironment) {
  testing::ScopedEnv deca("DECA_CACHE_DIR", "/tmp/deca_explicit");
  testing::ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/xdg");
  EXPECT_EQ(DiskCache::default_dir(), fs::path("/tmp/deca_explicit"));
  deca.set(nullptr);
  EXPECT_EQ(DiskCache::default_dir(), fs::path("/tmp/xdg/deca"));
  deca.set("");  // empty counts as unset
  EXPECT_EQ(DiskCache::default_dir(), fs::path("/tmp/xdg/deca"));
  xdg.set(nullptr);
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(DiskCache::default_dir(), fs::path(home) / ".cache" / "deca");
  }
}

}  // namespace
}  // namespace deca::jit
