// MLA dense decode through the public API on CUDA against the CPU reference, for the GPU tests:
// the plan's config from a case, device copies of a case (cache slots no request owns are NaN in
// every format, outputs poisoned before each run), and the comparison with its error figures.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
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
  cfg.max_batch = s.max_batch > 0 ? s.max_batch : s.batch;
  cfg.max_q_len = s.q_len;
  cfg.max_seq_len = std::max<int>(1, static_cast<int>(c.block_table.shape()[1]) * s.page_size);
  cfg.lse = s.lse;
  cfg.lse_of_empty_row = static_cast<MlaLseOfEmptyRow>(s.lse_empty);
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
struct DeviceDense : DeviceMlaRun {
  DeviceBuffer q, kv, block_table, seq_lens;
  MlaDenseArgs args;

  explicit DeviceDense(const MlaDenseCase& c, bool checked = checked_by_default())
      : DeviceMlaRun(
            [&] {
              MlaConfig cfg = dense_config(c, Device::cuda(0));
              cfg.checked = checked;
              return cfg;
            }(),
            c.out, c.lse),
        q(c.q), kv(c.kv), block_table(c.block_table), seq_lens(c.seq_lens) {
    args.q = on_device(c.q.view(), q);
    args.kv_cache = on_device(c.kv.view(), kv);
    args.block_table = on_device(c.block_table.view(), block_table);
    args.cache_seqlens = on_device(c.seq_lens.view(), seq_lens);
    args.softmax_scale = c.spec.softmax_scale;
    args.kv_scale = c.spec.kv_format == kMlaKvFP8E4M3 ? c.kv_scale : 1.f;
    bind(args, c.out, c.lse, c.spec.lse);
  }
  void run(void* stream = nullptr) {
    args.stream = stream;
    launch(plan, args);
  }
  static void launch(const MlaPlan& p, const MlaDenseArgs& a) { mla_decode_dense(p, a); }
};

// Output against the reference (the CPU backend: float64 sums over the same stored values,
// rounded once to bf16): as the sparse suite's bounds (expect_sparse_matches) with a relative RMS
// over the whole tensor <= `rel_rms` (~0.3 % expected for every format: the 8-bit ones compute on
// the same bf16-exact values).
inline void expect_dense_matches(const std::string& what, const MlaDenseCase& ref, const HostTensor& out,
                                 const HostTensor& lse, double rel_rms = 4e-3) {
  expect_sparse_matches(what, ref, out, lse, rel_rms);
}

}  // namespace deca::test
