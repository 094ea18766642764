// MLA MODEL1 sparse decode on the GPU (issue 33: the 584-byte token, a second cache) against the
// float64 reference of tests/gpu/mla_model1_case.hpp, through the CUDA backend with
// MlaSparseParams (kv_format kMlaKvModel1, extra_*), for every decode variant this machine runs
// (the portable kernel everywhere; on Hopper the sm90 kernels: the direct kernel up to 16 heads,
// the wide one above, DirectKernelUpTo16Heads): heads
// {1, 8, 16, 64, 100, 128} x q_len {1, 2, 4}, pages {2, 64, 256} for both caches, ragged lengths
// with 0 in either cache, all-invalid rows, duplicates, the sink, poisoned pad bytes and unused
// slots, NaN-poisoned outputs; bitwise identity run to run, graph capture + replay with new
// lengths, a schedule reused across layers (and refused for another extra list), and the checked
// kernel's offenders in either cache. Seed: DECA_TEST_SEED. Skipped where no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "cpu/reference.hpp"
#include "cuda/backend.hpp"
#include "deca/error.hpp"
#include "gpu/mla_model1_case.hpp"
#include "gpu/mla_sparse_gpu_runner.hpp"
#include "kernels/mla/schedule/schedule.cuh"

namespace deca::test {
namespace {

using namespace model1_gpu;

template <class T>
DeviceBuffer device_copy(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return b;
}

// A case's inputs on the GPU, outputs poisoned, a plan of the variant DECA_MLA_KERNEL selects
// (ScopedMlaKernel) and its workspace.
struct Model1Device {
  MlaPlan plan;
  DeviceBuffer q, kv, extra, indices, extra_indices, topk_length, extra_topk_length, sink, out, lse, ws;
  MlaSparseParams p{};

  Model1Device(const Model1Case& c, bool checked)
      : q(c.q), kv(device_copy(c.kv.bytes)), extra(device_copy(c.extra.bytes)),
        indices(device_copy(c.indices)), extra_indices(device_copy(c.extra_indices)),
        topk_length(device_copy(c.topk_length)), extra_topk_length(device_copy(c.extra_topk_length)),
        sink(device_copy(c.attn_sink)), out(c.out.bytes()), lse(c.lse.bytes()) {
    const Model1Spec& s = c.spec;
    MlaConfig& cfg = plan.config;
    cfg.num_heads = s.num_heads;
    cfg.page_size = s.page_size;
    cfg.sparse = true;
    cfg.kv_format = MlaCacheFormat::kModel1;
    cfg.max_batch = s.batch;
    cfg.max_q_len = s.q_len;
    cfg.topk = s.topk;
    cfg.lse = s.lse;
    cfg.attn_sink = s.attn_sink;
    cfg.topk_length = s.topk_length;
    cfg.extra_topk = s.extra_topk;
    cfg.extra_page_size = s.extra_page_size;
    cfg.extra_topk_length = s.extra_topk_length;
    cfg.checked = checked;
    cfg.device = Device::cuda(0);
    cuda::plan_mla_sparse(plan);
    ws = DeviceBuffer(plan.workspace_bytes);
    ws.fill(0);
    fill_params(c);
    poison();
  }

  void fill_params(const Model1Case& c) {
    p = model1_params(c, {q.get(), kv.get(), extra.get(), indices.as<int>(), extra_indices.as<int>(),
                          topk_length.as<int>(), extra_topk_length.as<int>(), sink.as<float>(), out.get(),
                          lse.as<float>()});
  }
  void poison() const {
    out.fill(0xFF);
    lse.fill(0xFF);
  }
  void run(void* stream = nullptr, bool reuse = false) { cuda::mla_sparse_decode(plan, p, ws.get(), stream, reuse); }
  // Synchronizes and copies the outputs back; a checked plan's record must be clean unless
  // `expect_clean` is false.
  void results(const Model1Case& c, HostTensor& o, HostTensor& l, bool expect_clean = true) const {
    take_mla_results(plan, out, lse, ws.get(), c.out.shape(), c.lse.shape(), o, l, expect_clean);
  }
};

Model1Spec spec(int heads, int q_len, int page, int extra_page) {
  Model1Spec s;
  s.num_heads = heads;
  s.q_len = q_len;
  s.page_size = page;
  s.extra_page_size = extra_page;
  // Pools a few times one row's picks, so most slots stay unselected (0xFF).
  s.pool_blocks = (4 * s.topk + page - 1) / page;
  s.extra_pool_blocks = (4 * s.extra_topk + extra_page - 1) / extra_page;
  return s;
}

// Runs the case on a fresh plan of `variant` (checked: its checked kernel, ScopedCheckedKernel)
// and compares with the reference.
void expect_model1(Model1Case& c, const std::string& variant, const std::string& what, bool checked = false) {
  ScopedMlaKernel scope(variant);
  ScopedCheckedKernel checked_scope(variant);
  Model1Device dev(c, checked);
  if (checked) expect_checked_kernel(dev.plan, variant);
  dev.run();
  HostTensor out, lse;
  dev.results(c, out, lse);
  expect_sparse_matches(what + " [" + dev.plan.kernel_name + "]", c, out, lse);
}

// No GPU needed: the cases' own float64 reference agrees with the CPU backend's on the same bytes
// (two readings of the semantics), and the poison the builder plants (the page padding, pad
// bytes, unselected slots, the poison block that entries past a length name) is never read.
// Counted ids outside a pool become -1 first: the CPU backend, which the API guards, reads them.
TEST(MlaModel1GpuCase, ReferenceAgreesWithTheCpuBackend) {
  DECA_SEED_TRACE();
  int n = 0;
  for (int heads : {8, 100}) {
    for (int q_len : {1, 3}) {
      auto rng = make_rng(3900 + ++n);
      Model1Spec s = spec(heads, q_len, n % 2 ? 2 : 64, n % 2 ? 256 : 7);
      s.topk_length = n % 2 == 0;
      s.extra_topk_length = n != 2;
      s.attn_sink = n >= 3;
      s.stride_pad = n == 4 ? 48 : 0;
      Model1Case c = build_model1_case(s, rng);
      model1_outside_to_skip(c);
      model1_reference(c);
      HostTensor out(DType::kBF16, c.out.shape()), lse(DType::kFP32, c.lse.shape());
      out.fill_bytes(0xFF);
      lse.fill_bytes(0xFF);
      cpu::mla_sparse_decode(model1_params(
          c, {c.q.raw(), c.kv.bytes.data(), c.extra.bytes.data(), c.indices.data(), c.extra_indices.data(),
              c.topk_length.data(), c.extra_topk_length.data(), c.attn_sink.data(), out.raw(), lse.data<float>()}));
      expect_sparse_matches("cpu h" + std::to_string(heads) + " q" + std::to_string(q_len), c, out, lse);
    }
  }
}

TEST(MlaModel1Gpu, HeadsQLenPagesBothCaches) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  const int pages[3] = {2, 64, 256};
  int n = 0;
  for (const std::string& variant : mla_variants()) {
    for (int heads : {1, 8, 16, 64, 100, 128}) {
      for (int q_len : {1, 2, 4}) {
        ++n;
        auto rng = make_rng(3300 + n);
        Model1Spec s = spec(heads, q_len, pages[n % 3], pages[(n + 1) % 3]);
        s.topk_length = n % 2 == 0;
        s.extra_topk_length = n % 3 != 0;
        s.attn_sink = n % 4 == 1;
        s.stride_pad = n % 5 == 0 ? 576 : (n % 5 == 2 ? 48 : 0);
        Model1Case c = build_model1_case(s, rng);
        model1_reference(c);
        expect_model1(c, variant, "h" + std::to_string(heads) + " q" + std::to_string(q_len) + " p" +
                                      std::to_string(s.page_size) + "+" + std::to_string(s.extra_page_size));
      }
    }
  }
}

// Shapes of FlashMLA's production cases and the edges: topk 128 (page 256) + extra 1024 (page 64)
// and 64 + 2; no extra cache; topk no multiple of 64 in both; every row of one request -1 in both
// caches; all lengths 0; the checked kernel on the same inputs (no false positive).
TEST(MlaModel1Gpu, ProductionShapesAndEdges) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  struct Row {
    const char* name;
    int heads, q_len, topk, page, extra_topk, extra_page;
  };
  const Row rows[] = {{"v4_256_64", 64, 2, 128, 256, 1024, 64},
                      {"v4_256_64_h16", 16, 2, 128, 256, 1024, 64},
                      {"v4_64_2", 128, 1, 128, 64, 512, 2},
                      {"no_extra", 16, 2, 200, 64, 0, 64},
                      {"odd_counts", 100, 3, 70, 7, 130, 5}};
  int salt = 0;
  for (const std::string& variant : mla_variants()) {
    for (const Row& r : rows) {
      for (int edge = 0; edge < 3; ++edge) {
        auto rng = make_rng(3400 + ++salt);
        Model1Spec s = spec(r.heads, r.q_len, r.page, r.extra_page);
        s.topk = r.topk;
        s.extra_topk = r.extra_topk;
        s.pool_blocks = (4 * s.topk + r.page - 1) / r.page;
        s.extra_pool_blocks = r.extra_topk > 0 ? (4 * r.extra_topk + r.extra_page - 1) / r.extra_page : 1;
        s.topk_length = s.extra_topk_length = edge == 2;
        s.attn_sink = edge == 1;
        Model1Case c = build_model1_case(s, rng);
        if (edge == 1) {  // request 2: every entry of every query token -1, in both caches
          for (int i = 0; i < s.q_len; ++i) {
            for (int k = 0; k < s.topk; ++k) c.index(2, i, k) = -1;
            for (int k = 0; k < s.extra_topk; ++k) c.extra_index(2, i, k) = -1;
          }
        }
        if (edge == 2) {
          for (int& v : c.topk_length) v = 0;
          c.extra_topk_length[2] = 0;
        }
        model1_reference(c);
        const std::string what = std::string(r.name) + " edge " + std::to_string(edge);
        expect_model1(c, variant, what);
        model1_outside_to_skip(c);  // the reference reads them alike; the checked kernels report them
        expect_model1(c, variant, what + " checked", /*checked=*/true);
      }
    }
  }
}

// Enough requests that a partition takes whole ones: the decode kernel writes the final outputs
// itself (the sink applied there, the combine left out when nothing is cut), which the cases
// above, whose few requests are all cut, never reach. Uniform lists (no cut, checked against the
// scheduler) and ragged ones with 0 in either cache (most whole, some cut); partial blocks in
// both caches, a padded head block and the cluster.
TEST(MlaModel1Gpu, WholeRequestsInOnePartition) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  int salt = 0;
  for (const std::string& variant : mla_variants()) {
    for (int heads : {16, 40, 100}) {
      for (bool ragged : {false, true}) {
        auto rng = make_rng(3800 + ++salt);
        Model1Spec s = spec(heads, heads > 64 ? 1 : 2, 64, 2);
        s.topk = 32;
        s.extra_topk = 40;
        s.pool_blocks = 2;
        s.extra_pool_blocks = 40;
        const int parts = mla::decode_num_parts(cuda::sm_count(0), s.q_len, heads);
        s.batch = 2 * parts;
        s.topk_length = s.extra_topk_length = ragged;
        s.attn_sink = true;
        if (!ragged) {
          const mla::TopkLists lists{nullptr, s.topk, nullptr, s.extra_topk};
          ASSERT_FALSE(mla::schedule_cuts_requests(s.batch, lists, parts)) << s.batch << " on " << parts;
        }
        Model1Case c = build_model1_case(s, rng);
        model1_reference(c);
        expect_model1(c, variant, std::string(ragged ? "ragged" : "uniform") + " h" + std::to_string(heads) +
                                      " b" + std::to_string(s.batch));
      }
    }
  }
}

// The same inputs give the same bytes (no atomics in the reduction order), split or not.
TEST(MlaModel1Gpu, BitwiseIdenticalRunToRun) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    for (int heads : {8, 16, 128}) {
      auto rng = make_rng(3500 + heads);
      Model1Spec s = spec(heads, 2, 64, 2);
      s.extra_topk = 1024;
      s.extra_pool_blocks = 2048;
      s.topk_length = s.extra_topk_length = true;
      s.attn_sink = true;
      Model1Case c = build_model1_case(s, rng);
      ScopedMlaKernel scope(variant);
      Model1Device dev(c, false);
      expect_run_to_run_identical(dev.plan.kernel_name, dev, c);
    }
  }
}

// A captured run replays with the lengths in device memory at replay time (the scheduler runs in
// the graph); a schedule reused by a second "layer" (other q and caches, same shape) gives that
// layer's results; one made for another extra list is refused (NaN, nothing attended).
TEST(MlaModel1Gpu, GraphReplayAndReusedSchedule) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    for (int heads : {16, 64}) {
      auto rng = make_rng(3600 + heads);
      Model1Spec s = spec(heads, 2, 256, 64);
      s.batch = 5;
      s.extra_topk = 512;
      s.extra_pool_blocks = 64;
      s.topk_length = s.extra_topk_length = true;
      Model1Case c = build_model1_case(s, rng);
      ScopedMlaKernel scope(variant);
      Model1Device dev(c, false);
      GraphReplay graph;
      ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t st) { dev.run(st); }));
      for (int replay = 0; replay < 2; ++replay) {
        for (int b = 0; b < s.batch; ++b) {  // new lengths, the same entries (rows past them unread)
          c.topk_length[b] = static_cast<int>(rng() % (s.topk + 1));
          c.extra_topk_length[b] = replay == 1 && b == 3 ? 0 : static_cast<int>(rng() % (s.extra_topk + 1));
        }
        model1_write_counted(c, rng);  // the now-counted entries (some of the poison block) get tokens
        cudaMemcpy(dev.kv.get(), c.kv.bytes.data(), c.kv.bytes.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(dev.extra.get(), c.extra.bytes.data(), c.extra.bytes.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(dev.topk_length.get(), c.topk_length.data(), s.batch * sizeof(int), cudaMemcpyHostToDevice);
        cudaMemcpy(dev.extra_topk_length.get(), c.extra_topk_length.data(), s.batch * sizeof(int),
                   cudaMemcpyHostToDevice);
        dev.poison();
        ASSERT_NO_FATAL_FAILURE(graph.replay(1));
        model1_reference(c);
        HostTensor out, lse;
        dev.results(c, out, lse);
        expect_sparse_matches("replay " + std::to_string(replay) + " [" + dev.plan.kernel_name + "]", c, out, lse);
      }

      // Layer 2: new q and tokens, same lengths and indices: the schedule in the workspace serves.
      Model1Case layer2 = build_model1_case(s, rng);
      layer2.indices = c.indices;
      layer2.extra_indices = c.extra_indices;
      layer2.topk_length = c.topk_length;
      layer2.extra_topk_length = c.extra_topk_length;
      layer2.written.clear();
      layer2.extra_written.clear();
      model1_write_counted(layer2, rng);
      model1_reference(layer2);
      cudaMemcpy(dev.q.get(), layer2.q.raw(), layer2.q.bytes(), cudaMemcpyHostToDevice);
      cudaMemcpy(dev.kv.get(), layer2.kv.bytes.data(), layer2.kv.bytes.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(dev.extra.get(), layer2.extra.bytes.data(), layer2.extra.bytes.size(), cudaMemcpyHostToDevice);
      dev.poison();
      dev.run(nullptr, /*reuse=*/true);
      HostTensor out, lse;
      dev.results(layer2, out, lse);
      expect_sparse_matches("reused schedule [" + dev.plan.kernel_name + "]", layer2, out, lse);

      // Another extra list (extra_topk halved, the same buffers) on the reused schedule: refused.
      dev.p.extra_topk = s.extra_topk / 2;
      cudaMemset(dev.out.get(), 0, dev.out.bytes());  // zeros, not the NaN poison: the kernels write NaN
      cudaMemset(dev.lse.get(), 0, dev.lse.bytes());
      dev.run(nullptr, /*reuse=*/true);
      dev.results(layer2, out, lse);
      long long nan = 0;
      for (std::int64_t e = 0; e < out.numel(); ++e) nan += std::isnan(out.get(e)) ? 1 : 0;
      EXPECT_EQ(nan, out.numel()) << "a schedule of another extra_topk must give NaN [" << dev.plan.kernel_name << "]";
    }
  }
}

// The sm90 kernel a head count runs: the direct kernel (ring of records, no bf16 tile) at 1..16
// heads, the wide kernel at 17, by the plan's kernel name; each against the reference over both
// caches' page sizes 2 and 256 (and 64), q_len 1, 2, 4, ragged lengths with 0 in either cache,
// the sink, and requests enough that some partitions take whole ones (the decode kernel's own
// final outputs) beside cut ones; then the same inputs through the checked build.
TEST(MlaModel1Gpu, DirectKernelUpTo16Heads) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  if (!(cuda::available() && cuda::compute_capability(0) == 90)) GTEST_SKIP() << "the sm90 kernels: Hopper only";
  const int pages[3][2] = {{2, 256}, {256, 2}, {64, 64}};
  int n = 0;
  for (int heads : {1, 8, 16, 17}) {
    for (int q_len : {1, 2, 4}) {
      ++n;
      auto rng = make_rng(3900 + n);
      Model1Spec s = spec(heads, q_len, pages[n % 3][0], pages[n % 3][1]);
      s.batch = n % 2 ? 3 : 40;
      s.topk = n % 2 ? 96 : 130;
      s.extra_topk = n % 3 ? 200 : 64;
      s.pool_blocks = (4 * s.topk + s.page_size - 1) / s.page_size;
      s.extra_pool_blocks = (4 * s.extra_topk + s.extra_page_size - 1) / s.extra_page_size;
      s.topk_length = s.extra_topk_length = true;
      s.attn_sink = n % 2 == 0;
      Model1Case c = build_model1_case(s, rng);
      c.topk_length[1] = 0;  // a request with keys in the extra cache only
      c.extra_topk_length[2] = 0;
      for (int i = 0; i < s.q_len; ++i) {  // request 0: every entry -1 in both caches
        for (int k = 0; k < s.topk; ++k) c.index(0, i, k) = -1;
        for (int k = 0; k < s.extra_topk; ++k) c.extra_index(0, i, k) = -1;
      }
      model1_reference(c);
      const std::string what = "h" + std::to_string(heads) + " q" + std::to_string(q_len) + " p" +
                               std::to_string(s.page_size) + "+" + std::to_string(s.extra_page_size);
      {
        ScopedMlaKernel scope("sm90");
        Model1Device dev(c, false);
        EXPECT_EQ(dev.plan.kernel_name.find("_direct") != std::string::npos, heads <= 16) << dev.plan.kernel_name;
      }
      expect_model1(c, "sm90", what);
      model1_outside_to_skip(c);
      expect_model1(c, "sm90", what + " checked", /*checked=*/true);
    }
  }
}

// Checked mode: an index outside its pool in either cache, and an extra_topk_length past
// extra_topk, are skipped (clamped) as the reference reads them and reported by name, with the
// same record by the portable checked kernel and on Hopper the sm90 ones (the default there:
// the direct kernel at 16 heads, the wide kernel's cluster of 2 at 128).
void expect_model1_offender(const std::string& variant, int heads, const std::string& which) {
  ScopedCheckedKernel scoped(variant);
  auto rng = make_rng(3700);
  Model1Spec s = spec(heads, 2, 64, 2);
  s.topk_length = s.extra_topk_length = true;
  Model1Case c = build_model1_case(s, rng);
  model1_outside_to_skip(c);  // the planted offender is the only one
  // Request 2 counts every entry of both lists: those past its drawn lengths become -1.
  for (int i = 0; i < s.q_len; ++i) {
    for (int k = c.len(2); k < s.topk; ++k) c.index(2, i, k) = -1;
    for (int k = c.extra_len(2); k < s.extra_topk; ++k) c.extra_index(2, i, k) = -1;
  }
  c.topk_length[2] = s.topk;
  c.extra_topk_length[2] = s.extra_topk;
  std::string expected;
  if (which == "extra_topk_length") {
    model1_reference(c);  // the kernel reads it clamped to extra_topk
    c.extra_topk_length[2] = s.extra_topk + 5;
    expected = ": extra_topk_length[2]";
  } else {
    const bool first = which == "indices";
    const int k = first ? s.topk - 1 : s.extra_topk - 1;
    int& entry = first ? c.index(2, 1, k) : c.extra_index(2, 1, k);
    entry = -1;
    model1_reference(c);
    entry = static_cast<int>(first ? c.kv.pool() : c.extra.pool());
    expected = ": " + which + "[2][1][" + std::to_string(k) + "]";
  }
  Model1Device dev(c, /*checked=*/true);
  expect_checked_kernel(dev.plan, variant);
  EXPECT_NE(dev.plan.kernel_name.find("_model1_chk"), std::string::npos) << dev.plan.kernel_name;
  dev.run();
  HostTensor out, lse;
  dev.results(c, out, lse, /*expect_clean=*/false);
  const std::string at = variant + " h" + std::to_string(heads) + " " + which;
  expect_sparse_matches(at + " offender", c, out, lse);
  std::string error;
  try {
    check_mla_run(dev.plan, dev.ws.get(), nullptr);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find(expected), std::string::npos) << at << ": " << error;
}

TEST(MlaModel1Gpu, CheckedOffendersInEitherCache) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  for (const std::string& variant : mla_variants()) {
    for (int heads : {16, 128}) {
      for (const char* which : {"indices", "extra_indices", "extra_topk_length"}) {
        expect_model1_offender(variant, heads, which);
      }
    }
  }
}

}  // namespace
}  // namespace deca::test
