// The CUDA dense MLA decode backend (src/cuda/mla_dense.cpp: the scheduler, the portable
// kernel's dense mode, the combine) called directly, against the CPU reference. Each case's
// cache is stored in the format under test (bf16 rows, e4m3 rows with one scale, 656-byte FP8
// tokens) and the reference reads its bf16 equivalent: every stored value times its scale,
// rounded to bf16, as the kernels dequantize it. Heads 1..128 (one and two head blocks, odd
// counts), pages 1..256, q_len 1..4 (causal among the new tokens), ragged lengths (0, 1, shorter
// than q_len, a page +- 1), padded cache rows, unused cache slots and outputs poisoned with NaN;
// then one long request cut over every partition, checked records, reuse of the schedule and
// CUDA graph replay with new lengths. Skips itself without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/mla_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"
#include "cuda/backend.hpp"
#include "deca/quant.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/mla_sparse_gpu_runner.hpp"
#include "kernels/common/check_record.cuh"

namespace deca::test {
namespace {

const char* format_name(int f) {
  return f == kMlaKvBF16 ? "bf16" : (f == kMlaKvFP8E4M3 ? "fp8_e4m3" : "fp8_sparse");
}

MlaCacheFormat cache_format(int f) {
  return f == kMlaKvBF16 ? MlaCacheFormat::kBF16
                         : (f == kMlaKvFP8E4M3 ? MlaCacheFormat::kFP8E4M3 : MlaCacheFormat::kFP8Sparse);
}

// A dense case (tests/common/mla_case.hpp: bf16 values, shuffled blocks) with its cache stored in
// `format`, rows padded by `pad` elements, and the reference's cache replaced by the stored
// values' bf16 equivalent.
struct DenseKernelCase {
  MlaDenseCase c;
  int format = kMlaKvBF16;
  float kv_scale = 1.f;
  int row = kMlaQk;  // elements per stored row, padding included
  HostTensor stored;
};

DenseKernelCase make_case(const MlaCaseSpec& spec, int format, int pad, std::mt19937_64& rng) {
  DenseKernelCase k{build_mla_dense_case(spec, rng)};
  k.format = format;
  MlaDenseCase& c = k.c;
  const auto& s = c.spec;
  const std::int64_t blocks = c.kv.shape()[0];
  const std::int64_t slots = blocks * s.page_size;
  // The slots some request's token occupies; every other one is poisoned in the stored cache.
  std::vector<char> used(static_cast<std::size_t>(slots), 0);
  const std::int64_t cols = c.block_table.shape()[1];
  for (int b = 0; b < s.batch; ++b) {
    for (int t = 0; t < c.lens[b]; ++t) {
      const std::int64_t blk = c.block_table.data<int>()[b * cols + t / s.page_size];
      used[static_cast<std::size_t>(blk * s.page_size + t % s.page_size)] = 1;
    }
  }
  HostTensor finite(DType::kBF16, c.kv.shape());  // NaN poison replaced by 0 for the packer
  for (std::int64_t i = 0; i < c.kv.numel(); ++i) finite.set(i, used[i / kMlaQk] ? c.kv.get(i) : 0.f);

  HostTensor equivalent(DType::kBF16, c.kv.shape());
  const int stored_row = format == kMlaKvFP8Sparse ? kMlaTokenBytes : kMlaQk;
  k.row = stored_row + pad;
  const DType dtype = format == kMlaKvBF16 ? DType::kBF16 : (format == kMlaKvFP8E4M3 ? DType::kFP8E4M3 : DType::kUINT8);
  k.stored = HostTensor(dtype, {blocks, s.page_size, 1, k.row});
  k.stored.fill_bytes(0xFF);  // NaN (bf16, e4m3, the token's scales) in padding and unused slots
  const std::size_t elem = dtype_size(dtype);
  if (format == kMlaKvBF16) {
    equivalent = HostTensor(DType::kBF16, c.kv.shape());
    std::memcpy(equivalent.raw(), finite.raw(), finite.bytes());
  } else if (format == kMlaKvFP8E4M3) {
    // A scale that is not a power of two: the kernel's fp32 product must round as the reference's.
    k.kv_scale = 0.0123f;
    HostTensor bytes(DType::kFP8E4M3, c.kv.shape());
    for (std::int64_t i = 0; i < c.kv.numel(); ++i) {
      const std::uint8_t code = float_to_fp8e4m3(finite.get(i) / k.kv_scale);
      bytes.data<std::uint8_t>()[i] = code;
      equivalent.set(i, fp8e4m3_to_float(code) * k.kv_scale);
    }
    finite = std::move(bytes);
  } else {
    HostTensor tokens(DType::kUINT8, {blocks, s.page_size, 1, kMlaTokenBytes});
    pack_mla_fp8(finite.view(), tokens.view());
    unpack_mla_fp8(tokens.view(), equivalent.view());
    finite = std::move(tokens);
  }
  for (std::int64_t slot = 0; slot < slots; ++slot) {
    if (!used[static_cast<std::size_t>(slot)]) continue;
    std::memcpy(static_cast<char*>(k.stored.raw()) + slot * k.row * elem,
                static_cast<const char*>(finite.raw()) + slot * stored_row * elem, stored_row * elem);
  }
  // The reference's cache: the equivalent values, NaN where no token lives.
  for (std::int64_t i = 0; i < c.kv.numel(); ++i) {
    if (used[i / kMlaQk]) c.kv.set(i, equivalent.get(i));
  }
  c.bind();
  return k;
}

void run_reference(MlaDenseCase& c) {
  c.out.fill_bytes(0xFF);
  c.lse.fill_bytes(0xFF);
  cpu::mla_dense_decode(c.params);
}

MlaConfig dense_config(const DenseKernelCase& k, int max_seq_len, bool checked) {
  MlaConfig cfg;
  cfg.num_heads = k.c.spec.num_heads;
  cfg.page_size = k.c.spec.page_size;
  cfg.sparse = false;
  cfg.kv_format = cache_format(k.format);
  cfg.max_batch = k.c.spec.batch;
  cfg.max_q_len = k.c.spec.q_len;
  cfg.max_seq_len = max_seq_len;
  cfg.lse = k.c.spec.lse;
  cfg.checked = checked;
  cfg.device = Device::cuda(0);
  return cfg;
}

// The case's inputs on the GPU, outputs poisoned, a plan of the backend and its workspace.
struct DeviceDense {
  MlaPlan plan;
  DeviceBuffer q, kv, block_table, seq_lens, out, lse, workspace;
  MlaDenseParams params{};

  DeviceDense(const DenseKernelCase& k, int max_seq_len, bool checked)
      : q(k.c.q), kv(k.stored), block_table(k.c.block_table), seq_lens(k.c.seq_lens),
        out(k.c.out.bytes()), lse(k.c.lse.bytes()) {
    plan.config = dense_config(k, max_seq_len, checked);
    cuda::plan_mla_dense(plan);
    workspace = DeviceBuffer(plan.workspace_bytes);
    workspace.fill(0);
    params = k.c.params;
    params.q = q.get();
    params.kv = kv.get();
    params.kv_stride_slot = k.row;
    params.kv_stride_block = static_cast<long long>(k.row) * k.c.spec.page_size;
    params.kv_format = k.format;
    params.kv_scale = k.kv_scale;
    params.block_table = block_table.as<int>();
    params.seq_lens = seq_lens.as<int>();
    params.out = out.get();
    params.lse = k.c.spec.lse ? lse.as<float>() : nullptr;
    poison();
  }
  void poison() const {
    out.fill(0xFF);
    lse.fill(0xFF);
  }
  void run(void* stream = nullptr, bool reuse = false) {
    cuda::mla_dense_decode(plan, params, workspace.get(), stream, reuse);
  }
  // The checked plan's record (cleared on the device); kCheckClean for an unchecked one.
  CheckRecord record() const {
    CheckRecord rec{};
    if (!plan.config.checked) return rec;
    const void* at = static_cast<const char*>(workspace.get()) + plan.workspace_bytes - kCheckBytes;
    cuda::take_check_record(0, at, nullptr, rec, "mla_dense_kernel_test");
    return rec;
  }
  void results(const MlaDenseCase& c, HostTensor& o, HostTensor& l) const {
    const cudaError_t rc = cudaDeviceSynchronize();
    EXPECT_EQ(rc, cudaSuccess) << plan.kernel_name << ": " << cudaGetErrorString(rc);
    o = HostTensor(DType::kBF16, c.out.shape());
    l = HostTensor(DType::kFP32, c.lse.shape());
    out.to_host(o);
    lse.to_host(l);
  }
};

int max_len(const std::vector<int>& lens) { return std::max(1, *std::max_element(lens.begin(), lens.end())); }

// Runs the case on the GPU twice (bitwise the same), with the reference, and compares.
void expect_case(const std::string& what, DenseKernelCase& k, bool checked) {
  run_reference(k.c);
  DeviceDense dev(k, max_len(k.c.lens), checked);
  HostTensor out0, lse0, out1, lse1;
  dev.run();
  dev.results(k.c, out0, lse0);
  EXPECT_EQ(dev.record().kind, kCheckClean) << what << ": a checked run of valid inputs recorded";
  expect_sparse_matches(what + " " + dev.plan.kernel_name, k.c, out0, lse0);
  dev.poison();
  dev.run();
  dev.results(k.c, out1, lse1);
  EXPECT_EQ(0, std::memcmp(out0.raw(), out1.raw(), out0.bytes())) << what << ": run to run";
  EXPECT_EQ(0, std::memcmp(lse0.raw(), lse1.raw(), lse0.bytes())) << what << ": run to run";
}

MlaCaseSpec spec(int batch, int q_len, int heads, int page, std::vector<int> lens) {
  MlaCaseSpec s;
  s.batch = batch;
  s.q_len = q_len;
  s.num_heads = heads;
  s.page_size = page;
  s.seq_lens = std::move(lens);
  return s;
}

// Ragged lengths around the page size: 1, a page - 1 / + 1, shorter than q_len, a few pages.
std::vector<int> ragged(int page, int q_len, int variant) {
  std::vector<int> l = {std::max(1, page - 1), page + 1, 1 + variant % 3, 2 * page + 37 + 9 * variant};
  if (q_len > 1) l.push_back(q_len - 1);
  return l;
}

TEST(MlaDenseKernel, EveryFormatHeadCountAndPageSize) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(301);
  DECA_SEED_TRACE();
  int n = 0;
  for (int format : {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
    for (int heads : {1, 16, 64, 100, 128}) {
      for (int page : {1, 16, 64, 256}) {
        const int q_len = 1 + n % 4;
        const bool checked = n % 2 == 0;
        const int pad = n % 3 == 0 ? 32 : 0;  // rows padded by 32 elements (16-byte multiples)
        std::vector<int> lens = ragged(page, q_len, n);
        const int batch = static_cast<int>(lens.size());
        DenseKernelCase k = make_case(spec(batch, q_len, heads, page, lens), format, pad, rng);
        expect_case(std::string(format_name(format)) + " h" + std::to_string(heads) + " page " +
                        std::to_string(page) + " q_len " + std::to_string(q_len) + (pad ? " padded" : ""),
                    k, checked);
        ++n;
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Causal among the new tokens: query token i of a request of length len sees its first
// len - (q_len - 1 - i) tokens; lengths 0 .. q_len leave some query tokens no key at all
// (zeros, LSE -inf).
TEST(MlaDenseKernel, QueryTokensAreCausal) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(302);
  DECA_SEED_TRACE();
  for (int format : {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
    for (int q_len = 1; q_len <= 4; ++q_len) {
      DenseKernelCase k = make_case(spec(7, q_len, 24, 16, {0, 1, 2, 3, 4, 64, 65}), format, 0, rng);
      expect_case(std::string(format_name(format)) + " q_len " + std::to_string(q_len), k, q_len % 2 == 1);
      if (HasFatalFailure()) return;
    }
  }
}

// One request much longer than a partition's share: the schedule cuts it over every partition
// and the combine merges the pieces.
TEST(MlaDenseKernel, OneLongRequestSpreadsOverThePartitions) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(303);
  DECA_SEED_TRACE();
  struct Row {
    int format, len, heads;
  };
  for (const Row r : {Row{kMlaKvBF16, 131072, 8}, Row{kMlaKvFP8E4M3, 32768, 128}, Row{kMlaKvFP8Sparse, 20000, 16}}) {
    DenseKernelCase k = make_case(spec(1, 1, r.heads, 64, {r.len}), r.format, 0, rng);
    expect_case(std::string(format_name(r.format)) + " one request of " + std::to_string(r.len), k, false);
    DeviceDense dev(k, r.len, false);
    EXPECT_GT(dev.plan.num_parts, 1);
  }
}

// Checked plans record a block id outside [0, num_blocks) as block_table[request][column] and
// a length outside [0, min(max_seq_len, the table's columns * page_size)] as kCheckTopkLength
// (the run's cache_seqlens), read nothing outside the cache, and leave the record for the host;
// unchecked plans skip the same entries, so a checked kernel writes its unchecked kernel's bytes.
// Both checked kernels, the portable one and on Hopper the sm90 ones (the default there:
// the wide kernel for bf16 / e4m3, the direct kernel for the 656-byte token at these 16 heads),
// must leave the same record.
TEST(MlaDenseKernel, CheckedRecordsBadBlockIdsAndLengths) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(304);
  DECA_SEED_TRACE();
  for (int format : {kMlaKvBF16, kMlaKvFP8E4M3, kMlaKvFP8Sparse}) {
    DenseKernelCase k = make_case(spec(3, 2, 16, 16, {40, 70, 5}), format, 0, rng);
    const int num_blocks = static_cast<int>(k.stored.shape()[0]);
    const int cols = static_cast<int>(k.c.block_table.shape()[1]);
    struct Bad {
      int entry;  // flat index into block_table, or -1 - request for a length
      int value;
      unsigned kind;
      int request, position;
      long long hi;
    };
    const int max_seq_len = 70;
    struct Run {
      CheckRecord rec;
      HostTensor out, lse;
    };
    // A run of the case with this block table and these lengths on variant's kernel; the plan's
    // record, read, and the outputs.
    auto run_of = [&](const HostTensor& table, const HostTensor& lens, int plan_max_seq_len, bool checked,
                      const std::string& variant) {
      ScopedCheckedKernel scoped(variant);
      DeviceDense dev(k, plan_max_seq_len, checked);
      if (checked) expect_checked_kernel(dev.plan, variant);
      dev.block_table.from_host(table);
      dev.seq_lens.from_host(lens);
      dev.run();
      Run r;
      dev.results(k.c, r.out, r.lse);
      r.rec = dev.record();
      EXPECT_EQ(dev.record().kind, kCheckClean) << format_name(format) << ": the record is cleared when read";
      return r;
    };
    for (const std::string& variant : mla_variants()) {
      for (const Bad bad : {Bad{1 * cols + 3, num_blocks, kCheckPageId, 1, 3, num_blocks},
                            Bad{0 * cols + 0, -2, kCheckPageId, 0, 0, num_blocks},
                            Bad{0 * cols + 1, -1, kCheckPageId, 0, 1, num_blocks},
                            Bad{-1 - 2, -5, kCheckTopkLength, 2, 0, max_seq_len},
                            Bad{-1 - 1, max_seq_len + 1, kCheckTopkLength, 1, 0, max_seq_len}}) {
        HostTensor table = k.c.block_table;  // copies: the case stays valid for the next row
        HostTensor lens = k.c.seq_lens;
        if (bad.entry >= 0) table.data<int>()[bad.entry] = bad.value;
        else lens.data<int>()[-1 - bad.entry] = bad.value;
        const std::string at = variant + " " + format_name(format) + " value " + std::to_string(bad.value);
        const Run unchecked = run_of(table, lens, max_seq_len, false, variant);
        const Run checked = run_of(table, lens, max_seq_len, true, variant);
        EXPECT_EQ(unchecked.rec.kind, kCheckClean) << at;
        EXPECT_EQ(checked.rec.kind, bad.kind) << at;
        EXPECT_EQ(checked.rec.request, bad.request) << at;
        EXPECT_EQ(checked.rec.token, 0) << at;
        EXPECT_EQ(checked.rec.position, bad.position) << at;
        EXPECT_EQ(checked.rec.value, bad.value) << at;
        EXPECT_EQ(checked.rec.hi, bad.hi) << at;
        EXPECT_EQ(0, std::memcmp(checked.out.raw(), unchecked.out.raw(), checked.out.bytes())) << at;
        EXPECT_EQ(0, std::memcmp(checked.lse.raw(), unchecked.lse.raw(), checked.lse.bytes())) << at;
      }
      // A length within max_seq_len but past the block table's columns: recorded against
      // columns * page_size (the tokens past the columns are skipped, never read).
      HostTensor table = k.c.block_table;
      HostTensor lens = k.c.seq_lens;
      table.data<int>()[1 * cols + cols - 1] = table.data<int>()[1 * cols];  // every column valid
      lens.data<int>()[1] = cols * 16 + 4;
      const Run r = run_of(table, lens, 4 * cols * 16, true, variant);
      const std::string at = variant + " " + format_name(format);
      EXPECT_EQ(r.rec.kind, kCheckTopkLength) << at;
      EXPECT_EQ(r.rec.request, 1) << at;
      EXPECT_EQ(r.rec.value, cols * 16 + 4) << at;
      EXPECT_EQ(r.rec.hi, cols * 16) << at;
    }
  }
}

// The metadata made once per decode step: a run on the schedule the previous one left writes what
// a scheduled run writes, bit for bit; and the three launches captured in a CUDA graph replay with
// the lengths found in device memory at replay time.
TEST(MlaDenseKernel, ReusedScheduleAndGraphReplayWithNewLengths) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(305);
  DECA_SEED_TRACE();
  for (int format : {kMlaKvBF16, kMlaKvFP8E4M3}) {
    DenseKernelCase k = make_case(spec(5, 2, 64, 64, {900, 3, 130, 64, 2000}), format, 0, rng);
    run_reference(k.c);
    DeviceDense dev(k, 2048, false);
    HostTensor out0, lse0, out1, lse1;
    GraphReplay graph;
    const cudaStream_t stream = graph.stream();
    dev.run(stream);
    dev.results(k.c, out0, lse0);
    expect_sparse_matches(std::string(format_name(format)) + " scheduled", k.c, out0, lse0);
    dev.poison();
    dev.run(stream, /*reuse=*/true);
    dev.results(k.c, out1, lse1);
    EXPECT_EQ(0, std::memcmp(out0.raw(), out1.raw(), out0.bytes())) << format_name(format);
    EXPECT_EQ(0, std::memcmp(lse0.raw(), lse1.raw(), lse0.bytes())) << format_name(format);

    ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t st) { dev.run(st); }, /*warm=*/false));
    // Shorter lengths (the tokens past them stay valid cache entries; the reference reads the same).
    for (int b = 0; b < k.c.spec.batch; ++b) {
      int& l = k.c.seq_lens.data<int>()[b];
      l = b % 2 ? l / 3 : (l + 1) / 2;
    }
    dev.seq_lens.from_host(k.c.seq_lens);
    run_reference(k.c);
    dev.poison();
    ASSERT_NO_FATAL_FAILURE(graph.replay(3));
    HostTensor out, lse;
    dev.results(k.c, out, lse);
    expect_sparse_matches(std::string(format_name(format)) + " graph replay", k.c, out, lse);
  }
}

}  // namespace
}  // namespace deca::test
