// Plans, runs and the JIT kernel cache from several host threads at once (issue 30 item 5), and
// the calls that must fail cleanly: a workspace too small, a device out of memory.
//
// The threads' part runs in a child process (ConcurrencyChild, started by
// Concurrency.EightThreadsOnEightStreamsColdCache) with a fresh, empty DECA_CACHE_DIR: the
// process-wide kernel cache reads that variable once, at its first use, so only a fresh process
// makes every first compile a real NVRTC compile that the threads race for. Cases come from the
// differential test's generator (tests/common/diff_draw.hpp); every thread has its own device
// copies, workspace and non-blocking stream, and every result must be bitwise the result of a
// serial run of the same inputs afterwards.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/diff_draw.hpp"
#include "common/test_seed.hpp"
#include "deca/error.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/diff_mirror.hpp"
#include "jit/disk_cache.hpp"
#include "jit/test_hooks.hpp"

extern char** environ;

namespace deca::test::diff {
namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 8;
constexpr const char* kChildFlag = "DECA_CONCURRENCY_CHILD";

bool in_child() {
  const char* v = std::getenv(kChildFlag);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Non-blocking streams: ordered neither with the legacy default stream nor with each other.
class Streams {
 public:
  explicit Streams(int n) : s_(n, nullptr) {
    for (cudaStream_t& s : s_) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~Streams() {
    for (cudaStream_t s : s_) cudaStreamDestroy(s);
  }
  cudaStream_t operator[](int i) const { return s_[i]; }

 private:
  std::vector<cudaStream_t> s_;
};

// Calls body(t) for t in [0, n) on n threads released at once.
void together(int n, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();
      body(t);
    });
  }
  for (std::thread& t : threads) t.join();
}

struct Runs {
  std::vector<std::vector<HostTensor>> outputs;  // per run, per output
  std::string kernel, error;
};

// `reps` runs of `c` on mirror `m` (its memory, workspace and stream), outputs poisoned first.
Runs run_on(DiffCase& c, Mirror& m, int reps) {
  Runs r;
  const std::vector<Output> outs = c.outputs();
  const Side side = m.side();
  try {
    for (int i = 0; i < reps; ++i) {
      m.poison(outs);
      r.kernel = c.run(side, 0);
      r.outputs.push_back(m.download(outs));
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  if (const cudaError_t rc = cudaStreamSynchronize(static_cast<cudaStream_t>(side.stream));
      rc != cudaSuccess) {
    r.error += std::string(" CUDA error ") + cudaGetErrorName(rc);
  }
  return r;
}

bool same_bytes(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (a[k].bytes() != b[k].bytes() || std::memcmp(a[k].raw(), b[k].raw(), a[k].bytes()) != 0)
      return false;
  }
  return true;
}

// Every run of every thread wrote bitwise what `serial` wrote.
void expect_serial_result(const std::string& what, const std::vector<Runs>& runs,
                          const std::vector<HostTensor>& serial, const DiffCase& c) {
  for (std::size_t t = 0; t < runs.size(); ++t) {
    EXPECT_EQ(runs[t].error, "") << what << ", thread " << t << ": " << c.describe();
    for (std::size_t i = 0; i < runs[t].outputs.size(); ++i) {
      EXPECT_TRUE(same_bytes(runs[t].outputs[i], serial))
          << what << ", thread " << t << ", run " << i
          << " differs from the serial run: " << c.describe();
    }
  }
}

std::vector<HostTensor> serial_run(DiffCase& c) {
  Mirror m(c.tensors());
  Runs r = run_on(c, m, 1);
  EXPECT_EQ(r.error, "") << "serial run: " << c.describe();
  return r.outputs.empty() ? std::vector<HostTensor>{} : r.outputs[0];
}

// The cases: one GQA case that every thread runs, and eight others (four GQA, two MLA sparse, one
// MLA dense, one combine, first of each in the draw order) for a thread each. A long draw list has
// many layers, so the eight mostly compile different kernels.
struct Picked {
  std::unique_ptr<DiffCase> shared;
  std::vector<std::unique_ptr<DiffCase>> own;
};

Picked pick_cases() {
  const std::vector<CaseDraw> draws = draw_cases(2000, test_seed() + 30);
  Picked p;
  int want[static_cast<int>(Family::kCount)] = {4, 2, 1, 1};
  for (const CaseDraw& d : draws) {
    if (!p.shared && d.family == Family::kGqa) {
      p.shared = build_case(d);
    } else if (want[static_cast<int>(d.family)] > 0) {
      --want[static_cast<int>(d.family)];
      p.own.push_back(build_case(d));
    }
    if (p.shared && p.own.size() == kThreads) break;
  }
  return p;
}

// The kernels the runs' plans and calls need that are not among `known`: each run's own (a GQA
// decode kernel, an MLA decode kernel, the combine op's; a kernel_name "a+b" names two, as an MLA
// plan with the split combine does), and for MLA the scheduler and the default split merge,
// shared by every MLA plan of the device.
std::size_t kernels_of(const std::vector<Runs>& runs,
                       const std::vector<std::unique_ptr<DiffCase>>& cases,
                       const std::set<std::string>& known) {
  std::set<std::string> names;
  bool mla = false;
  for (std::size_t t = 0; t < runs.size(); ++t) {
    const std::string& kernel = runs[t].kernel;
    for (std::size_t begin = 0; begin <= kernel.size();) {
      const std::size_t end = std::min(kernel.find('+', begin), kernel.size());
      const std::string name = kernel.substr(begin, end - begin);
      if (!known.count(name)) names.insert(name);
      begin = end + 1;
    }
    const Family f = cases[t]->family();
    mla = mla || f == Family::kMlaSparse || f == Family::kMlaDense;
  }
  return names.size() + (mla ? 2 : 0);
}

TEST(ConcurrencyChild, PlansRunsAndKernelCacheFromEightThreads) {
  if (!in_child()) {
    GTEST_SKIP() << "run by Concurrency.EightThreadsOnEightStreamsColdCache in a child process";
  }
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  Picked cases = pick_cases();
  ASSERT_TRUE(cases.shared);
  ASSERT_EQ(cases.own.size(), static_cast<std::size_t>(kThreads));
  Streams streams(kThreads);

  // 1. One config planned and run by eight threads at once; its kernel is in no cache yet: the
  //    threads race for its first compile, which must happen once.
  std::vector<std::unique_ptr<Mirror>> shared_mirrors;
  for (int t = 0; t < kThreads; ++t) {
    shared_mirrors.push_back(std::make_unique<Mirror>(cases.shared->tensors(), streams[t]));
  }
  const std::uint64_t before = jit::test_hooks::nvrtc_compile_count();
  std::vector<Runs> same(kThreads);
  together(kThreads, [&](int t) { same[t] = run_on(*cases.shared, *shared_mirrors[t], 2); });
  EXPECT_EQ(jit::test_hooks::nvrtc_compile_count() - before, 1u)
      << "eight threads planning one config compile its kernel once";

  // 2. Eight configs at once, one per thread and stream: their first compiles run in parallel.
  std::vector<std::unique_ptr<Mirror>> own_mirrors;
  for (int t = 0; t < kThreads; ++t) {
    own_mirrors.push_back(std::make_unique<Mirror>(cases.own[t]->tensors(), streams[t]));
  }
  const std::uint64_t before_own = jit::test_hooks::nvrtc_compile_count();
  std::vector<Runs> own(kThreads);
  together(kThreads, [&](int t) { own[t] = run_on(*cases.own[t], *own_mirrors[t], 2); });
  const std::uint64_t compiled = jit::test_hooks::nvrtc_compile_count() - before_own;
  EXPECT_LE(compiled, kernels_of(own, cases.own, {same[0].kernel}))
      << "a kernel compiled more than once";

  // 3. One plan object, made once, used by eight threads at once.
  cases.shared->keep_plan(Device::cuda(0));
  std::vector<Runs> kept(kThreads);
  together(kThreads, [&](int t) { kept[t] = run_on(*cases.shared, *shared_mirrors[t], 3); });

  // Serial runs of the same inputs, one after another on the legacy default stream.
  const std::vector<HostTensor> shared_serial = serial_run(*cases.shared);
  expect_serial_result("one config from eight threads", same, shared_serial, *cases.shared);
  expect_serial_result("one kept plan from eight threads", kept, shared_serial, *cases.shared);
  for (int t = 0; t < kThreads; ++t) {
    const std::vector<HostTensor> serial = serial_run(*cases.own[t]);
    expect_serial_result("eight configs at once", {own[t]}, serial, *cases.own[t]);
  }
  std::printf(
      "[concurrency] %d threads, %d streams: shared kernel %s; %llu kernels compiled by the "
      "eight configs at once\n",
      kThreads, kThreads, same[0].kernel.c_str(), static_cast<unsigned long long>(compiled));
  for (int t = 0; t < kThreads; ++t) {
    std::printf("[concurrency]   thread %d: %s\n", t, own[t].kernel.c_str());
  }
}

// Starts this executable again with only ConcurrencyChild selected, a fresh cache directory and
// the child flag; returns its exit status (-1: it did not finish in `timeout_s`) and its output.
int run_child(const fs::path& cache, const fs::path& log, int timeout_s) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    // gtest's sharding and output settings are the parent's, not the child's.
    if (kv.rfind("GTEST_", 0) == 0 || kv.rfind("DECA_CACHE_DIR=", 0) == 0 ||
        kv.rfind(std::string(kChildFlag) + "=", 0) == 0) {
      continue;
    }
    env.push_back(kv);
  }
  env.push_back("DECA_CACHE_DIR=" + cache.string());
  env.push_back(std::string(kChildFlag) + "=1");
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args = {exe, "--gtest_filter=ConcurrencyChild.*", "--gtest_color=no"};
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &files, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn(" << exe << "): " << std::strerror(rc);
    return -1;
  }
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(timeout_s)) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Concurrency, EightThreadsOnEightStreamsColdCache) {
  DECA_REQUIRE_GPU();
  if (in_child()) GTEST_SKIP() << "the child runs ConcurrencyChild only";
  const fs::path dir =
      fs::temp_directory_path() /
      ("deca_concurrency_" + std::to_string(::getpid()) + "_" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  const fs::path cache = dir / "cache", log = dir / "child.log";
  fs::create_directories(cache);
  const int status = run_child(cache, log, 600);
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[concurrency]", 0) == 0) std::printf("%s\n", line.c_str());
  }
  EXPECT_EQ(status, 0) << "the child ("
                       << (status < 0 ? "timed out" : "exit " + std::to_string(status))
                       << ") wrote:\n"
                       << output;
  EXPECT_NE(output.find("[       OK ] ConcurrencyChild."), std::string::npos)
      << "the child ran no test:\n"
      << output;

  // What the racing compiles left on disk: whole entries, no temp file.
  jit::DiskCache disk(cache);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(cache)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "temp file left: " << name;
    if (e.path().extension() != ".cubin") continue;
    jit::DiskEntry entry;
    EXPECT_EQ(disk.read(e.path().stem().string(), &entry), jit::DiskRead::hit) << name;
    ++entries;
  }
  EXPECT_GT(entries, 0) << "the child compiled nothing into " << cache;
  std::printf("[concurrency] the child's cache: %d entries\n", entries);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// A workspace short by one byte, or none, is refused before anything is launched: the outputs
// keep their poison. The same case with the plan's workspace runs (the refusal is the size's).
TEST(Concurrency, WorkspaceTooSmallIsRefusedAndNothingWritten) {
  DECA_REQUIRE_GPU();
  const std::vector<CaseDraw> draws = draw_cases(200, test_seed() + 31);
  std::vector<std::unique_ptr<DiffCase>> cases;
  for (Family f : {Family::kGqa, Family::kMlaSparse}) {
    for (CaseDraw d : draws) {
      if (d.family != f) continue;
      d.gqa.config.checked = true;  // a GQA plan without splits needs a workspace only when checked
      cases.push_back(build_case(d));
      break;
    }
  }
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    const std::vector<Output> outs = c->outputs();
    Mirror m(c->tensors());
    for (int variant = 0; variant < 2; ++variant) {
      Side side = m.side();
      if (variant == 0) side.workspace_short = 1;
      else side.workspace = [](std::size_t) -> void* { return nullptr; };
      m.poison(outs);
      std::string message;
      try {
        c->run(side, 0);
      } catch (const Error& e) {
        message = e.what();
      }
      EXPECT_NE(message.find(variant == 0 ? "workspace_bytes" : "workspace"), std::string::npos)
          << (message.empty() ? "no deca::Error" : message) << "\n  " << c->describe();
      for (const HostTensor& t : m.download(outs)) {
        const auto* b = static_cast<const unsigned char*>(t.raw());
        EXPECT_TRUE(std::all_of(b, b + t.bytes(), [](unsigned char x) { return x == 0xFF; }))
            << "a refused call wrote an output: " << message;
      }
    }
    EXPECT_NO_THROW(c->run(m.side(), 0)) << c->describe();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

// The one device allocation deca makes itself: the one-shot gqa_decode(config, args) owns a
// workspace per call. One larger than the device holds is a deca::Error naming cudaMalloc, raised
// before the launch (out keeps its poison), and the device takes the next call. (Module loads at
// plan time also take device memory; exhausting the device to fail one would fail whatever else
// shares the GPU, so that path is not provoked here.)
TEST(Concurrency, OneShotWorkspaceBeyondTheDeviceIsAnError) {
  DECA_REQUIRE_GPU();
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  constexpr int kHeads = 16, kDim = 256, kPage = 16;
  GqaConfig cfg;
  cfg.num_q_heads = cfg.num_kv_heads = kHeads;
  cfg.head_dim = kDim;
  cfg.page_size = kPage;
  cfg.max_seq_len = 1 << 16;
  cfg.split_mode = SplitMode::kFixed;
  cfg.device = Device::cuda(0);
  // As many splits as the kernel's merge takes, then batches until the workspace (partials per
  // request, KV head and split) exceeds the device. The one-shot call plans the same config.
  bool found = false;
  for (int split : {256, 512, 1024, 2048}) {
    cfg.split_tokens = split;
    for (int batch = 1024; batch <= (1 << 16) && !found; batch *= 2) {
      cfg.max_batch = batch;
      try {
        found = plan_gqa_decode(cfg).workspace_bytes > total;
      } catch (const Error&) {
        break;  // more splits than the merge takes: longer splits
      }
    }
    if (found) break;
  }
  if (!found)
    GTEST_SKIP() << "no batch up to 65536 needs a workspace above the device's " << total
                 << " bytes";
  const int batch = cfg.max_batch;
  const Device dev = Device::cuda(0);
  // Every request: one token, the cache's only page; q broadcast over the batch (stride 0).
  DeviceBuffer q(kHeads * kDim * 2), k(kPage * kHeads * kDim * 2), v(kPage * kHeads * kDim * 2),
      table(4), lens(static_cast<std::size_t>(batch) * 4),
      out(static_cast<std::size_t>(batch) * kHeads * kDim * 2);
  for (const DeviceBuffer* b : {&q, &k, &v, &table}) b->fill(0);
  const std::vector<int> ones(batch, 1);
  cudaMemcpy(lens.get(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice);
  out.fill(0xFF);
  const auto args_for = [&](std::int64_t n) {
    GqaDecodeArgs a;
    a.q =
        make_tensor(q.get(), DType::kBF16, {n, 1, kHeads, kDim}, {0, kHeads * kDim, kDim, 1}, dev);
    a.k_cache = make_tensor(k.get(), DType::kBF16, {1, kPage, kHeads, kDim}, dev);
    a.v_cache = make_tensor(v.get(), DType::kBF16, {1, kPage, kHeads, kDim}, dev);
    a.page_table = make_tensor(table.get(), DType::kINT32, {n, 1}, {0, 1}, dev);
    a.seq_lens = make_tensor(lens.get(), DType::kINT32, {n}, dev);
    a.out = make_tensor(out.get(), DType::kBF16, {n, 1, kHeads, kDim}, dev);
    return a;
  };
  GqaConfig call = cfg;  // the one-shot call takes the sizes and maxima from the tensors
  call.max_batch = 1;
  std::string message;
  try {
    gqa_decode(call, args_for(batch));
  } catch (const Error& e) {
    message = e.what();
  }
  cudaGetLastError();  // the failed cudaMalloc's error state is not sticky; clear it
  EXPECT_NE(message.find("gqa_decode: workspace"), std::string::npos) << message;
  EXPECT_NE(message.find("cudaMalloc"), std::string::npos) << message;
  std::vector<unsigned char> host(out.bytes());
  cudaMemcpy(host.data(), out.get(), host.size(), cudaMemcpyDeviceToHost);
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](unsigned char x) { return x == 0xFF; }))
      << "the refused call wrote out";
  // The next call, four requests, runs: zero keys and values give zeros.
  EXPECT_NO_THROW(gqa_decode(call, args_for(4)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(host.data(), out.get(), 4 * kHeads * kDim * 2, cudaMemcpyDeviceToHost);
  EXPECT_TRUE(std::all_of(host.begin(), host.begin() + 4 * kHeads * kDim * 2,
                          [](unsigned char x) { return x == 0; }));
  std::printf("[concurrency] one-shot batch %d on a %zu-byte device: %s\n", batch, total,
              message.c_str());
}

}  // namespace
}  // namespace deca::test::diff
