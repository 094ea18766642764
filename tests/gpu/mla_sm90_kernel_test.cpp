// The sm90a MLA sparse FP8 decode kernels alone (the direct kernel at <= 16 heads, the wide one
// without and with a cluster above: the kernel a plan of each head count runs), launched through
// the JIT with DecodeKernelParams built here by hand (partitions cut by a tiny test scheduler),
// against the CPU reference. Split
// pieces are merged here by LSE (and the sink) before the comparison, so the partial_o /
// partial_lse contract is checked too; every case also runs twice and must match bit for bit.
// Skips without an sm_90 GPU.
//
// Every case prints max abs / relative L2 error of the output and the LSE error: all heads wrong
// points at a descriptor or layout, some heads at masking or padding, split cases only at the
// partial write-back.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/mla_case.hpp"
#include "common/test_seed.hpp"
#include "cpu/reference.hpp"
#include "gpu/device_buffer.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::test {
namespace {

bool have_sm90() {
  if (!cuda::available()) return false;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  return prop.major == 9 && prop.minor == 0;
}

#define REQUIRE_SM90()                                                                  \
  do {                                                                                  \
    DECA_REQUIRE_GPU();                                                                 \
    if (!have_sm90()) GTEST_SKIP() << "the sm90a kernel needs a compute capability 9.0 GPU"; \
  } while (0)

// Partitions of at most `cap` blocks over the requests in order, cutting a request where a
// partition fills; `one_request` closes a partition at every request end. An empty request gets
// a partition of its own. Fills parts and split_offsets as the scheduler contract says.
struct Layout {
  std::vector<mla::SparsePart> parts;
  std::vector<int> split_offsets;
  std::vector<int> pieces;  // per request
  int slots = 0;
};

Layout make_layout(const std::vector<int>& blocks, int cap, bool one_request) {
  Layout l;
  const int batch = static_cast<int>(blocks.size());
  struct Raw { int br, bb, er, eb; };
  std::vector<Raw> raw;
  int r = 0, b = 0;
  while (r < batch) {
    Raw p{r, b, r, b};
    if (blocks[r] == 0) {
      raw.push_back(p);
      ++r;
      continue;
    }
    int room = cap;
    while (r < batch && blocks[r] > 0 && room > 0) {
      const int take = std::min(room, blocks[r] - b);
      room -= take;
      b += take;
      p.er = r;
      p.eb = b;
      if (b < blocks[r]) break;
      ++r;
      b = 0;
      if (one_request) break;
    }
    raw.push_back(p);
  }
  l.pieces.assign(batch, 0);
  for (const Raw& p : raw) {
    for (int q = p.br; q <= p.er; ++q) ++l.pieces[q];
  }
  l.split_offsets.assign(batch + 1, 0);
  for (int q = 0; q < batch; ++q) l.split_offsets[q + 1] = l.split_offsets[q] + l.pieces[q];
  l.slots = l.split_offsets[batch];
  std::vector<int> seen(batch, 0);
  for (const Raw& p : raw) {
    mla::SparsePart s{};
    s.begin_req = p.br;
    s.begin_block = p.bb;
    s.end_req = p.er;
    s.end_block = p.eb;
    s.begin_split = l.split_offsets[p.br] + seen[p.br];
    s.begin_split_count = l.pieces[p.br];
    s.end_split_count = l.pieces[p.er];
    for (int q = p.br; q <= p.er; ++q) ++seen[q];
    l.parts.push_back(s);
  }
  return l;
}

struct Sm90Case {
  MlaCaseSpec spec;
  int cap = 1 << 20;
  bool one_request = true;
  bool empty_row = false;  // one (request, token) row of all -1
  std::string name;
};

struct Errors {
  double max_abs = 0, rel_l2 = 0, lse_max_abs = 0;
  int nan = 0, inf_mismatch = 0;
};

void run_case(const Sm90Case& tc) {
  SCOPED_TRACE(tc.name);
  DECA_SEED_TRACE();
  std::mt19937_64 rng = make_rng(std::hash<std::string>{}(tc.name));
  MlaSparseCase c = build_mla_sparse_case(tc.spec, rng);
  const MlaCaseSpec& s = c.spec;
  if (tc.empty_row) std::fill_n(c.indices.data<int>(), s.topk, -1);  // request 0, token 0

  // Reference first (it writes c.out / c.lse), kept aside.
  cpu::mla_sparse_decode(c.params);
  HostTensor ref_out(DType::kBF16, c.out.shape()), ref_lse(DType::kFP32, c.lse.shape());
  std::copy_n(static_cast<const char*>(c.out.raw()), c.out.bytes(), static_cast<char*>(ref_out.raw()));
  std::copy_n(static_cast<const char*>(c.lse.raw()), c.lse.bytes(), static_cast<char*>(ref_lse.raw()));

  std::vector<int> blocks(s.batch);
  for (int b = 0; b < s.batch; ++b) {
    const int len = s.topk_length ? c.topk_length.data<int>()[b] : s.topk;
    blocks[b] = (len + mla::kTopkBlock - 1) / mla::kTopkBlock;
  }
  const Layout lay = make_layout(blocks, tc.cap, tc.one_request);

  DeviceBuffer q(c.q), kv(c.kv), idx(c.indices), tl(c.topk_length), sink(c.attn_sink);
  DeviceBuffer out(c.out.bytes()), lse(c.lse.bytes());
  out.fill(0xFF);
  lse.fill(0xFF);
  const long long per_slot = static_cast<long long>(s.q_len) * s.num_heads;
  DeviceBuffer po(std::max<long long>(1, lay.slots * per_slot * 512) * 4);
  DeviceBuffer pl(std::max<long long>(1, lay.slots * per_slot) * 4);
  po.fill(0xFF);
  pl.fill(0xFF);
  DeviceBuffer parts(lay.parts.size() * sizeof(mla::SparsePart));
  DeviceBuffer offs(lay.split_offsets.size() * sizeof(int));
  cudaMemcpy(parts.get(), lay.parts.data(), parts.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(offs.get(), lay.split_offsets.data(), offs.bytes(), cudaMemcpyHostToDevice);

  mla::DecodeKernelParams kp{};
  kp.p = c.params;
  kp.p.q = q.get();
  kp.p.kv = kv.as<unsigned char>();
  kp.p.indices = idx.as<int>();
  kp.p.topk_length = s.topk_length ? tl.as<int>() : nullptr;
  kp.p.attn_sink = s.attn_sink ? sink.as<float>() : nullptr;
  kp.p.out = out.get();
  kp.p.lse = lse.as<float>();
  kp.run.parts = parts.as<mla::SparsePart>();
  kp.run.split_offsets = offs.as<int>();
  kp.run.partial_o = po.as<float>();
  kp.run.partial_lse = pl.as<float>();
  kp.run.num_parts = static_cast<int>(lay.parts.size());
  kp.run.max_slots = lay.slots;
  // The stamp the scheduler would have written for this call (the layout is the host's).
  const mla::ScheduleStamp st = mla::schedule_stamp(kp.p, kp.run.num_parts);
  DeviceBuffer stamp(sizeof(st));
  cudaMemcpy(stamp.get(), &st, sizeof(st), cudaMemcpyHostToDevice);
  kp.run.stamp = stamp.as<mla::ScheduleStamp>();

  // The kernel a plan of this head count runs (kernel_class), as the backend launches it.
  const mla::sm90::KernelClass kc = mla::sm90::kernel_class(s.num_heads);
  const jit::LoadedKernel& k = jit::get_kernel(mla_sm90_spec(s.page_size, s.num_heads), 0);
  const unsigned threads = static_cast<unsigned>(mla::sm90::threads_of(kc.direct));
  void* args[] = {&kp};
  jit::LaunchOptions opts;
  if (kc.cluster == 2) opts.cluster = {2, 1, 1};
  jit::launch(k, {static_cast<unsigned>(mla::sm90::head_blocks(s.num_heads)),
                  static_cast<unsigned>(s.q_len), static_cast<unsigned>(lay.parts.size())},
              {threads, 1, 1}, mla::sm90::kSmemBytes, nullptr, args, opts);
  cuda_ok(cudaDeviceSynchronize(), "mla sm90 kernel");

  HostTensor gout(DType::kBF16, c.out.shape()), glse(DType::kFP32, c.lse.shape());
  out.to_host(gout);
  lse.to_host(glse);
  std::vector<float> hpo(lay.slots * per_slot * 512), hpl(lay.slots * per_slot);
  cudaMemcpy(hpo.data(), po.get(), hpo.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hpl.data(), pl.get(), hpl.size() * 4, cudaMemcpyDeviceToHost);

  // Run to run, bit for bit: a second launch into re-poisoned outputs writes the same bytes.
  out.fill(0xFF);
  lse.fill(0xFF);
  po.fill(0xFF);
  pl.fill(0xFF);
  jit::launch(k, {static_cast<unsigned>(mla::sm90::head_blocks(s.num_heads)),
                  static_cast<unsigned>(s.q_len), static_cast<unsigned>(lay.parts.size())},
              {threads, 1, 1}, mla::sm90::kSmemBytes, nullptr, args, opts);
  cuda_ok(cudaDeviceSynchronize(), "mla sm90 kernel, second launch");
  {
    HostTensor again(DType::kBF16, c.out.shape()), again_lse(DType::kFP32, c.lse.shape());
    out.to_host(again);
    lse.to_host(again_lse);
    std::vector<float> again_po(hpo.size()), again_pl(hpl.size());
    cudaMemcpy(again_po.data(), po.get(), again_po.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(again_pl.data(), pl.get(), again_pl.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(std::memcmp(again.raw(), gout.raw(), gout.bytes()), 0) << "output differs between runs";
    EXPECT_EQ(std::memcmp(again_lse.raw(), glse.raw(), glse.bytes()), 0) << "LSE differs between runs";
    EXPECT_EQ(std::memcmp(again_po.data(), hpo.data(), hpo.size() * 4), 0) << "partial_o differs";
    EXPECT_EQ(std::memcmp(again_pl.data(), hpl.data(), hpl.size() * 4), 0) << "partial_lse differs";
  }
  // Split requests: merge their pieces by LSE here (what the combine kernel will do).
  for (int b = 0; b < s.batch; ++b) {
    if (lay.pieces[b] < 2) continue;
    for (int t = 0; t < s.q_len; ++t) {
      for (int h = 0; h < s.num_heads; ++h) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < lay.pieces[b]; ++j) {
          mx = std::max(mx, static_cast<double>(hpl[(lay.split_offsets[b] + j) * per_slot + t * s.num_heads + h]));
        }
        std::vector<double> acc(512, 0.0);
        double sum = 0;
        if (mx > -std::numeric_limits<double>::infinity()) {
          for (int j = 0; j < lay.pieces[b]; ++j) {
            const long long row = (lay.split_offsets[b] + j) * per_slot + t * s.num_heads + h;
            const double w = std::exp(hpl[row] - mx);
            sum += w;
            for (int d = 0; d < 512; ++d) acc[d] += w * hpo[row * 512 + d];
          }
        }
        const double lse_total = sum > 0 ? mx + std::log(sum) : -std::numeric_limits<double>::infinity();
        double f = sum > 0 ? 1.0 / sum : 0.0;
        if (sum > 0 && s.attn_sink) f /= 1.0 + std::exp(c.attn_sink.data<float>()[h] - lse_total);
        const long long o = ((static_cast<long long>(b) * s.q_len + t) * s.num_heads + h);
        for (int d = 0; d < 512; ++d) gout.set(o * 512 + d, static_cast<float>(acc[d] * f));
        glse.data<float>()[o] = static_cast<float>(lse_total);
      }
    }
  }

  Errors e;
  double num = 0, den = 0;
  for (long long i = 0; i < ref_out.numel(); ++i) {
    const double a = gout.get(i), r = ref_out.get(i);
    if (std::isnan(a) || std::isnan(r)) {
      ++e.nan;
      continue;
    }
    num += (a - r) * (a - r);
    den += r * r;
    e.max_abs = std::max(e.max_abs, std::fabs(a - r));
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  int worst_head = -1;
  for (long long i = 0; i < ref_lse.numel(); ++i) {
    const float a = glse.data<float>()[i], r = ref_lse.data<float>()[i];
    if (std::isnan(a) || std::isnan(r)) {
      ++e.nan;
    } else if (std::isinf(a) || std::isinf(r)) {
      if (a != r) ++e.inf_mismatch;
    } else if (std::fabs(a - r) > e.lse_max_abs) {
      e.lse_max_abs = std::fabs(a - r);
      worst_head = static_cast<int>(i % s.num_heads);
    }
  }
  std::printf("[mla_sm90] %-40s parts=%zu slots=%d max_abs=%.3g rel_l2=%.3g lse_max_abs=%.3g "
              "(head %d) nan=%d inf_mismatch=%d\n",
              tc.name.c_str(), lay.parts.size(), lay.slots, e.max_abs, e.rel_l2, e.lse_max_abs,
              worst_head, e.nan, e.inf_mismatch);
  EXPECT_EQ(e.nan, 0);
  EXPECT_EQ(e.inf_mismatch, 0);
  // bf16 output on both sides plus P rounded (bf16, or two e4m3 terms) before P V: a few bf16 ulps.
  EXPECT_LT(e.rel_l2, 1e-2);
  EXPECT_LT(e.lse_max_abs, 2e-3);
}

Sm90Case make(const std::string& name, int batch, int q_len, int heads, int page, int topk) {
  Sm90Case tc;
  tc.name = name;
  tc.spec.batch = batch;
  tc.spec.q_len = q_len;
  tc.spec.num_heads = heads;
  tc.spec.page_size = page;
  tc.spec.topk = topk;
  tc.spec.pool_blocks = std::max(4, 4096 / page);
  tc.spec.skip_fraction = 0.1f;
  tc.spec.duplicates = 3;
  return tc;
}

TEST(MlaSm90Kernel, Heads64OneRequestPerPartition) {
  REQUIRE_SM90();
  run_case(make("h64_q1_p64_topk64", 2, 1, 64, 64, 64));
  run_case(make("h64_q1_p64_topk2048", 2, 1, 64, 64, 2048));
  run_case(make("h64_q2_p1_topk256", 2, 2, 64, 1, 256));
}

TEST(MlaSm90Kernel, Heads128TwoHeadBlocks) {
  REQUIRE_SM90();
  run_case(make("h128_q1_p64_topk2048", 2, 1, 128, 64, 2048));
  run_case(make("h128_q2_p64_topk128", 3, 2, 128, 64, 128));
}

TEST(MlaSm90Kernel, PaddedHeadCounts) {
  REQUIRE_SM90();
  run_case(make("h16_q1_p64_topk256", 2, 1, 16, 64, 256));
  run_case(make("h100_q2_p1_topk192", 2, 2, 100, 1, 192));
  run_case(make("h8_q1_p64_topk64", 1, 1, 8, 64, 64));
}

TEST(MlaSm90Kernel, SinkTopkLengthAndEmptyRows) {
  REQUIRE_SM90();
  Sm90Case a = make("h64_sink_topklen", 4, 2, 64, 64, 512);
  a.spec.attn_sink = true;
  a.spec.topk_length = true;
  run_case(a);
  Sm90Case b = make("h128_empty_row_sink", 2, 2, 128, 64, 128);
  b.spec.attn_sink = true;
  b.empty_row = true;
  run_case(b);
  Sm90Case d = make("h64_heavy_skips", 2, 1, 64, 1, 256);
  d.spec.skip_fraction = 0.9f;
  d.spec.duplicates = 20;
  run_case(d);
}

TEST(MlaSm90Kernel, SplitPiecesWritePartials) {
  REQUIRE_SM90();
  // Two pieces per request of 4 blocks.
  Sm90Case a = make("h64_split_2x2", 2, 1, 64, 64, 256);
  a.cap = 2;
  run_case(a);
  // Partitions that start mid-request and end mid-next, sink and ragged lengths.
  Sm90Case b = make("h128_split_cap3_sink", 5, 2, 128, 64, 448);
  b.cap = 3;
  b.one_request = false;
  b.spec.attn_sink = true;
  b.spec.topk_length = true;
  run_case(b);
}

TEST(MlaSm90Kernel, ManyRequestsPerPartition) {
  REQUIRE_SM90();
  // Q reloaded per request, softmax state reset, the epilogue hand-over alternating buffers.
  Sm90Case a = make("h64_all_in_one_part", 6, 1, 64, 64, 128);
  a.one_request = false;
  a.spec.topk_length = true;  // some requests empty inside a partition
  run_case(a);
  Sm90Case b = make("h128_all_in_one_part_sink", 4, 2, 128, 16, 192);
  b.one_request = false;
  b.spec.attn_sink = true;
  run_case(b);
}

// 65..128 heads run in a cluster of 2: each CTA dequantizes 32 of a block's tokens into both
// tiles.
TEST(MlaSm90Kernel, ClusterOfTwoSharesTokens) {
  REQUIRE_SM90();
  run_case(make("c2_h128_q1_p64_topk2048", 2, 1, 128, 64, 2048));
  run_case(make("c2_h100_q2_p1_topk192", 2, 2, 100, 1, 192));
  run_case(make("c2_h65_q2_p64_topk64", 3, 2, 65, 64, 64));
  Sm90Case split = make("c2_h128_split_cap3_sink_topklen", 5, 2, 128, 64, 448);
  split.cap = 3;
  split.one_request = false;
  split.spec.attn_sink = true;
  split.spec.topk_length = true;
  run_case(split);
  Sm90Case empty = make("c2_h128_empty_row_skips", 2, 1, 128, 16, 256);
  empty.empty_row = true;
  empty.spec.skip_fraction = 0.6f;
  run_case(empty);
  Sm90Case c2many = make("c2_h100_all_in_one_part_sink", 4, 2, 100, 16, 192);
  c2many.one_request = false;
  c2many.spec.attn_sink = true;
  run_case(c2many);
  Sm90Case odd = make("c2_h128_many_odd_blocks_q4", 7, 4, 128, 64, 192);
  odd.one_request = false;
  odd.cap = 5;
  run_case(odd);
  Sm90Case ones = make("c2_h72_one_block_requests_topklen", 9, 1, 72, 16, 64);
  ones.one_request = false;
  ones.spec.topk_length = true;
  run_case(ones);
}

// The wide kernel without a cluster (17..64 heads) over the variety the producers' own cursors
// must agree with the consumers' on: long rows, padded heads, page 1, heavy skips and a row of
// -1, split pieces with ragged lengths and the sink, many (and empty) requests per partition.
TEST(MlaSm90Kernel, WideWithoutClusterVariety) {
  REQUIRE_SM90();
  run_case(make("h64_q1_p64_topk2048", 2, 1, 64, 64, 2048));
  run_case(make("h17_q2_p1_topk448", 2, 2, 17, 1, 448));
  run_case(make("h24_q4_p16_topk192", 3, 4, 24, 16, 192));
  Sm90Case skips = make("h64_heavy_skips_empty_row", 2, 1, 64, 1, 256);
  skips.spec.skip_fraction = 0.9f;
  skips.empty_row = true;
  run_case(skips);
  Sm90Case split = make("h33_split_cap3_sink_topklen", 5, 2, 33, 64, 448);
  split.cap = 3;
  split.one_request = false;
  split.spec.attn_sink = true;
  split.spec.topk_length = true;
  run_case(split);
  Sm90Case many = make("h64_all_in_one_part_topklen", 6, 1, 64, 64, 128);
  many.one_request = false;
  many.spec.topk_length = true;
  run_case(many);
}

// The direct kernel (at most 16 heads, no bf16 tile: the records multiplied from the ring's
// slots as they are, the consumers taking alternate blocks): odd and padded head counts, page 1,
// q_len 4, heavy skips with a row of -1, splits with the sink and ragged lengths, every request in
// one partition (the states merged per request), a long request (many passes of the four-slot
// ring, the groups' scale exponents growing along it); each compared with the CPU reference and
// run to run bit for bit in run_case.
TEST(MlaSm90Kernel, DirectRecords) {
  REQUIRE_SM90();
  std::vector<Sm90Case> cases = {make("direct_h16_q1_p64_topk2048", 2, 1, 16, 64, 2048),
                                 make("direct_h8_q2_p1_topk448", 2, 2, 8, 1, 448),
                                 make("direct_h5_q4_p16_topk192", 3, 4, 5, 16, 192)};
  Sm90Case skips = make("direct_h16_heavy_skips_empty_row", 2, 1, 16, 1, 256);
  skips.spec.skip_fraction = 0.9f;
  skips.empty_row = true;
  cases.push_back(skips);
  Sm90Case split = make("direct_h13_split_cap3_sink_topklen", 5, 2, 13, 64, 448);
  split.cap = 3;
  split.one_request = false;
  split.spec.attn_sink = true;
  split.spec.topk_length = true;
  cases.push_back(split);
  Sm90Case many = make("direct_h1_all_in_one_part_topklen", 6, 1, 1, 64, 128);
  many.one_request = false;
  many.spec.topk_length = true;
  cases.push_back(many);
  cases.push_back(make("direct_h16_q1_p64_topk4096", 2, 1, 16, 64, 4096));
  Sm90Case split2 = make("direct_h16_q2_p16_split_cap5_sink", 3, 2, 16, 16, 2048);
  split2.cap = 5;
  split2.one_request = false;
  split2.spec.attn_sink = true;
  cases.push_back(split2);
  for (const Sm90Case& c : cases) run_case(c);
}

}  // namespace
}  // namespace deca::test
