// MLA dense decode through the public API on CUDA against the CPU reference, for the GPU tests:
// the plan's config from a case, device copies of a case (cache slots no request owns are NaN in
// every format, outputs poisoned before each run), and the comparison with its error figures.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/mla_case.hpp"
#include "cpu/reference.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/mla_sparse_gpu_runner.hpp"  // mla_variants, ScopedMlaKernel, on_device

namespace deca::test {

inline MlaCacheFormat dense_format(int kv_format) {
  switch (kv_format) {
    case kMlaKvFP8E4M3: return MlaCacheFormat::kFP8E4M3;
    case kMlaKvFP8Sparse: return MlaCacheFormat::kFP8Sparse;
    default: return MlaCacheFormat::kBF16;
  }
}

inline const char* dense_format_name(int kv_format) {
  return mla_cache_format_name(dense_format(kv_format));
}

// max_seq_len: the block table's capacity (every length a case holds fits it).
inline MlaConfig dense_config(const MlaDenseCase& c, Device device) {
  const MlaCaseSpec& s = c.spec;
  MlaConfig cfg;
  cfg.num_heads = s.num_heads;
  cfg.page_size = s.page_size;
  cfg.sparse = false;
  cfg.kv_format = dense_format(s.kv_format);
  cfg.max_batch = s.batch;
  cfg.max_q_len = s.q_len;
  cfg.max_seq_len = std::max<int>(1, static_cast<int>(c.block_table.shape()[1]) * s.page_size);
  cfg.lse = s.lse;
  cfg.device = device;
  return cfg;
}

// The CPU reference into c.out / c.lse (poisoned first). Called on the params directly: it also
// covers lengths below q_len, which the CPU API refuses and a GPU run computes.
inline void run_dense_reference(MlaDenseCase& c) {
  c.out.fill_bytes(0xFF);
  c.lse.fill_bytes(0xFF);
  cpu::mla_dense_decode(c.params);
}

// The case's inputs on the GPU, outputs poisoned, a plan (made when constructed, so under the
// caller's ScopedMlaKernel) and its workspace.
struct DeviceDense {
  MlaPlan plan;
  DeviceBuffer q, kv, block_table, seq_lens, out, lse, workspace;
  MlaDenseArgs args;

  explicit DeviceDense(const MlaDenseCase& c, bool checked = checked_by_default())
      : plan(plan_mla_decode([&] {
          MlaConfig cfg = dense_config(c, Device::cuda(0));
          cfg.checked = checked;
          return cfg;
        }())),
        q(c.q), kv(c.kv), block_table(c.block_table), seq_lens(c.seq_lens), out(c.out.bytes()),
        lse(c.lse.bytes()), workspace(plan.workspace_bytes) {
    args.q = on_device(c.q.view(), q);
    args.kv_cache = on_device(c.kv.view(), kv);
    args.block_table = on_device(c.block_table.view(), block_table);
    args.cache_seqlens = on_device(c.seq_lens.view(), seq_lens);
    args.out = on_device(c.out.view(), out);
    if (c.spec.lse) args.lse = on_device(c.lse.view(), lse);
    args.softmax_scale = c.spec.softmax_scale;
    args.kv_scale = c.spec.kv_format == kMlaKvFP8E4M3 ? c.kv_scale : 1.f;
    args.workspace = workspace.get();
    args.workspace_bytes = workspace.bytes();
    workspace.fill(0);  // zeroed once at allocation (a checked plan's record starts clean)
    poison();
  }
  void poison() const {
    out.fill(0xFF);
    lse.fill(0xFF);
  }
  void run(void* stream = nullptr) {
    args.stream = stream;
    mla_decode_dense(plan, args);
  }
  // Synchronizes, copies out / lse into host tensors shaped like the case's; a checked plan's
  // record must be clean unless `expect_clean` is false (the caller checks it itself).
  void results(const MlaDenseCase& c, HostTensor& o, HostTensor& l, bool expect_clean = true) const {
    const cudaError_t rc = cudaDeviceSynchronize();
    if (rc != cudaSuccess) {
      ADD_FAILURE() << plan.kernel_name << ": " << cudaGetErrorName(rc) << " " << cudaGetErrorString(rc);
    }
    o = HostTensor(DType::kBF16, c.out.shape());
    l = HostTensor(DType::kFP32, c.lse.shape());
    out.to_host(o);
    lse.to_host(l);
    if (!expect_clean) return;
    try {
      check_mla_run(plan, workspace.get(), nullptr);
    } catch (const Error& e) {
      ADD_FAILURE() << plan.kernel_name << ": " << e.what();
    }
  }
};

// Output against the reference (the CPU backend: float64 sums over the same stored values,
// rounded once to bf16): relative RMS over the whole tensor <= `rel_rms` (~0.3 % expected for
// every format: the 8-bit ones compute on the same bf16-exact values), every element within a
// few bf16 ulps of its row's scale (as the sparse suite's bound), no NaN; LSE -inf exactly where
// the reference has it, else within 2e-3. Prints the figures once per call when DECA_TEST_VERBOSE=1.
inline void expect_dense_matches(const std::string& what, const MlaDenseCase& ref, const HostTensor& out,
                                 const HostTensor& lse, double rel_rms = 4e-3) {
  double num = 0, den = 0, max_abs = 0, lse_abs = 0, row_max = 0;
  long long nan = 0, inf_mismatch = 0, outside = 0, worst = -1;
  constexpr std::int64_t kRow = 512;
  for (std::int64_t i = 0; i < ref.out.numel(); ++i) {
    if (i % kRow == 0) {
      row_max = 0;
      for (std::int64_t j = i; j < i + kRow; ++j) row_max = std::max(row_max, std::fabs(double{ref.out.get(j)}));
    }
    const double a = out.get(i), b = ref.out.get(i);
    if (std::isnan(a) || std::isnan(b)) {
      ++nan;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
    if (std::fabs(a - b) > 1e-2 + 1.6e-2 * std::max(std::fabs(b), 0.25 * row_max)) ++outside, worst = i;
    max_abs = std::max(max_abs, std::fabs(a - b));
  }
  if (ref.spec.lse) {
    for (std::int64_t i = 0; i < ref.lse.numel(); ++i) {
      const float a = lse.data<float>()[i], b = ref.lse.data<float>()[i];
      if (std::isnan(a) || std::isnan(b)) ++nan;
      else if (std::isinf(a) || std::isinf(b)) inf_mismatch += a != b;
      else lse_abs = std::max(lse_abs, static_cast<double>(std::fabs(a - b)));
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (const char* v = std::getenv("DECA_TEST_VERBOSE"); v && *v == '1') {
    std::printf("    %s: rel_rms %.3g%%, max_abs %.3g, lse max_abs %.3g\n", what.c_str(), 100 * rel,
                max_abs, lse_abs);
  }
  EXPECT_EQ(nan, 0) << what;
  EXPECT_EQ(inf_mismatch, 0) << what;
  EXPECT_LE(rel, rel_rms) << what << " relative RMS";
  EXPECT_EQ(outside, 0) << what << " elements off by more than 1e-2 + 1.6e-2 |ref| (last at flat index "
                        << worst << "; max_abs " << max_abs << ")";
  EXPECT_LT(lse_abs, 2e-3) << what << " lse";
}

}  // namespace deca::test
