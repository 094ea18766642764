// MLA sparse decode through the public API on the CPU (the reference) and on CUDA, for the GPU
// tests: the kernel variants, device copies of a case (common/mla_case.hpp builds it and adds its
// edges), and the comparison.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/mla_case.hpp"
#include "cuda/mla_spec.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "gpu/device_buffer.hpp"
#include "jit/scoped_env.hpp"

namespace deca::test {

// The decode variants this machine runs: the portable kernel everywhere, the sm90 ones on Hopper.
// Selected through DECA_MLA_KERNEL, as a user would. The tests run checked plans by default
// (tests/common/checked_on.cpp), which on Hopper run the sm90 kernels' checked builds: the sm90
// variant is tested with DECA_CHECKED=0, so that the unchecked kernels (what a plan runs with
// checked mode off, and what the benchmarks time) keep their coverage; the checked tests
// (ScopedCheckedKernel below) cover the checked builds.
inline std::vector<std::string> mla_variants() {
  std::vector<std::string> v = {"portable"};
  if (cuda::available() && cuda::compute_capability(0) == 90) {
    v.push_back("sm90");
  }
  return v;
}

// Sets DECA_MLA_KERNEL (and DECA_CHECKED) for `variant` of mla_variants, restoring them when it
// goes.
class ScopedMlaKernel {
 public:
  explicit ScopedMlaKernel(const std::string& variant) {
    save("DECA_MLA_KERNEL", 0);
    save("DECA_CHECKED", 1);
    if (variant == "portable") setenv("DECA_MLA_KERNEL", "portable", 1);
    else unsetenv("DECA_MLA_KERNEL");
    if (variant != "portable") setenv("DECA_CHECKED", "0", 1);
  }
  ~ScopedMlaKernel() {
    for (int i = 0; i < 2; ++i) {
      if (had_[i]) setenv(kNames[i], old_[i].c_str(), 1);
      else unsetenv(kNames[i]);
    }
  }

 private:
  static constexpr const char* kNames[2] = {"DECA_MLA_KERNEL", "DECA_CHECKED"};
  void save(const char* name, int i) {
    if (const char* old = std::getenv(name)) old_[i] = old, had_[i] = true;
  }
  std::string old_[2];
  bool had_[2] = {false, false};
};

// The checked kernels of a variant (mla_variants()): for "portable" the portable checked kernel
// (DECA_MLA_KERNEL=portable), for "sm90" the sm90 kernels' checked builds (what a checked plan
// runs on Hopper), for the plans made in its scope. Checked plans stay checked (DECA_CHECKED is
// left as it is); an unchecked plan made in its scope runs the variant's unchecked kernel.
class ScopedCheckedKernel {
 public:
  explicit ScopedCheckedKernel(const std::string& variant)
      : kernel_("DECA_MLA_KERNEL", variant == "portable" ? "portable" : nullptr) {}

 private:
  jit::testing::ScopedEnv kernel_;
};

// Whether `plan` runs variant's checked decode kernel ("_chk" in its name).
inline void expect_checked_kernel(const MlaPlan& plan, const std::string& variant) {
  const std::string decode = plan.kernel_name.substr(0, plan.kernel_name.find('+'));  // not the combine's
  EXPECT_NE(decode.find("decode_" + variant), std::string::npos) << decode;
  EXPECT_NE(decode.find("_chk"), std::string::npos) << decode;
}

inline MlaSparseArgs host_args(MlaSparseCase& c) {
  MlaSparseArgs a;
  a.q = c.q.view();
  a.kv_cache = c.kv.view();
  a.indices = c.indices.view();
  if (c.spec.topk_length) a.topk_length = c.topk_length.view();
  if (c.spec.attn_sink) a.attn_sink = c.attn_sink.view();
  a.out = c.out.view();
  if (c.spec.lse) a.lse = c.lse.view();
  a.softmax_scale = c.spec.softmax_scale;
  return a;
}

// The CPU reference into c.out / c.lse (poisoned first).
inline void run_reference(MlaSparseCase& c) {
  c.out.fill_bytes(0xFF);
  c.lse.fill_bytes(0xFF);
  mla_decode_sparse(plan_mla_decode(sparse_config(c.spec, Device::cpu())), host_args(c));
}

// Synchronizes, then copies a run's out / lse into host tensors of `out_shape` / `lse_shape`; a
// checked plan's record must be clean unless `expect_clean` is false (the caller checks it).
inline void take_mla_results(const MlaPlan& plan, const DeviceBuffer& out, const DeviceBuffer& lse,
                             const void* workspace, const std::vector<std::int64_t>& out_shape,
                             const std::vector<std::int64_t>& lse_shape, HostTensor& o, HostTensor& l,
                             bool expect_clean) {
  const cudaError_t rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    ADD_FAILURE() << plan.kernel_name << ": " << cudaGetErrorName(rc) << " " << cudaGetErrorString(rc);
  }
  o = HostTensor(DType::kBF16, out_shape);
  l = HostTensor(DType::kFP32, lse_shape);
  out.to_host(o);
  lse.to_host(l);
  // Checked plans: valid inputs leave no record (no false positive).
  if (!expect_clean) return;
  try {
    check_mla_run(plan, workspace, nullptr);
  } catch (const Error& e) {
    ADD_FAILURE() << plan.kernel_name << ": " << e.what();
  }
}

inline TensorView on_device(TensorView v, const DeviceBuffer& b) {
  v.data = b.get();
  v.device = Device::cuda(0);
  return v;
}

// What the sparse and dense device runs share: the plan (made first, under the caller's
// ScopedMlaKernel), the outputs (poisoned before each run), the workspace (zeroed once at
// allocation: a checked plan's record starts clean) and the results.
struct DeviceMlaRun {
  MlaPlan plan;
  DeviceBuffer out, lse, workspace;

  DeviceMlaRun(const MlaConfig& config, const HostTensor& out_like, const HostTensor& lse_like)
      : plan(plan_mla_decode(config)), out(out_like.bytes()), lse(lse_like.bytes()),
        workspace(plan.workspace_bytes) {
    workspace.fill(0);
    poison();
  }
  void poison() const {
    out.fill(0xFF);
    lse.fill(0xFF);
  }
  // args' outputs (views shaped as the case's o and l; the LSE only `with_lse`) and workspace.
  template <class Args>
  void bind(Args& args, const HostTensor& o, const HostTensor& l, bool with_lse) const {
    args.out = on_device(o.view(), out);
    if (with_lse) args.lse = on_device(l.view(), lse);
    args.workspace = workspace.get();
    args.workspace_bytes = workspace.bytes();
  }
  // Synchronizes, then copies out / lse into host tensors shaped like the case's; a checked
  // plan's record must be clean (valid inputs leave none: no false positive) unless
  // `expect_clean` is false (the caller checks it itself).
  template <class Case>
  void results(const Case& c, HostTensor& o, HostTensor& l, bool expect_clean = true) const {
    take_mla_results(plan, out, lse, workspace.get(), c.out.shape(), c.lse.shape(), o, l, expect_clean);
  }
};

// The case's inputs on the GPU, outputs poisoned, a plan and its workspace.
struct DeviceSparse : DeviceMlaRun {
  DeviceBuffer q, kv, indices, topk_length, attn_sink;
  MlaSparseArgs args;

  explicit DeviceSparse(MlaSparseCase& c)
      : DeviceMlaRun(sparse_config(c.spec, Device::cuda(0)), c.out, c.lse),
        q(c.q), kv(c.kv), indices(c.indices), topk_length(c.topk_length), attn_sink(c.attn_sink) {
    const MlaSparseArgs h = host_args(c);
    args.q = on_device(h.q, q);
    args.kv_cache = on_device(h.kv_cache, kv);
    args.indices = on_device(h.indices, indices);
    if (c.spec.topk_length) args.topk_length = on_device(h.topk_length, topk_length);
    if (c.spec.attn_sink) args.attn_sink = on_device(h.attn_sink, attn_sink);
    args.softmax_scale = c.spec.softmax_scale;
    bind(args, c.out, c.lse, c.spec.lse);
  }
  void run(void* stream = nullptr) {
    args.stream = stream;
    launch(plan, args);
  }
  static void launch(const MlaPlan& p, const MlaSparseArgs& a) { mla_decode_sparse(p, a); }
};

template <class Case>
void expect_sparse_matches(const std::string& what, const Case& ref, const HostTensor& out,
                           const HostTensor& lse, double rel_l2 = 1e-2);

// The schedule made once per decode step (reuse_schedule): b's call on the schedule a's run left
// in a's workspace (a: another layer, the same lengths or indices) writes what b's own scheduled
// run writes, bit for bit, within the bounds against `ref` (b's case, its reference computed).
// Returns the reusing call's args. `Run`: DeviceSparse or DeviceDense.
template <class Run, class Case>
auto expect_reused_schedule_matches(const std::string& what, Run& a, Run& b, const Case& ref,
                                    double rel_l2 = 1e-2) {
  HostTensor own_out, own_lse, out, lse;
  b.run();  // b's own schedule, for the bitwise comparison
  b.results(ref, own_out, own_lse);
  b.poison();
  a.run();  // schedules into a's workspace
  auto reuse = b.args;
  reuse.workspace = a.args.workspace;
  reuse.workspace_bytes = a.args.workspace_bytes;
  reuse.reuse_schedule = true;
  Run::launch(a.plan, reuse);
  b.results(ref, out, lse, false);
  expect_sparse_matches(what, ref, out, lse, rel_l2);
  EXPECT_EQ(0, std::memcmp(out.raw(), own_out.raw(), out.bytes())) << what;
  EXPECT_EQ(0, std::memcmp(lse.raw(), own_lse.raw(), lse.bytes())) << what;
  return reuse;
}

// The same inputs give the same bytes (the scheduler is deterministic, every merge runs in a fixed
// order): two runs of dev, its outputs poisoned between them. `Run`: a device run with run(),
// poison() and results(case, out, lse) (DeviceSparse, DeviceDense, the MODEL1 runner).
template <class Run, class Case>
void expect_run_to_run_identical(const std::string& what, Run& dev, const Case& c) {
  HostTensor out0, lse0, out1, lse1;
  dev.run();
  dev.results(c, out0, lse0);
  dev.poison();
  dev.run();
  dev.results(c, out1, lse1);
  EXPECT_EQ(0, std::memcmp(out0.raw(), out1.raw(), out0.bytes())) << what;
  EXPECT_EQ(0, std::memcmp(lse0.raw(), lse1.raw(), lse0.bytes())) << what;
}

// Nothing allocated or synchronized: the run is captured in a CUDA graph, and a replay reads what
// device memory holds then. update() changes the case's inputs (on the host and the device) and
// recomputes its reference; three replays then match it. `Run`: DeviceSparse or DeviceDense.
template <class Run, class Case, class Update>
void expect_graph_replay_matches(const std::string& what, Run& dev, const Case& ref, Update&& update,
                                 double rel_l2 = 1e-2) {
  GraphReplay graph;
  ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t stream) { dev.run(stream); }));
  update();
  dev.poison();
  ASSERT_NO_FATAL_FAILURE(graph.replay(3));
  HostTensor out, lse;
  dev.results(ref, out, lse);
  expect_sparse_matches(what, ref, out, lse, rel_l2);
}

// Output: relative L2 over the whole tensor within bf16's few units of last place, every element
// within a bound of a few bf16 ulps of its row's scale (both sides round to bf16, and the
// kernels' P is bf16: an element that is a small difference of large terms, p1 v1 - p2 v2, keeps
// the rounding error of the large terms, so the bound scales with the row's largest |ref|, not
// the element's own), no NaN; LSE: -inf exactly where the reference has it, else within 2e-3.
// `Case`: MlaSparseCase or MlaDenseCase (its out, lse and spec.lse). Prints the figures when
// DECA_TEST_VERBOSE=1.
template <class Case>
void expect_sparse_matches(const std::string& what, const Case& ref, const HostTensor& out,
                           const HostTensor& lse, double rel_l2) {
  double num = 0, den = 0, max_abs = 0, lse_abs = 0;
  long long nan = 0, inf_mismatch = 0, worst = -1, outside = 0;
  constexpr std::int64_t kRow = 512;  // out is [batch, q_len, heads, 512], contiguous here
  double row_max = 0;
  for (std::int64_t i = 0; i < ref.out.numel(); ++i) {
    if (i % kRow == 0) {
      row_max = 0;
      for (std::int64_t j = i; j < std::min(i + kRow, ref.out.numel()); ++j) {
        const double r = ref.out.get(j);
        if (!std::isnan(r)) row_max = std::max(row_max, std::fabs(r));
      }
    }
    const double a = out.get(i), b = ref.out.get(i);
    if (std::isnan(a) || std::isnan(b)) {
      ++nan;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
    const double scale = std::max(std::fabs(b), 0.25 * row_max);
    if (std::fabs(a - b) > 1e-2 + 1.6e-2 * scale) ++outside, worst = i;
    max_abs = std::max(max_abs, std::fabs(a - b));
  }
  if (ref.spec.lse) {
    for (std::int64_t i = 0; i < ref.lse.numel(); ++i) {
      const float a = lse.data<float>()[i], b = ref.lse.template data<float>()[i];
      if (std::isnan(a) || std::isnan(b)) ++nan;
      else if (std::isinf(a) || std::isinf(b)) inf_mismatch += a != b;
      else lse_abs = std::max(lse_abs, static_cast<double>(std::fabs(a - b)));
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (const char* v = std::getenv("DECA_TEST_VERBOSE"); v && *v == '1') {
    std::printf("    %s: rel_l2 %.3g%%, max_abs %.3g, lse max_abs %.3g\n", what.c_str(), 100 * rel, max_abs,
                lse_abs);
  }
  EXPECT_EQ(nan, 0) << what;
  EXPECT_EQ(inf_mismatch, 0) << what;
  EXPECT_LE(rel, rel_l2) << what << " rel_l2";
  EXPECT_EQ(outside, 0) << what << " elements off by more than 1e-2 + 1.6e-2 |ref| (last at flat "
                        << "index " << worst << "; max_abs " << max_abs << ")";
  EXPECT_LT(lse_abs, 2e-3) << what << " lse";
}

}  // namespace deca::test
