// The sm90a MLA sparse FP8 decode kernel alone, launched through the JIT with DecodeKernelParams
// built here by hand (partitions cut by a tiny test scheduler), against the CPU reference. Split
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
  int cluster = 1;         // 2: the two head blocks share dequantized tokens (65..128 heads)
  int pipe = 0;            // Cfg::kPipe: the producer pipeline variant (sm90/traits.cuh)
  int dequant = 0;         // Cfg::kDequant: 1 the integer e4m3 placement (exact: same bytes as 0)
  int sync = 0;            // Cfg::kSync: 1 the light cluster hand-overs
  int prefetch = 0;        // Cfg::kPrefetch: 1 bulk record prefetch, 2 none, 3 sectors
  int ahead = 2;           // Cfg::kAhead: prefetch distance in blocks
  int map = 0;             // Cfg::kMap: 1 the producer's token split, 2 the unit split's pairs, 3 rows
  int l1 = 0;              // Cfg::kL1: 1 the gather's L1 evict-last policy
  int rescale = 0;         // Cfg::kRescale: 1 skip factors of 1 (same bytes as 0), 2 lazy maxima
  int phand = 0;           // Cfg::kPHand: 1 consumer 1 takes P into registers (same bytes as 0)
  int producers = 1;       // Cfg::kProducers: 2 producer warpgroups (512 threads; same bytes as 1)
  int peer_copy = 0;       // Cfg::kPeerCopy: 1 the peer's rows by bulk copies (same bytes as 0)
  int seesaw = 0;          // Cfg::kSeesaw: 1 the consumers take alternate blocks
  int stage = 0;           // Cfg::kStage: 1 the records staged in the Q tile (<= 16 heads; same bytes as 0)
  int narrow = 0;          // Cfg::kNarrow: 1 S^T = K Q^T with the heads on N (<= 16 heads)
  int direct = 0;          // Cfg::kDirect: 1 no bf16 tile, the records on the e4m3 tensor cores (<= 16 heads)
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

  const jit::LoadedKernel& k = jit::get_kernel(mla_sm90_spec(s.page_size, tc.cluster, 0, tc.pipe, tc.dequant, tc.sync, tc.prefetch, tc.ahead, tc.map, tc.l1,
                                                             tc.rescale, tc.phand, tc.producers, tc.peer_copy, 0,
                                                             tc.seesaw, tc.stage, tc.narrow, tc.direct), 0);
  const unsigned threads = static_cast<unsigned>(mla::sm90::threads_of(tc.producers));
  void* args[] = {&kp};
  jit::LaunchOptions opts;
  if (tc.cluster == 2) opts.cluster = {2, 1, 1};
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
  // The integer and the mma dequantization claim the reference's rounding exactly (subnormal e4m3
  // included), the producer's token split fills the same tiles, skipping factors of 1 multiplies
  // by 1 less often and P V from registers reads the same P: the variant with the hardware
  // conversions, the unit split, every rescale and P from shared memory must write the same bytes;
  // so must two producer warpgroups (the same tiles; P V as two N = 128 halves per k step, each
  // element's sum the same) and the peer's rows by bulk copies (the same bytes, another route).
  // and the records staged in the Q tile (the same tiles from shared rather than global loads).
  // (Not the seesaw consumers nor the heads on N: their row sums add in another order.)
  if (tc.seesaw == 0 && tc.narrow == 0 && tc.direct == 0 && (tc.dequant != 0 || tc.map != 0 || tc.rescale == 1 || tc.phand != 0 ||
                         tc.producers != 1 || tc.peer_copy != 0 || tc.stage != 0)) {
    const jit::LoadedKernel& k0 = jit::get_kernel(
        mla_sm90_spec(s.page_size, tc.cluster, 0, tc.pipe, 0, tc.sync, tc.prefetch, tc.ahead, 0, tc.l1,
                      tc.rescale == 2 ? 2 : 0, 0), 0);
    out.fill(0xFF);
    lse.fill(0xFF);
    po.fill(0xFF);
    pl.fill(0xFF);
    jit::launch(k0, {static_cast<unsigned>(mla::sm90::head_blocks(s.num_heads)),
                     static_cast<unsigned>(s.q_len), static_cast<unsigned>(lay.parts.size())},
                {mla::sm90::kThreads, 1, 1}, mla::sm90::kSmemBytes, nullptr, args, opts);
    cuda_ok(cudaDeviceSynchronize(), "mla sm90 kernel, hardware conversions");
    HostTensor hw(DType::kBF16, c.out.shape()), hw_lse(DType::kFP32, c.lse.shape());
    out.to_host(hw);
    lse.to_host(hw_lse);
    std::vector<float> hw_po(hpo.size()), hw_pl(hpl.size());
    cudaMemcpy(hw_po.data(), po.get(), hw_po.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hw_pl.data(), pl.get(), hw_pl.size() * 4, cudaMemcpyDeviceToHost);
    EXPECT_EQ(std::memcmp(hw.raw(), gout.raw(), gout.bytes()), 0) << "output differs from kDequant 0, kMap 0";
    EXPECT_EQ(std::memcmp(hw_lse.raw(), glse.raw(), glse.bytes()), 0) << "LSE differs from kDequant 0, kMap 0";
    EXPECT_EQ(std::memcmp(hw_po.data(), hpo.data(), hpo.size() * 4), 0) << "partial_o differs from kDequant 0, kMap 0";
    EXPECT_EQ(std::memcmp(hw_pl.data(), hpl.data(), hpl.size() * 4), 0) << "partial_lse differs from kDequant 0, kMap 0";
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
  // bf16 output on both sides plus P rounded to bf16 before P V: a few bf16 ulps.
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

// The 2-CTA cluster variant: each CTA dequantizes 32 of a block's tokens into both tiles.
TEST(MlaSm90Kernel, ClusterOfTwoSharesTokens) {
  REQUIRE_SM90();
  for (Sm90Case c : {make("c2_h128_q1_p64_topk2048", 2, 1, 128, 64, 2048),
                     make("c2_h100_q2_p1_topk192", 2, 2, 100, 1, 192),
                     make("c2_h128_q2_p64_topk64", 3, 2, 128, 64, 64)}) {
    c.cluster = 2;
    run_case(c);
  }
  Sm90Case split = make("c2_h128_split_cap3_sink_topklen", 5, 2, 128, 64, 448);
  split.cluster = 2;
  split.cap = 3;
  split.one_request = false;
  split.spec.attn_sink = true;
  split.spec.topk_length = true;
  run_case(split);
  Sm90Case empty = make("c2_h128_empty_row_skips", 2, 1, 128, 16, 256);
  empty.cluster = 2;
  empty.empty_row = true;
  empty.spec.skip_fraction = 0.6f;
  run_case(empty);
}

// The producer pipeline variants (Cfg::kPipe 1..4: ids a block ahead, one gather round, loads
// before the tile is free, the round stream), over the same variety as the default: long rows, padded heads, page
// 1, heavy skips and a row of -1, split pieces with ragged lengths and the sink, many (and empty)
// requests per partition, both cluster sizes. The producer walks the partition's blocks with its
// own cursors, so a walk that disagrees with the consumers' must fail here.
std::vector<Sm90Case> pipe_cases(const std::string& k) {
  std::vector<Sm90Case> cases = {make(k + "h64_q1_p64_topk2048", 2, 1, 64, 64, 2048),
                                 make(k + "h16_q2_p1_topk448", 2, 2, 16, 1, 448)};
  Sm90Case skips = make(k + "h64_heavy_skips_empty_row", 2, 1, 64, 1, 256);
  skips.spec.skip_fraction = 0.9f;
  skips.empty_row = true;
  cases.push_back(skips);
  Sm90Case split = make(k + "h128_split_cap3_sink_topklen", 5, 2, 128, 64, 448);
  split.cap = 3;
  split.one_request = false;
  split.spec.attn_sink = true;
  split.spec.topk_length = true;
  cases.push_back(split);
  Sm90Case many = make(k + "h64_all_in_one_part_topklen", 6, 1, 64, 64, 128);
  many.one_request = false;
  many.spec.topk_length = true;
  cases.push_back(many);
  Sm90Case c2 = make(k + "c2_h128_q1_p64_topk2048", 2, 1, 128, 64, 2048);
  c2.cluster = 2;
  cases.push_back(c2);
  Sm90Case c2split = split;
  c2split.name = k + "c2_h128_split_cap3_sink_topklen";
  c2split.cluster = 2;
  cases.push_back(c2split);
  Sm90Case c2many = make(k + "c2_h100_all_in_one_part_sink", 4, 2, 100, 16, 192);
  c2many.one_request = false;
  c2many.spec.attn_sink = true;
  c2many.cluster = 2;
  cases.push_back(c2many);
  return cases;
}

// Every pipe variant over pipe_cases with the producer's split `map`: {pipe, dequant}, the last
// pipe 3 with the integer e4m3 placement (Cfg::kDequant = 1), checked bit for bit against the
// hardware conversions (and map 1 against map 0) in run_case.
void run_pipe_variants(int map) {
  struct V {
    int pipe, dequant, sync;
  };
  std::vector<V> vs = {{1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {3, 1, 0}};
  // The round stream and the mma dequantization (unit split only), both cluster hand-overs; the
  // dequantization checked bit for bit against kDequant 0 in run_case.
  if (map == 0) vs.insert(vs.end(), {V{4, 0, 0}, V{4, 0, 1}, V{2, 2, 1}, V{3, 2, 0}, V{4, 2, 1}});
  for (const V v : vs) {
    const std::string k = (map != 0 ? "m1_k" : "k") + std::to_string(v.pipe) +
                          (v.dequant != 0 ? "_d" + std::to_string(v.dequant) + "_" : "_") +
                          (v.sync != 0 ? "s1_" : "");
    for (Sm90Case& c : pipe_cases(k)) {
      if (v.dequant == 2 && c.cluster != 2) continue;  // built in a cluster only
      c.pipe = v.pipe;
      c.dequant = v.dequant;
      c.map = map;
      c.sync = c.cluster == 2 ? (map != 0 ? 1 : v.sync) : 0;
      run_case(c);
    }
  }
}

TEST(MlaSm90Kernel, ProducerPipeVariants) {
  REQUIRE_SM90();
  run_pipe_variants(0);
}

// The producer's token split (Cfg::kMap = 1) over the same cases, every pipe that offers it and
// the integer dequantization, each checked bit for bit against the unit split as well.
TEST(MlaSm90Kernel, TokenMapVariants) {
  REQUIRE_SM90();
  run_pipe_variants(1);
}

// Two producer warpgroups (Cfg::kProducers = 2, 512 threads): pipes 1 and 4 (the stream of small
// rounds) over pipe_cases (both cluster sizes; the walk, id staging and prefetch shares are per
// warpgroup), pipes 2 and 3 in a cluster (without one they spill), with the consumers' defaults
// (lazy rescale; the hand-over after P V without a cluster, the light hand-overs in one); each
// checked bit for bit against one producer in run_case.
TEST(MlaSm90Kernel, TwoProducerWarpgroups) {
  REQUIRE_SM90();
  for (int pipe : {1, 2, 3, 4}) {
    const std::string k = "w2_k" + std::to_string(pipe) + "_";
    std::vector<Sm90Case> cases = pipe_cases(k);
    for (Sm90Case& c : cases) {
      if ((pipe == 2 || pipe == 3) && c.cluster != 2) continue;
      c.pipe = pipe;
      c.producers = 2;
      c.rescale = 2;
      c.phand = c.cluster == 2 ? 0 : 2;
      c.sync = c.cluster == 2 ? 1 : 0;
      c.ahead = pipe == 4 && c.cluster == 1 ? 2 : 1;  // both distances without a cluster
      run_case(c);
    }
  }
}

// The pair exchange (Cfg::kMap = 2: lane pairs swap raw halves so that each store completes a
// 32-byte sector) and the whole-row pieces (3: each store an eighth of a 128-byte row) over
// pipe_cases' cluster cases (one and many requests per partition, splits with the sink and
// topk_length, 100 heads), pipes 1-3 with one producer and pipe 2 with two, the light
// hand-overs; and the rows without a cluster over pipe_cases' other cases (page 1, heavy skips
// with an empty row, splits, many requests per partition) with two producers (pipe 1, P after
// P V: the plan's producers there) and one (pipe 1); each checked bit for bit against the unit
// split in run_case.
TEST(MlaSm90Kernel, PairAndRowMaps) {
  REQUIRE_SM90();
  // Without a cluster: one producer's pipe 1, two producers' pipes 1 and 2 (the whole share in
  // one round, the plan's default since 2026-12-02).
  for (int variant = 0; variant < 3; ++variant) {
    const int producers = variant < 2 ? 2 : 1;
    const int pipe = variant == 1 ? 2 : 1;
    const std::string k = "m3_c1_k" + std::to_string(pipe) + (producers == 2 ? "_w2_" : "_");
    for (Sm90Case& c : pipe_cases(k)) {
      if (c.cluster != 1) continue;
      c.pipe = pipe;
      c.producers = producers;
      c.map = 3;
      c.ahead = 1;
      c.rescale = 2;
      c.phand = producers == 2 ? 2 : 0;
      run_case(c);
    }
  }
  for (int variant = 0; variant < 8; ++variant) {
    const int map = variant < 4 ? 2 : 3;
    const int pipe = variant % 4 < 3 ? variant % 4 + 1 : 2;
    const int producers = variant % 4 < 3 ? 1 : 2;
    const std::string k = "m" + std::to_string(map) + "_k" + std::to_string(pipe) + (producers == 2 ? "_w2_" : "_");
    for (Sm90Case& c : pipe_cases(k)) {
      if (c.cluster != 2) continue;
      c.pipe = pipe;
      c.producers = producers;
      c.map = map;
      c.sync = 1;
      c.ahead = 1;
      c.rescale = 2;
      run_case(c);
    }
  }
}

// The integer e4m3 placement (Cfg::kDequant = 1) in whole-row pieces with two producers' whole
// share in one round (pipe 2), both cluster sizes over pipe_cases: each compared with the CPU
// reference and bit for bit with the hardware conversions in the unit split.
TEST(MlaSm90Kernel, RowsIntegerDequant) {
  REQUIRE_SM90();
  for (Sm90Case& c : pipe_cases("rows_d1_w2_k2_")) {
    c.producers = 2;
    c.pipe = 2;
    c.map = 3;
    c.dequant = 1;
    c.l1 = c.cluster == 2 ? 0 : 1;
    c.phand = c.cluster == 2 ? 0 : 2;
    c.sync = c.cluster == 2 ? 1 : 0;
    c.ahead = 1;
    c.rescale = 2;
    run_case(c);
  }
}

// At most 16 heads: 16, 13, 8, 5 and 1 heads, q_len 1 to 4, pages 1, 16 and 64, heavy skips with
// a row of -1, split pieces with the sink and topk_length, many requests per partition.
std::vector<Sm90Case> small_head_cases(const std::string& k) {
  std::vector<Sm90Case> cases = {make(k + "h16_q1_p64_topk2048", 2, 1, 16, 64, 2048),
                                 make(k + "h8_q2_p1_topk448", 2, 2, 8, 1, 448),
                                 make(k + "h5_q4_p16_topk192", 3, 4, 5, 16, 192)};
  Sm90Case skips = make(k + "h16_heavy_skips_empty_row", 2, 1, 16, 1, 256);
  skips.spec.skip_fraction = 0.9f;
  skips.empty_row = true;
  cases.push_back(skips);
  Sm90Case split = make(k + "h13_split_cap3_sink_topklen", 5, 2, 13, 64, 448);
  split.cap = 3;
  split.one_request = false;
  split.spec.attn_sink = true;
  split.spec.topk_length = true;
  cases.push_back(split);
  Sm90Case many = make(k + "h1_all_in_one_part_topklen", 6, 1, 1, 64, 128);
  many.one_request = false;
  many.spec.topk_length = true;
  cases.push_back(many);
  return cases;
}

// The plan's producers and consumers without a cluster: two producers' whole shares in rows, L1
// evict-last, P after P V, lazy rescale.
void no_cluster_defaults(Sm90Case& c) {
  c.producers = 2;
  c.pipe = 2;
  c.map = 3;
  c.l1 = 1;
  c.phand = 2;
  c.rescale = 2;
}

// The records staged in the Q tile's free rows by bulk copies (Cfg::kStage = 1, at most 16
// heads) with the plan's producers and consumers without a cluster, over small_head_cases and
// the prefetch one to three blocks ahead; each compared with the CPU reference and bit for bit
// with one producer's unit split in run_case.
TEST(MlaSm90Kernel, StagedRecords) {
  REQUIRE_SM90();
  std::vector<Sm90Case> cases = small_head_cases("stage_");
  for (int ahead : {1, 3}) {
    Sm90Case c = make("stage_h16_q1_p64_topk2048_ahead" + std::to_string(ahead), 2, 1, 16, 64, 2048);
    c.ahead = ahead;
    cases.push_back(c);
  }
  for (Sm90Case& c : cases) {
    no_cluster_defaults(c);
    c.stage = 1;
    run_case(c);
  }
}

// The heads on N = 16 in both consumers (Cfg::kNarrow = 1, at most 16 heads), with and without
// the staged records (the plan's producers), and with one producer's unit split (pipe 1), over
// small_head_cases; each compared with the CPU reference and run to run bit for bit in run_case.
TEST(MlaSm90Kernel, NarrowConsumer) {
  REQUIRE_SM90();
  for (int variant = 0; variant < 3; ++variant) {
    const std::string k = variant == 0 ? "narrow_" : variant == 1 ? "narrow_stage_" : "narrow_w1_k1_";
    for (Sm90Case& c : small_head_cases(k)) {
      if (variant == 2) {
        c.pipe = 1;
        c.rescale = 2;
      } else {
        no_cluster_defaults(c);
        c.stage = variant;
      }
      c.narrow = 1;
      run_case(c);
    }
  }
}

// No bf16 tile (Cfg::kDirect = 1..3, at most 16 heads): the records multiplied on the e4m3 tensor
// cores as they are (bulk copies or 16-byte copies, lockstep or alternating consumers), over small_head_cases plus a long request (many passes of the four-slot
// ring, the groups' scale exponents growing along it) and a split one; each compared with the
// CPU reference and run to run bit for bit in run_case.
TEST(MlaSm90Kernel, DirectRecords) {
  REQUIRE_SM90();
  std::vector<Sm90Case> cases = small_head_cases("direct_");
  cases.push_back(make("direct_h16_q1_p64_topk4096", 2, 1, 16, 64, 4096));
  Sm90Case split = make("direct_h16_q2_p16_split_cap5_sink", 3, 2, 16, 16, 2048);
  split.cap = 5;
  split.one_request = false;
  split.spec.attn_sink = true;
  cases.push_back(split);
  for (int direct : {1, 2, 3}) {
    for (Sm90Case c : cases) {
      c.name = "d" + std::to_string(direct) + "_" + c.name;
      c.direct = direct;
      c.rescale = 2;
      run_case(c);
    }
  }
}

// P in consumer 1's registers (Cfg::kPHand = 1) with two producer warpgroups in a cluster (their
// 56 registers leave consumer 1 the 176 it needs): the cluster default otherwise, over the
// cluster cases of pipe_cases, each compared with the CPU reference and bit for bit with P from
// shared memory.
// The plan's cluster knobs but the consumers' hand-over (mla_sm90_defaults for a cluster of 2):
// two producer warpgroups with whole shares in whole-row pieces, the light hand-overs, the
// prefetch a block ahead, lazy rescale.
void cluster_defaults(Sm90Case& c) {
  c.producers = 2;
  c.pipe = 2;
  c.map = 3;
  c.sync = 1;
  c.ahead = 1;
  c.rescale = 2;
}

TEST(MlaSm90Kernel, ClusterPInRegistersTwoProducers) {
  REQUIRE_SM90();
  for (Sm90Case& c : pipe_cases("c2_h1_w2_")) {
    if (c.cluster != 2) continue;
    cluster_defaults(c);
    c.phand = 1;
    run_case(c);
  }
}

// The peer's rows by the bulk-copy unit (Cfg::kPeerCopy = 1) over the cluster cases of
// pipe_cases, with one and two producer warpgroups and pipes 1-3 (whole rows and the unit split):
// each compared with the CPU reference and bit for bit with st.async from every thread.
TEST(MlaSm90Kernel, PeerRowsByBulkCopy) {
  REQUIRE_SM90();
  struct V {
    int producers, pipe, map;
  };
  for (const V v : {V{2, 2, 3}, V{1, 2, 3}, V{2, 1, 0}, V{1, 3, 3}}) {
    const std::string k = "bulk_w" + std::to_string(v.producers) + "_k" + std::to_string(v.pipe) + "_m" +
                          std::to_string(v.map) + "_";
    for (Sm90Case& c : pipe_cases(k)) {
      if (c.cluster != 2) continue;
      c.producers = v.producers;
      c.pipe = v.pipe;
      c.map = v.map;
      c.sync = 1;
      c.ahead = 1;
      c.rescale = 2;
      c.peer_copy = 1;
      run_case(c);
    }
  }
}

// The next block's QK^T issued behind consumer 0's P V (Cfg::kPHand = 3, its P V then reading P
// from shared memory) over pipe_cases: one and many requests per partition (the overlap stops at
// each request's last block and restarts with the next request's Q), splits with the sink and
// topk_length, heavy skips with an empty row, page 1; with the default producers of each cluster
// size (two warpgroups and pipe 1 without a cluster, one and pipe 2 in one) and one producer's
// pipes 1 and 4 without a cluster, two producers with pipe 2 in one. run_case checks each bit for
// bit against kPHand 0 (P V from registers, waited for before the next QK^T): the same products
// summed in the same order.
TEST(MlaSm90Kernel, QkBehindPv) {
  REQUIRE_SM90();
  struct V {
    int producers, pipe_c1, pipe_c2;
  };
  for (const V v : {V{2, 1, 2}, V{1, 4, 2}, V{1, 1, 0}}) {
    const std::string k = "h3_w" + std::to_string(v.producers) + "_k" + std::to_string(v.pipe_c1) + "_";
    for (Sm90Case& c : pipe_cases(k)) {
      c.producers = v.producers;
      c.pipe = c.cluster == 2 ? v.pipe_c2 : v.pipe_c1;
      c.rescale = 2;
      c.phand = 3;
      c.sync = c.cluster == 2 ? 1 : 0;
      c.ahead = 1;
      run_case(c);
    }
  }
}

// Cases in a cluster of 2 that the knob tests share, named with `prefix`: 128 heads on one
// request per partition, splits with the sink and topk_length (cap 3), 96 heads at page 1 with
// heavy skips and a row of all -1.
std::vector<Sm90Case> cluster_cases(const std::string& prefix) {
  Sm90Case c2 = make(prefix + "c2_h128_q1_p64_topk2048", 2, 1, 128, 64, 2048);
  Sm90Case c2split = make(prefix + "c2_h128_split_cap3_sink_topklen", 5, 2, 128, 64, 448);
  c2split.cap = 3;
  c2split.one_request = false;
  c2split.spec.attn_sink = true;
  c2split.spec.topk_length = true;
  Sm90Case c2skips = make(prefix + "c2_h96_p1_heavy_skips_empty_row", 3, 1, 96, 1, 512);
  c2skips.spec.skip_fraction = 0.9f;
  c2skips.empty_row = true;
  std::vector<Sm90Case> cases = {c2, c2split, c2skips};
  for (Sm90Case& c : cases) c.cluster = 2;
  return cases;
}

// The light cluster hand-overs (Cfg::kSync = 1), the L2 prefetch routes (Cfg::kPrefetch 1 bulk,
// 2 none, 3 sectors) and distances (Cfg::kAhead 1, 4) with the default pipe: many blocks per partition (the hand-overs' phases wrap
// many times), page 1 and 64, splits with the sink, a request of all -1.
TEST(MlaSm90Kernel, SyncAndPrefetchVariants) {
  REQUIRE_SM90();
  struct Knobs {
    int sync, prefetch, ahead, l1;
  };
  for (const Knobs v : {Knobs{1, 0, 2, 0}, Knobs{0, 1, 2, 0}, Knobs{1, 1, 2, 0}, Knobs{0, 2, 2, 0},
                        Knobs{1, 3, 2, 0}, Knobs{1, 0, 1, 0}, Knobs{1, 0, 4, 0}, Knobs{1, 0, 2, 1}}) {
    const auto [sync, prefetch, ahead, l1] = v;
    const std::string k = "s" + std::to_string(sync) + "_f" + std::to_string(prefetch) + "_a" +
                          std::to_string(ahead) + "_l" + std::to_string(l1) + "_";
    std::vector<Sm90Case> cases = cluster_cases(k);
    cases.push_back(make(k + "h64_q1_p64_topk2048", 2, 1, 64, 64, 2048));
    for (Sm90Case& c : cases) {
      c.pipe = 2;
      c.sync = sync;
      c.prefetch = prefetch;
      c.ahead = ahead;
      c.l1 = l1;
      run_case(c);
    }
  }
}

// The consumers' variants (Cfg::kRescale 1 and 2, Cfg::kPHand 1 and 2) with the default producers (pipe 4
// without a cluster, pipe 2 in one): one and many requests per partition (O and the maxima reset
// per request), splits with the sink and topk_length, heavy skips with a row of all -1, page 1.
// kRescale 1 and kPHand 1, 2 are checked bit for bit against kRescale 0 / kPHand 0 as well.
TEST(MlaSm90Kernel, ConsumerVariants) {
  REQUIRE_SM90();
  struct Knobs {
    int rescale, phand;
  };
  for (const Knobs v : {Knobs{1, 0}, Knobs{2, 0}, Knobs{0, 1}, Knobs{2, 1}, Knobs{2, 2}}) {
    const std::string k = "r" + std::to_string(v.rescale) + "_h" + std::to_string(v.phand) + "_";
    std::vector<Sm90Case> cases = cluster_cases(k);
    Sm90Case c2many = make(k + "c2_h128_many_requests_q4", 6, 4, 128, 64, 192);
    c2many.one_request = false;
    c2many.cluster = 2;
    cases.push_back(c2many);
    for (Sm90Case& c : cases) c.pipe = 2, c.sync = 1;
    if (v.phand != 1) {  // P in registers needs pipes 0-2; without a cluster the default is 4
      Sm90Case h64 = make(k + "h64_q1_p64_topk2048", 2, 1, 64, 64, 2048);
      Sm90Case h16 = make(k + "h16_split_cap2_sink_topklen", 4, 2, 16, 64, 640);
      h16.cap = 2;
      h16.one_request = false;
      h16.spec.attn_sink = true;
      h16.spec.topk_length = true;
      for (Sm90Case c : {h64, h16}) {
        c.pipe = 4;
        cases.push_back(c);
      }
    } else {
      Sm90Case h64 = make(k + "h64_pipe2_q1_p64_topk2048", 2, 1, 64, 64, 2048);
      h64.pipe = 2;
      cases.push_back(h64);
    }
    for (Sm90Case& c : cases) {
      c.rescale = v.rescale;
      c.phand = v.phand;
      run_case(c);
    }
  }
}

// The seesaw consumers (Cfg::kSeesaw 1 and 2: the two consumer warpgroups take alternate blocks
// and pass the running maxima along; the two orders of a warpgroup's step) with the cluster's
// producers (two warpgroups, pipes 2 and 1): one and many requests per partition with odd and
// even block counts (the request's last block is either warpgroup's; O, the maxima and the sums
// reset per request), one-block requests, splits with the sink and topk_length, heavy skips with
// a row of all -1, page 1, q_len 4, and every rescale policy. Against the CPU reference (the row
// sums add in another order than with one warpgroup on the softmax: not bit for bit with it),
// run to run bit for bit in run_case.
TEST(MlaSm90Kernel, SeesawConsumers) {
  REQUIRE_SM90();
  std::vector<Sm90Case> cases = cluster_cases("see_");
  for (Sm90Case& c : pipe_cases("see_")) {
    if (c.cluster == 2) cases.push_back(c);
  }
  Sm90Case odd = make("see_c2_h128_many_odd_blocks_q4", 7, 4, 128, 64, 192);
  odd.one_request = false;
  odd.cap = 5;
  Sm90Case ones = make("see_c2_h72_one_block_requests_topklen", 9, 1, 72, 16, 64);
  ones.one_request = false;
  ones.spec.topk_length = true;
  Sm90Case lens = make("see_c2_h128_ragged_lengths_sink", 6, 2, 128, 32, 576);
  lens.one_request = false;
  lens.cap = 7;
  lens.spec.topk_length = true;
  lens.spec.attn_sink = true;
  for (Sm90Case c : {odd, ones, lens}) {
    c.cluster = 2;
    cases.push_back(c);
  }
  // Both orders: S issued first (1), the other's block taken first (2).
  for (int seesaw : {1, 2}) {
    for (Sm90Case c : cases) {
      c.name = "s" + std::to_string(seesaw) + "_" + c.name;
      cluster_defaults(c);
      c.seesaw = seesaw;
      run_case(c);
    }
  }
  for (int rescale : {0, 1}) {
    for (Sm90Case c : cluster_cases("see_r" + std::to_string(rescale) + "_")) {
      c.producers = 2;
      c.pipe = 1;
      c.sync = 1;
      c.rescale = rescale;
      c.seesaw = 1;
      run_case(c);
    }
  }
}

}  // namespace
}  // namespace deca::test
