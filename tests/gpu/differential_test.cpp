// The GPU against the CPU reference on random configurations of every op (issue 30 item 4): GQA
// decode (plain, the fused decode step, skip-softmax), MLA sparse (V3.2 and MODEL1) and dense
// decode and the combine op, drawn by tests/common/diff_draw.hpp from
// DECA_TEST_SEED. Each case runs on both sides through the public API with NaN-poisoned outputs;
// both must accept it (a config or call one side refuses and the other takes is a one-sided
// refusal), the GPU must write every output element and nothing around the views, and its
// outputs and LSE must be within the family's bounds (skip-softmax: its element-wise bound
// against exact attention; the fused step: the caches after the call bitwise as the reference
// leaves them). Cases whose GPU run is repeated (a reused
// workspace or schedule) must write bitwise what the first run wrote.
//
//   DECA_DIFF_CASES=N   cases (default 1000, about a minute on an H200 after the compiles)
//   DECA_DIFF_ONLY=i    replay case i of that run alone (the failure report prints the line)
//   DECA_DIFF_SHARD=k/n run every n-th case from k (tools/gpu_round.sh runs n such processes)
//   DECA_DIFF_PLAN_ONLY=1  plan (compile) the cases and stop: fills the disk cache once before
//                       n processes would each compile the same kernels
//
// One summary line, "[differential] ...", is what a GPU round greps.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/diff_draw.hpp"
#include "common/test_seed.hpp"
#include "deca/error.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/diff_mirror.hpp"

namespace deca::test::diff {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// DECA_DIFF_SHARD=k/n: this process runs the cases whose index is k modulo n (of the same draws),
// so that n processes share a long run.
struct Shard {
  int index = 0, count = 1;
};

Shard shard_from_env() {
  Shard s;
  const char* v = std::getenv("DECA_DIFF_SHARD");
  if (v && std::sscanf(v, "%d/%d", &s.index, &s.count) == 2 && s.count >= 1 && s.index >= 0 &&
      s.index < s.count) {
    return s;
  }
  if (v && *v) ADD_FAILURE() << "DECA_DIFF_SHARD=" << v << ": expected k/n with 0 <= k < n";
  return Shard{};
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct FamilyStats {
  int cases = 0, mismatches = 0, gpu_only = 0, cpu_only = 0, both = 0;
  double worst = 0;  // the largest error over its bound, any measure, any case
  int worst_case = -1;
  std::string worst_text;
  std::set<std::string> kernels;
};

struct CaseResult {
  bool cpu_refused = false, gpu_refused = false, mismatch = false, fatal = false;
  std::string kernel, why;
  double ratio = 0;  // the error's largest share of its bound
};

// A CUDA error after a run; `fatal` when it leaves the context unusable for later cases.
std::string cuda_error(bool* fatal) {
  const cudaError_t rc = cudaDeviceSynchronize();
  const cudaError_t last = cudaGetLastError();
  const cudaError_t e = rc != cudaSuccess ? rc : last;
  if (e == cudaSuccess) return "";
  *fatal = rc != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess;
  return std::string("CUDA error ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
}

CaseResult run_case(const CaseDraw& draw) {
  CaseResult r;
  const std::unique_ptr<DiffCase> c = build_case(draw);
  const std::vector<Output> outs = c->outputs();

  std::string cpu_error;
  const std::vector<HostTensor> before = save_in_place(outs);
  poison(outs);
  try {
    c->run(Side{}, 0);
  } catch (const Error& e) {
    r.cpu_refused = true, cpu_error = e.what();
  }
  const std::vector<HostTensor> ref = snapshot(outs);
  restore_in_place(outs, before);  // the GPU's copy starts from the case's caches

  Mirror mirror(c->tensors());
  const Side gpu = mirror.side();
  std::vector<std::vector<HostTensor>> runs;
  for (int pass = 0; pass < c->passes() && !r.gpu_refused; ++pass) {
    mirror.poison(outs);
    try {
      const std::string kernel = c->run(gpu, pass);
      if (pass == 0) r.kernel = kernel;
    } catch (const Error& e) {
      r.gpu_refused = true, r.why = e.what();
    }
    if (const std::string err = cuda_error(&r.fatal); !err.empty()) {
      r.mismatch = true, r.why += (r.why.empty() ? "" : "; ") + err;
      return r;
    }
    runs.push_back(mirror.download(outs));
  }
  if (r.cpu_refused || r.gpu_refused) {
    r.why = (r.cpu_refused ? "CPU: " + cpu_error : std::string("CPU ran")) + " | " +
            (r.gpu_refused ? "GPU: " + r.why : std::string("GPU ran"));
    return r;
  }

  Mismatch m;
  const Tolerance t = c->tolerance(r.kernel);
  c->compare(outs, ref, runs[0], t, m);
  r.ratio = m.ratio(t);
  r.mismatch = !m.within(t);
  r.why = m.text();
  for (std::size_t k = 0; runs.size() > 1 && k < outs.size(); ++k) {
    if (std::memcmp(runs[0][k].raw(), runs[1][k].raw(), runs[0][k].bytes()) != 0) {
      r.mismatch = true;
      r.why += std::string(" second run differs in ") + outs[k].name;
    }
  }
  return r;
}

// Plans every case on the GPU from as many threads as there are cores, so that the kernels of
// the run compile in parallel rather than one by one inside the loop. Refusals are left for the
// loop to report.
double compile_ahead(const std::vector<CaseDraw>& draws) {
  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 32u));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (std::size_t i = next++; i < draws.size(); i = next++) {
        try {
          plan_case(draws[i], Device::cuda(0));
        } catch (const std::exception&) {
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  return seconds_since(start);
}

TEST(Differential, GpuMatchesCpuReference) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  const int count = env_int("DECA_DIFF_CASES", 1000);
  const int only = env_int("DECA_DIFF_ONLY", -1);
  const Shard shard = shard_from_env();
  const std::uint64_t seed = test_seed();
  std::vector<CaseDraw> draws = draw_cases(count, seed);
  if (only >= 0) {
    ASSERT_LT(only, count) << "DECA_DIFF_ONLY names no case of DECA_DIFF_CASES=" << count;
    draws = {draws[only]};
  } else if (shard.count > 1) {
    std::vector<CaseDraw> mine;
    for (const CaseDraw& d : draws) {
      if (d.index % shard.count == shard.index) mine.push_back(d);
    }
    draws = std::move(mine);
  }
  const double compile_s = compile_ahead(draws);
  if (env_int("DECA_DIFF_PLAN_ONLY", 0) == 1) {
    std::printf(
        "[differential] planned %zu cases (their kernels compiled into the cache) in %.1f s\n",
        draws.size(), compile_s);
    return;
  }

  const auto start = std::chrono::steady_clock::now();
  FamilyStats stats[static_cast<int>(Family::kCount)];
  int reported = 0, ran = 0;
  for (const CaseDraw& d : draws) {
    const CaseResult r = run_case(d);
    ++ran;
    FamilyStats& f = stats[static_cast<int>(d.family)];
    ++f.cases;
    if (!r.kernel.empty()) f.kernels.insert(r.kernel);
    const bool refused = r.cpu_refused || r.gpu_refused;
    if (r.cpu_refused && r.gpu_refused) ++f.both;
    else if (r.gpu_refused) ++f.gpu_only;
    else if (r.cpu_refused) ++f.cpu_only;
    if (r.mismatch) ++f.mismatches;
    if (!refused && r.ratio > f.worst)
      f.worst = r.ratio, f.worst_case = d.index, f.worst_text = r.why;
    if ((refused || r.mismatch) && reported++ < 20) {
      std::printf(
          "[differential] case %d %s: %s\n  %s\n  kernel %s\n  replay: DECA_TEST_SEED=%llu "
          "DECA_DIFF_CASES=%d DECA_DIFF_ONLY=%d\n",
          d.index, refused ? "refused" : "mismatch", r.why.c_str(),
          build_case(d)->describe().c_str(), r.kernel.c_str(),
          static_cast<unsigned long long>(seed), count, d.index);
    }
    if (r.fatal) {
      ADD_FAILURE() << "case " << d.index << " left the CUDA context unusable; "
                    << draws.size() - ran << " cases not run";
      break;
    }
  }
  const double run_s = seconds_since(start);

  int mismatches = 0, gpu_only = 0, cpu_only = 0, both = 0;
  std::string per_family, worst;
  std::size_t kernels = 0;
  for (int i = 0; i < static_cast<int>(Family::kCount); ++i) {
    const FamilyStats& f = stats[i];
    const std::string name = family_name(static_cast<Family>(i));
    mismatches += f.mismatches, gpu_only += f.gpu_only, cpu_only += f.cpu_only, both += f.both;
    kernels += f.kernels.size();
    per_family += " " + name + "=" + std::to_string(f.cases);
    char buf[64];
    std::snprintf(buf, sizeof buf, " worst_%s=%.3f", name.c_str(), f.worst);
    worst += buf;
  }
  const int one_sided = gpu_only + cpu_only;
  std::printf(
      "[differential] seed=%llu shard=%d/%d cases=%d%s mismatches=%d refusals=%d gpu_only=%d "
      "cpu_only=%d both=%d%s kernels=%zu compile_s=%.1f run_s=%.1f\n",
      static_cast<unsigned long long>(seed), shard.index, shard.count, ran, per_family.c_str(),
      mismatches, one_sided, gpu_only, cpu_only, both, worst.c_str(), kernels, compile_s, run_s);
  for (int i = 0; i < static_cast<int>(Family::kCount); ++i) {
    const FamilyStats& f = stats[i];
    if (f.worst_case < 0) continue;
    std::printf("[differential] %s worst (error / bound %.3f): case %d %s\n",
                family_name(static_cast<Family>(i)), f.worst, f.worst_case, f.worst_text.c_str());
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(one_sided, 0) << "configs one backend takes and the other refuses";
  EXPECT_EQ(both, 0) << "configs both backends refuse: the generator drew an invalid case";
}

}  // namespace
}  // namespace deca::test::diff
