// Runs one paged GQA case on the GPU through the CUDA backend (plan, workspace, launch) with the
// same GqaParams the CPU reference reads, and compares the two.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "common/paged_gqa_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"
#include "cuda/backend.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"
#include "gpu/device_buffer.hpp"
#include "jit/scoped_env.hpp"
#include "kernels/gqa/sm90/traits.cuh"

namespace deca::test {

struct GpuRun {
  GqaPlan plan;
  HostTensor out, lse;
};

struct GpuOptions {
  SplitMode split_mode = SplitMode::kAuto;
  int split_tokens = 0;
  int max_batch = 0;     // 0: the case's batch
  int max_seq_len = 0;   // 0: the longest request
  int run_batch = 0;     // 0: the case's batch (fewer: run a prefix of the requests)
  int beam_width = 1;    // beams per request (adjacent batch entries)
  // 8-bit caches: the path a plan takes on this arch (make_gqa_key's path_arch; 0: this GPU's),
  // compiled for this GPU: 80 the ldmatrix-fed widening, 89 the two-term e4m3 mma.sync for fp8
  // (this GPU sm_89+; else it widens), 90 two_term_qk for int8 (the Hopper kernel for fp8 on
  // sm_90a only).
  int path_arch = 0;
  float skip_softmax_factor = 0.f;  // GqaConfig::skip_softmax_factor (> 0: the "_skip" kernel)
  // 16-bit caches: DECA_GQA_SM90_16BIT for this plan (1: the Hopper wgmma kernel on sm_90a where
  // it applies, 0: the portable kernel); -1 leaves the environment as it is.
  int hopper_16bit = -1;
  // DECA_GQA_SPLITS for this plan (splits per unit instead of the split model's count); 0 leaves
  // the environment as it is.
  int splits = 0;
  bool checked = false;  // GqaConfig::checked
};

// A named case and the plan options it runs with (the suites that walk a list of them).
struct NamedGpuCase {
  std::string name;
  GqaCaseSpec spec;
  GpuOptions opt;
};

// The named case's inputs, drawn from the test seed with `salt`.
inline GqaCase build_named_case(const NamedGpuCase& nc, std::uint64_t salt) {
  auto rng = make_rng(salt);
  return build_gqa_case(nc.spec, rng);
}

// Whether the 16-bit Hopper kernel covers a cache of this head_dim, dtype and beam width (the
// planner's own test, kernels/gqa/sm90/traits.cuh): the cases the GPU suites run through it.
inline bool hopper_16bit_covers(int head_dim, DType kv, int beam_width) {
  return gqa::sm90::supports_16bit(head_dim, static_cast<int>(kv), beam_width);
}

inline GqaConfig gpu_config(const GqaCase& c, const GpuOptions& o) {
  const auto& s = c.spec;
  GqaConfig cfg;
  cfg.num_q_heads = s.num_q_heads;
  cfg.num_kv_heads = s.num_kv_heads;
  cfg.head_dim = s.head_dim;
  cfg.page_size = s.page_size;
  cfg.layout = s.layout;
  cfg.q_dtype = s.q_dtype;
  cfg.kv_dtype = s.kv_dtype;
  cfg.out_dtype = s.out_dtype;
  cfg.max_batch = o.max_batch ? o.max_batch : s.batch;
  cfg.max_q_len = s.q_len;
  int longest = 1;
  for (int l : c.lens) longest = std::max(longest, l);
  cfg.max_seq_len = o.max_seq_len ? o.max_seq_len : longest;
  cfg.tree_mask = s.tree_mask;
  cfg.sinks = s.sinks;
  cfg.lse = s.lse;
  cfg.per_head_kv_scale = s.per_head_scales;
  cfg.window = s.window;
  cfg.softcap = s.softcap;
  cfg.split_mode = o.split_mode;
  cfg.split_tokens = o.split_tokens;
  cfg.beam_width = o.beam_width;
  cfg.skip_softmax_factor = o.skip_softmax_factor;
  cfg.checked = o.checked;
  cfg.device = Device::cuda(0);
  return cfg;
}

// A case's inputs and outputs on the device, a zeroed workspace for `plan`, and the params that
// point at them (outputs poisoned).
struct DeviceCase {
  DeviceBuffer q, k, v, pt, sl, out, lse, mask, sinks, ks, vs, ws;
  GqaParams params{};

  DeviceCase(const GqaCase& c, const GqaPlan& plan)
      : q(c.q), k(c.k_pool), pt(c.page_table), sl(c.seq_lens), out(c.out.bytes()),
        lse(c.lse.bytes()), ws(plan.workspace_bytes) {
    GqaParams& p = params;
    p = c.params;
    p.q = q.get();
    p.k_cache = k.get();
    if (c.spec.kv_one_allocation) {
      p.v_cache = static_cast<const char*>(k.get()) +
                  (static_cast<const char*>(c.params.v_cache) - static_cast<const char*>(c.params.k_cache));
    } else {
      v = DeviceBuffer(c.v_pool);
      p.v_cache = v.get();
    }
    p.page_table = pt.as<int>();
    p.seq_lens = sl.as<int>();
    p.out = out.get();
    p.lse = c.spec.lse ? lse.as<float>() : nullptr;
    if (c.spec.tree_mask) {
      mask = DeviceBuffer(c.tree_mask);
      p.tree_mask = mask.as<unsigned>();
    }
    if (c.spec.sinks) {
      sinks = DeviceBuffer(c.sinks);
      p.sinks = sinks.as<float>();
    }
    if (c.spec.per_head_scales) {
      ks = DeviceBuffer(c.k_scales);
      vs = DeviceBuffer(c.v_scales);
      p.k_scales = ks.as<float>();
      p.v_scales = vs.as<float>();
    }
    ws.fill(0);
    // What api::gqa_params adds from the plan: its splits and the workspace's parts.
    p.num_splits = plan.num_splits;
    p.split_tokens = plan.split_tokens;
    const cuda::GqaWorkspace w = cuda::gqa_workspace(plan, ws.get());
    p.ws_partial_o = w.partial_o;
    p.ws_partial_ml = w.partial_ml;
    p.ws_counters = w.counters;
    p.check = w.check;
    p.max_seq_len = plan.config.max_seq_len;
    p.skip_softmax_factor = plan.config.skip_softmax_factor;
    out.fill(0xFF);
    lse.fill(0xFF);
  }

  // The outputs, copied back into a GpuRun.
  GpuRun results(const GqaCase& c, const GqaPlan& plan) const {
    GpuRun r;
    r.plan = plan;
    r.out = HostTensor(c.out.dtype(), c.out.shape());
    r.lse = HostTensor(DType::kFP32, c.lse.shape());
    out.to_host(r.out);
    lse.to_host(r.lse);
    return r;
  }
};

// plan_gqa_decode with the options' path_arch, DECA_GQA_SM90_16BIT and DECA_GQA_SPLITS (read when the plan is made; the plan keeps the kernel and splits it named).
inline void plan_with(GqaPlan& plan, const GpuOptions& o) {
  std::optional<jit::testing::ScopedEnv> hopper, splits;
  if (o.hopper_16bit >= 0) hopper.emplace("DECA_GQA_SM90_16BIT", o.hopper_16bit ? "1" : "0");
  if (o.splits > 0) splits.emplace("DECA_GQA_SPLITS", std::to_string(o.splits).c_str());
  cuda::plan_gqa_decode(plan, o.path_arch);
}

inline GqaPlan gpu_plan(const GqaCase& c, const GpuOptions& o = {}) {
  GqaPlan plan;
  plan.config = gpu_config(c, o);
  plan_with(plan, o);
  return plan;
}

// Copies the case to the device, runs it once and returns the outputs.
inline GpuRun run_gqa_on_gpu(const GqaCase& c, const GpuOptions& o = {}) {
  const GqaPlan plan = gpu_plan(c, o);
  DeviceCase dev(c, plan);
  if (o.run_batch) dev.params.batch = o.run_batch;
  cuda::gqa_decode(plan, dev.params, nullptr);
  const cudaError_t rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    ADD_FAILURE() << "kernel " << plan.kernel_name << ": " << cudaGetErrorName(rc) << " "
                  << cudaGetErrorString(rc);
  }
  // Checked plans (the tests' default): valid inputs leave no record (no false positive).
  try {
    check_gqa_run(plan, dev.ws.get(), nullptr);
  } catch (const Error& e) {
    ADD_FAILURE() << "kernel " << plan.kernel_name << ": " << e.what();
  }
  return dev.results(c, plan);
}

struct Diff {
  double rel_l2 = 0;
  double max_abs = 0;
  double lse_max_abs = 0;
  long long mismatched_inf = 0;
  long long nan = 0;
};

// Compares the first `batch` requests (all when 0) of the GPU run with the reference outputs.
inline Diff compare(const GqaCase& ref, const GpuRun& gpu, int batch = 0) {
  Diff d;
  const auto& s = ref.spec;
  const long long per_req = static_cast<long long>(s.q_len) * s.num_q_heads * s.head_dim;
  const long long n = (batch ? batch : s.batch) * per_req;
  double num = 0, den = 0;
  for (long long i = 0; i < n; ++i) {
    const double a = gpu.out.get(i), b = ref.out.get(i);
    if (std::isnan(a) || std::isnan(b)) {
      ++d.nan;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
    d.max_abs = std::max(d.max_abs, std::fabs(a - b));
  }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (s.lse) {
    const long long m = (batch ? batch : s.batch) * static_cast<long long>(s.q_len) * s.num_q_heads;
    for (long long i = 0; i < m; ++i) {
      const float a = gpu.lse.data<float>()[i], b = ref.lse.data<float>()[i];
      if (std::isnan(a) || std::isnan(b)) {
        ++d.nan;
      } else if (std::isinf(a) || std::isinf(b)) {
        if (a != b) ++d.mismatched_inf;
      } else {
        d.lse_max_abs = std::max(d.lse_max_abs, static_cast<double>(std::fabs(a - b)));
      }
    }
  }
  return d;
}

inline std::string describe(const Diff& d) {
  std::ostringstream s;
  s << "rel_l2=" << d.rel_l2 << " max_abs=" << d.max_abs << " lse_max_abs=" << d.lse_max_abs
    << " inf_mismatch=" << d.mismatched_inf << " nan=" << d.nan;
  return s.str();
}

// Tolerance on the relative L2 error of the output, by output dtype: both sides round to it, so
// the bound is a few units of its last place (bf16 2^-8, fp16 2^-11, e4m3 2^-3 relative).
inline double out_tolerance(DType out) {
  switch (out) {
    case DType::kFP16: return 4e-3;
    case DType::kFP8E4M3: return 6e-2;
    default: return 1e-2;
  }
}

// A case spec of the GPU suites: heads, head_dim, page size and KV dtype; the rest defaults.
inline GqaCaseSpec base_spec(int q_heads, int kv_heads, int head_dim, int page, DType kv) {
  return GqaCaseSpec{.num_q_heads = q_heads,
                     .num_kv_heads = kv_heads,
                     .head_dim = head_dim,
                     .page_size = page,
                     .kv_dtype = kv};
}

// LSE is fp32 on both sides; the kernel's products run in the cache's 16-bit type, so an fp16 q
// against a bf16 cache is rounded to bf16 first (8 significant bits instead of 11): logits then
// move by ~2^-9 of their size, which the LSE shows directly.
// The Hopper fp8 kernel's logits come from e4m3 wgmma (q as two e4m3 terms, ~2^-8 of each
// element; the tensor core's accumulation keeps ~14 bits, the DeepSeek-V3 report's figure for
// Hopper FP8 GEMM): the error grows with the logit. On unit logits up to 2.9e-3 was measured at
// q_len 8 on the H200; on peaked data (a few keys 5 to 12 above the bulk, largest logits 10 to 17)
// 0.010 to 0.020, ~2^-9 of the largest logit. So for that kernel the bound is the larger of 5e-3
// and 2^-8 of `max_logit`, the largest |logit| of the case (max_abs_logit, skip_case.hpp; 0 where
// the caller did not compute it); 2e-3 elsewhere.
inline double lse_tolerance(const GqaCaseSpec& s, const std::string& kernel, double max_logit = 0.0) {
  const bool q_rounded = s.kv_dtype == DType::kBF16 && s.q_dtype == DType::kFP16;
  if (q_rounded) return 1e-2;
  if (kernel.find("_wgmma") == std::string::npos) return 2e-3;
  const bool eight_bit = s.kv_dtype == DType::kFP8E4M3 || s.kv_dtype == DType::kINT8;
  return eight_bit ? std::max(5e-3, max_logit / 256.0) : 5e-3;
}

// Runs the CPU reference on the case (outputs poisoned first) and checks the GPU run against it:
// every element written (no NaN), -inf LSE where the reference has it, the error bounds.
inline void expect_matches_reference(const std::string& name, GqaCase& c, const GpuRun& gpu,
                                     double max_logit = 0.0) {
  poison_outputs(c);
  cpu::gqa_decode(c.params);
  const Diff d = compare(c, gpu);
  std::printf("[gpu] %-28s %-56s splits=%-3d %s\n", name.c_str(), gpu.plan.kernel_name.c_str(),
              gpu.plan.num_splits, describe(d).c_str());
  EXPECT_EQ(d.nan, 0) << seed_message();
  EXPECT_EQ(d.mismatched_inf, 0) << seed_message();
  EXPECT_LE(d.rel_l2, out_tolerance(c.spec.out_dtype)) << seed_message();
  EXPECT_LE(d.lse_max_abs, lse_tolerance(c.spec, gpu.plan.kernel_name, max_logit)) << seed_message();
}

// Test logs name a case, not its bytes.

}  // namespace deca::test
