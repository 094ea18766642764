// The in-process and on-disk levels of KernelCache, without a GPU (get_cubin).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "deca/error.hpp"
#include "elf_symbols.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/test_hooks.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

namespace fs = std::filesystem;

// A spec whose deca cache key no earlier test or run has used: the comment changes the key, so
// no disk cache (a shared DECA_CACHE_DIR included) can answer for it. NVRTC's own cache, which a
// comment does not fool, is bypassed by jit::compile itself (see nvrtc_options).
JitSpec unique_spec(int arch, const std::string& what) {
  JitSpec s = testing::axpy_spec(arch, "_" + what);
  s.source += "// " + std::to_string(::getpid()) + " " +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  return s;
}

TEST(KernelCache, EightThreadsCompileOnce) {
  DiskCache disk(testing::fresh_dir("once"));
  KernelCache cache(&disk);
  const JitSpec spec = unique_spec(90, "once");
  const std::uint64_t before = test_hooks::nvrtc_compile_count();

  constexpr int kThreads = 8;
  std::atomic<int> ready{0};
  std::vector<const CompiledKernel*> got(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      got[t] = &cache.get_cubin(spec);
    });
  }
  for (auto& t : threads) t.join();

  EXPECT_EQ(test_hooks::nvrtc_compile_count() - before, 1u);
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(got[t], got[0]) << "thread " << t;
  EXPECT_EQ(got[0]->origin, KernelOrigin::compile);
  EXPECT_TRUE(testing::elf_has_symbol(got[0]->cubin, spec.entry));
  // Asking again is a memory hit: no compile.
  cache.get_cubin(spec);
  EXPECT_EQ(test_hooks::nvrtc_compile_count() - before, 1u);
}

TEST(KernelCache, DistinctKeysCompileSeparately) {
  KernelCache cache(nullptr);
  const std::uint64_t before = test_hooks::nvrtc_compile_count();
  const CompiledKernel& a = cache.get_cubin(unique_spec(80, "dist"));
  const CompiledKernel& b = cache.get_cubin(unique_spec(90, "dist"));
  EXPECT_EQ(test_hooks::nvrtc_compile_count() - before, 2u);
  EXPECT_NE(&a, &b);
  EXPECT_NE(a.cubin, b.cubin);
}

TEST(KernelCache, SecondProcessReadsFromDisk) {
  const fs::path dir = testing::fresh_dir("disk_hit");
  const JitSpec spec = unique_spec(90, "disk");
  DiskCache disk1(dir);
  KernelCache first(&disk1);
  const CompiledKernel& compiled = first.get_cubin(spec);
  ASSERT_EQ(compiled.origin, KernelOrigin::compile);
  EXPECT_TRUE(fs::exists(disk1.path_for(compiled.key.str())));

  // A new cache over the same directory stands for a new process.
  const std::uint64_t before = test_hooks::nvrtc_compile_count();
  DiskCache disk2(dir);
  KernelCache second(&disk2);
  const CompiledKernel& loaded = second.get_cubin(spec);
  EXPECT_EQ(test_hooks::nvrtc_compile_count(), before);
  EXPECT_EQ(loaded.origin, KernelOrigin::disk);
  EXPECT_EQ(loaded.cubin, compiled.cubin);
  EXPECT_EQ(loaded.log, compiled.log);  // the log travels with it
  EXPECT_TRUE(loaded.ptxas.found) << loaded.log;
  EXPECT_EQ(loaded.ptxas.registers, compiled.ptxas.registers);
}

TEST(KernelCache, CorruptDiskEntryIsRecompiledAndRewritten) {
  const fs::path dir = testing::fresh_dir("recompile");
  const JitSpec spec = unique_spec(80, "recompile");
  DiskCache disk1(dir);
  KernelCache first(&disk1);
  const CompiledKernel& good = first.get_cubin(spec);
  const fs::path path = disk1.path_for(good.key.str());
  const auto good_size = fs::file_size(path);
  ASSERT_TRUE(good.ptxas.found) << good.log;
  ASSERT_EQ(good_size, disk_format::kHeaderSize + good.key.str().size() + good.log.size() +
                           good.cubin.size());
  fs::resize_file(path, good_size / 2);  // a crash mid-copy, say

  const std::uint64_t before = test_hooks::nvrtc_compile_count();
  DiskCache disk2(dir);
  KernelCache second(&disk2);
  ::testing::internal::CaptureStderr();
  const CompiledKernel& again = second.get_cubin(spec);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("damaged"), std::string::npos) << err;
  EXPECT_EQ(test_hooks::nvrtc_compile_count() - before, 1u);
  EXPECT_EQ(again.origin, KernelOrigin::compile);
  EXPECT_EQ(again.cubin, good.cubin);
  // The recompile ran ptxas again, so the rewritten entry carries the ptxas report too. (The
  // logs may differ in length: ptxas -v reports its own compile time.)
  EXPECT_TRUE(again.ptxas.found) << again.log;
  EXPECT_EQ(again.ptxas.registers, good.ptxas.registers);
  // Rewritten whole: exactly the header, key, new log and cubin.
  EXPECT_EQ(fs::file_size(path), disk_format::kHeaderSize + again.key.str().size() +
                                     again.log.size() + again.cubin.size());

  DiskEntry entry;
  ASSERT_EQ(DiskCache(dir).read(good.key.str(), &entry), DiskRead::hit);
  EXPECT_EQ(entry.cubin, good.cubin);
  EXPECT_EQ(entry.log, again.log);
  EXPECT_EQ(parse_ptxas_info(entry.log, spec.entry).registers, good.ptxas.registers);
}

TEST(KernelCache, UnwritableDiskStillCompilesInMemory) {
  const fs::path base = testing::fresh_dir("nodisk");
  { std::ofstream(base / "file") << "x"; }
  DiskCache disk(base / "file" / "deca");
  KernelCache cache(&disk);
  ::testing::internal::CaptureStderr();
  const CompiledKernel& a = cache.get_cubin(unique_spec(90, "nodisk_a"));
  const CompiledKernel& b = cache.get_cubin(unique_spec(90, "nodisk_b"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(a.cubin.empty());
  EXPECT_FALSE(b.cubin.empty());
  EXPECT_EQ(err.find("warning"), err.rfind("warning")) << err;
  EXPECT_NE(err.find("warning"), std::string::npos) << err;
}

TEST(KernelCache, CompileErrorIsNotCachedAndRethrown) {
  KernelCache cache(nullptr);
  JitSpec bad = unique_spec(80, "bad");
  bad.source += "this is not C++;\n";
  const std::uint64_t before = test_hooks::nvrtc_compile_count();
  EXPECT_THROW(cache.get_cubin(bad), Error);
  EXPECT_THROW(cache.get_cubin(bad), Error);
  // Failures are forgotten, so the second call compiled again rather than replaying.
  EXPECT_EQ(test_hooks::nvrtc_compile_count() - before, 2u);
}

// Prints cold NVRTC compile time and cached (disk) read time per specialization.
TEST(KernelCacheTiming, ColdCompileAndCachedLoad) {
  const fs::path dir = testing::fresh_dir("timing");
  std::vector<JitSpec> specs = {testing::axpy_spec(80), testing::axpy_spec(90),
                                testing::tile_spec(80, 16), testing::tile_spec(90, 16),
                                testing::tile_spec(90, 64)};
  for (JitSpec& s : specs) s.source += "// timing " + std::to_string(::getpid()) + "\n";
  DiskCache cold_disk(dir);
  KernelCache cold(&cold_disk);
  DiskCache warm_disk(dir);
  KernelCache warm(&warm_disk);
  for (const JitSpec& s : specs) {
    const auto t0 = std::chrono::steady_clock::now();
    const CompiledKernel& c = cold.get_cubin(s);
    const double cold_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto t1 = std::chrono::steady_clock::now();
    const CompiledKernel& w = warm.get_cubin(s);
    const double warm_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    ASSERT_EQ(c.origin, KernelOrigin::compile);
    ASSERT_EQ(w.origin, KernelOrigin::disk);
    EXPECT_EQ(w.cubin, c.cubin);
    EXPECT_TRUE(c.ptxas.found) << s.name << ": " << c.log;
    EXPECT_EQ(w.ptxas.registers, c.ptxas.registers) << s.name;
    std::printf("[jit timing] %-22s cold compile %8.1f ms (nvrtc %8.1f ms)  disk load %6.2f ms  "
                "cubin %6zu B  %s\n",
                s.name.c_str(), cold_ms, c.compile_ms, warm_ms, c.cubin.size(),
                to_string(c.ptxas).c_str());
    EXPECT_LT(warm_ms, cold_ms);
  }
}

}  // namespace
}  // namespace deca::jit
