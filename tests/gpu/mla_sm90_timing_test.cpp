// Times the sm90a MLA sparse decode kernel alone on the four anchor shapes (q_len 1, page 64,
// topk 2048; batch 128/64 x heads 128/64) with the plan's default knobs, and its timing-only
// builds without the dequantization, the tensor cores, the gather's memory traffic or both of
// the last two (in a cluster also without the NoPE crossing to the peer, and one producer's unit
// split and pair exchange with their skeletons), and each side alone (consumers only, producers
// only), so that one GPU round says what bounds it. Cold L2 (256 MB written before every launch), median of 10
// after 3 warm-ups, CUDA events around the launch alone; the combine of split requests is not
// included. The test fails if a launch fails or the real kernel writes a non-finite output.
// Skips without an sm_90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/device_buffer.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "kernels/mla/sm90/traits.cuh"
#include "kernels/mla/schedule/work.cuh"

namespace deca::test {
namespace {

constexpr int kPool = 1 << 18;  // tokens in the cache: 172 MB, well past the 60 MB L2

struct Shape {
  int batch, heads;
};

// FlashMLA's scheduler in miniature: about (blocks + 5 per request) / parts units per partition.
std::vector<mla::SparsePart> schedule(int batch, int blocks, int parts, std::vector<int>* offsets) {
  const int per = (batch * (blocks + mla::kFixedOverheadBlocks) + parts - 1) / parts +
                  mla::kFixedOverheadBlocks;
  std::vector<mla::SparsePart> out;
  std::vector<int> pieces(batch, 0);
  int r = 0, b = 0;
  while (r < batch) {
    mla::SparsePart p{};
    p.begin_req = r;
    p.begin_block = b;
    int room = per;
    while (r < batch && room > mla::kFixedOverheadBlocks) {
      const int take = std::min(room - mla::kFixedOverheadBlocks, blocks - b);
      room -= take + mla::kFixedOverheadBlocks;
      b += take;
      p.end_req = r;
      p.end_block = b;
      if (b < blocks) break;
      ++r;
      b = 0;
    }
    out.push_back(p);
  }
  for (const auto& p : out) {
    for (int q = p.begin_req; q <= p.end_req; ++q) ++pieces[q];
  }
  offsets->assign(batch + 1, 0);
  for (int q = 0; q < batch; ++q) (*offsets)[q + 1] = (*offsets)[q] + pieces[q];
  std::vector<int> seen(batch, 0);
  for (auto& p : out) {
    p.begin_split = (*offsets)[p.begin_req] + seen[p.begin_req];
    p.begin_split_count = pieces[p.begin_req];
    p.end_split_count = pieces[p.end_req];
    for (int q = p.begin_req; q <= p.end_req; ++q) ++seen[q];
  }
  return out;
}

TEST(MlaSm90Timing, AnchorShapesAndStageVariants) {
  DECA_REQUIRE_GPU();
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "properties");
  if (prop.major != 9 || prop.minor != 0) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  const int sms = prop.multiProcessorCount;
  constexpr int kTopk = 2048, kBlocks = kTopk / 64;

  DeviceBuffer kv(static_cast<std::size_t>(kPool) * mla::sm90::kTokenBytes);
  kv.fill(0x3C);  // e4m3 1.5, fp32 scales ~0.0115, bf16 RoPE ~0.0115: finite everywhere
  DeviceBuffer flush(256u << 20);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, kPool - 1);

  // DECA_MLA_TIMING_HEADS=n times the shapes of n heads alone (a shorter round).
  const char* only = std::getenv("DECA_MLA_TIMING_HEADS");
  for (const Shape sh : {Shape{128, 128}, Shape{64, 128}, Shape{128, 64}, Shape{64, 64}, Shape{128, 16}}) {
    if (only != nullptr && std::atoi(only) != sh.heads) continue;
    const int hb = mla::sm90::head_blocks(sh.heads);
    std::vector<int> ids(static_cast<std::size_t>(sh.batch) * kTopk);
    for (int& v : ids) v = any(rng);
    DeviceBuffer q(static_cast<std::size_t>(sh.batch) * sh.heads * 576 * 2);
    q.fill(0x3C);
    DeviceBuffer idx(ids.size() * 4), out(static_cast<std::size_t>(sh.batch) * sh.heads * 512 * 2),
        lse(static_cast<std::size_t>(sh.batch) * sh.heads * 4);
    cudaMemcpy(idx.get(), ids.data(), idx.bytes(), cudaMemcpyHostToDevice);
    std::vector<int> offs;
    const std::vector<mla::SparsePart> parts = schedule(sh.batch, kBlocks, std::max(1, sms / hb), &offs);
    const int slots = offs.back();
    DeviceBuffer dparts(parts.size() * sizeof(mla::SparsePart)), doffs(offs.size() * 4),
        po(static_cast<std::size_t>(slots) * sh.heads * 512 * 4), pl(static_cast<std::size_t>(slots) * sh.heads * 4);
    cudaMemcpy(dparts.get(), parts.data(), dparts.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(doffs.get(), offs.data(), doffs.bytes(), cudaMemcpyHostToDevice);

    mla::DecodeKernelParams kp{};
    MlaSparseParams& p = kp.p;
    p.batch = sh.batch, p.q_len = 1, p.num_heads = sh.heads, p.page_size = 64, p.topk = kTopk;
    p.num_blocks = kPool / 64;
    p.q = q.get();
    p.q_stride_head = 576, p.q_stride_token = 576LL * sh.heads, p.q_stride_batch = 576LL * sh.heads;
    p.kv = kv.as<unsigned char>();
    p.kv_stride_slot = mla::sm90::kTokenBytes, p.kv_stride_block = 64LL * mla::sm90::kTokenBytes;
    p.indices = idx.as<int>();
    p.indices_stride_token = kTopk, p.indices_stride_batch = kTopk;
    p.out = out.get();
    p.out_stride_head = 512, p.out_stride_token = 512LL * sh.heads, p.out_stride_batch = 512LL * sh.heads;
    p.lse = lse.as<float>();
    p.lse_stride_head = 1, p.lse_stride_token = sh.heads, p.lse_stride_batch = sh.heads;
    p.softmax_scale = 1.f / 24.f;
    kp.run.parts = dparts.as<mla::SparsePart>();
    kp.run.split_offsets = doffs.as<int>();
    kp.run.partial_o = po.as<float>();
    kp.run.partial_lse = pl.as<float>();
    kp.run.num_parts = static_cast<int>(parts.size());
    kp.run.max_slots = slots;
    const mla::ScheduleStamp st = mla::schedule_stamp(p, kp.run.num_parts);
    DeviceBuffer stamp(sizeof(st));
    cudaMemcpy(stamp.get(), &st, sizeof(st), cudaMemcpyHostToDevice);
    kp.run.stamp = stamp.as<mla::ScheduleStamp>();

    const double flop = 2.0 * sh.batch * sh.heads * kTopk * (576 + 512);
    // The plan's defaults for the shape (mla_sm90_defaults: two producer warpgroups in whole-row
    // pieces, each's whole share in one round (pipe 2); without a cluster the gather's loads
    // allocating in L1, in one the light hand-overs and P in consumer 1's registers; the L2
    // prefetch a block ahead, lazy rescale) and their ablations (knobs.cuh Ablate): without the
    // conversion, without the tensor cores, without the gather's memory traffic, without both.
    // Kernel against no-gather says what the gather's latency costs; no-gather-no-mma is the
    // pipeline's skeleton (hand-overs, conversion, softmax, epilogue).
    // In a cluster also without the NoPE sent to the peer (the RoPE units alone cross), with and
    // without the skeleton's ablations: what the distributed shared memory traffic costs; and the
    // pair exchange and the whole-row pieces (Cfg::kMap 2, 3), with their skeletons.
    // (In a cluster "units" is the unit split of one producer, the default until 5d7c91b.)
    struct Variant {
      int ablate;
      const char* name;
      int map = 3;
      int producers = 2;
      int seesaw = 0;
      int stage = 0;   // Cfg::kStage: the records staged in the Q tile (16 heads)
      int narrow = 0;  // Cfg::kNarrow: S^T with the heads on N (16 heads)
      int direct = 0;  // Cfg::kDirect: no bf16 tile (16 heads; its own producer, 384 threads)
    };
    // Each side alone (Ablate 7-9): the consumers on zeroed tiles without waiting for any, the
    // producers with every tile released as soon as it is full, with and without the gather's
    // memory traffic. Against the kernel they say whether the two sides overlap (kernel ~ the
    // slower side) or add up (the two-tile ring makes each wait for the other's latency).
    std::vector<Variant> variants = {{0, "kernel"}, {1, "no-dequant"}, {2, "no-mma"},
                                     {3, "no-gather"}, {4, "no-gather-mma"},
                                     {7, "consumers"}, {8, "producers"}, {9, "prod-no-gather"}};
    const int cluster = hb == 2 ? 2 : 1;
    if (cluster == 2) {
      variants.push_back({5, "no-peer"});
      variants.push_back({6, "skel-no-peer"});
      variants.push_back({0, "units", 0, 1});
      variants.push_back({4, "units-skel", 0, 1});
      variants.push_back({0, "pairs", 2, 1});
      variants.push_back({4, "pairs-skel", 2, 1});
      // The seesaw consumers (Cfg::kSeesaw): the kernel, its consumers alone, without wgmma.
      variants.push_back({0, "seesaw", 3, 2, 1});
      variants.push_back({7, "see-consumers", 3, 2, 1});
      variants.push_back({2, "see-no-mma", 3, 2, 1});
      variants.push_back({0, "seesaw-2", 3, 2, 2});
      variants.push_back({7, "see2-consumers", 3, 2, 2});
    }
    if (sh.heads <= 16) {
      // At 16 heads: the staged records and the heads on N, each and together, with each side alone.
      variants.push_back({0, "stage", 3, 2, 0, 1, 0});
      variants.push_back({8, "stage-producers", 3, 2, 0, 1, 0});
      variants.push_back({0, "narrow", 3, 2, 0, 0, 1});
      variants.push_back({7, "narrow-consumers", 3, 2, 0, 0, 1});
      variants.push_back({0, "narrow-stage", 3, 2, 0, 1, 1});
      variants.push_back({2, "narrow-stage-no-mma", 3, 2, 0, 1, 1});
      // No bf16 tile (Cfg::kDirect): bulk copies and lockstep consumers (1), 16-byte copies (2),
      // and alternating consumers (3); each with its ablations.
      for (int d : {1, 2, 3}) {
        static const char* const kNames[3][4] = {
            {"direct1", "direct1-no-mma", "direct1-no-gather", "direct1-producers"},
            {"direct2", "direct2-no-mma", "direct2-no-gather", "direct2-producers"},
            {"direct3", "direct3-no-mma", "direct3-no-gather", "direct3-producers"}};
        const int ablations[4] = {0, 2, 3, 8};
        for (int a = 0; a < 4; ++a) variants.push_back({ablations[a], kNames[d - 1][a], 0, 1, 0, 0, 0, d});
      }
    }
    for (const Variant& v : variants) {
      const jit::JitSpec spec =
          cluster == 2 ? mla_sm90_spec(64, 2, v.ablate, 2, 0, 1, 0, 1, v.map, 0, 2,
                                       v.producers == 2 && v.seesaw == 0 ? 1 : 0, v.producers, 0, 0, v.seesaw)
          : v.direct != 0 ? mla_sm90_spec(64, 1, v.ablate, 0, 0, 0, 0, 2, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0, v.direct)
                          : mla_sm90_spec(64, 1, v.ablate, 2, 0, 0, 0, 1, 3, 1, 2, 2, 2, 0, 0, 0, v.stage, v.narrow);
      const jit::LoadedKernel& k = jit::get_kernel(spec, 0);
      void* args[] = {&kp};
      jit::LaunchOptions opts;
      if (cluster == 2) opts.cluster = {2, 1, 1};
      const jit::Dim3 grid{static_cast<unsigned>(hb), 1u, static_cast<unsigned>(parts.size())};
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<float> ms;
      for (int rep = 0; rep < 13; ++rep) {
        flush.fill(static_cast<std::uint8_t>(rep));
        cudaEventRecord(e0);
        jit::launch(k, grid, {static_cast<unsigned>(mla::sm90::threads_of(v.producers)), 1, 1}, mla::sm90::kSmemBytes, nullptr, args, opts);
        cudaEventRecord(e1);
        cuda_ok(cudaEventSynchronize(e1), v.name);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (rep >= 3) ms.push_back(t);
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      std::sort(ms.begin(), ms.end());
      const double us = 1e3 * ms[ms.size() / 2];
      std::printf("[mla_sm90 timing] b%d h%d topk%d %-12s parts=%zu slots=%d  %8.1f us  %6.1f TFLOP/s"
                  "  %6.0f GB/s selected\n",
                  sh.batch, sh.heads, kTopk, v.name, parts.size(), slots, us, flop / us * 1e-6,
                  sh.batch * static_cast<double>(kTopk) * 656 / us * 1e-3);
      if (v.ablate == 0) {
        // Unsplit rows hold final bf16 outputs; every one must be finite.
        std::vector<unsigned short> h(out.bytes() / 2);
        cudaMemcpy(h.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost);
        std::vector<bool> unsplit(sh.batch, false);
        for (int b = 0; b < sh.batch; ++b) unsplit[b] = offs[b + 1] - offs[b] == 1;
        int bad = 0;
        for (int b = 0; b < sh.batch; ++b) {
          if (!unsplit[b]) continue;
          for (long long i = 0; i < 512LL * sh.heads; ++i) {
            bad += (h[b * 512LL * sh.heads + i] & 0x7F80) == 0x7F80;  // inf or NaN
          }
        }
        EXPECT_EQ(bad, 0) << v.name << " b" << sh.batch << " h" << sh.heads;
      }
    }
  }
}

}  // namespace
}  // namespace deca::test
