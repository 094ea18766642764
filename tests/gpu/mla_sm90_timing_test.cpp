// Times the sm90a MLA sparse decode kernel a plan runs, alone, on the anchor shapes (q_len 1, page
// 64, topk 2048; batch 128/64 x heads 128/64, and b128 h16), and its timing-only builds that leave
// one stage out (config.cuh Ablate: the tensor-core products, the gather's memory traffic, the
// producers or the consumers), so that one GPU round says what bounds it. Cold L2 (256 MB written
// before every launch), median of 10 after 3 warm-ups, CUDA events around the launch alone; the
// combine of split requests is not included. The test fails if a launch fails or the real kernel
// writes a non-finite output. One test per shape (--gtest_filter='*b128_h16*' times one alone).
// Skips without an sm_90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu/device_buffer.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/mla_sm90_spec.hpp"
#include "kernels/mla/sm90/config.cuh"
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

class MlaSm90Timing : public ::testing::TestWithParam<Shape> {};

TEST_P(MlaSm90Timing, KernelAndStageVariants) {
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

  {
    const Shape sh = GetParam();
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
    // The plan's kernel for the shape and its ablations: against the kernel, no-gather says what
    // the gather's latency costs, no-mma what the products cost; each side alone says whether the
    // two overlap (kernel ~ the slower side) or add up.
    struct Variant {
      int ablate;
      const char* name;
    };
    const mla::sm90::KernelClass kc = mla::sm90::kernel_class(sh.heads);
    std::vector<Variant> variants = {{mla::sm90::kAblateNone, "kernel"},
                                     {mla::sm90::kAblateNoMma, "no-mma"},
                                     {mla::sm90::kAblateNoGather, "no-gather"},
                                     {mla::sm90::kAblateProducersOnly, "producers"}};
    if (!kc.direct) variants.push_back({mla::sm90::kAblateConsumersOnly, "consumers"});
    for (const Variant& v : variants) {
      const jit::JitSpec spec = mla_sm90_spec(64, sh.heads, v.ablate);
      const jit::LoadedKernel& k = jit::get_kernel(spec, 0);
      void* args[] = {&kp};
      jit::LaunchOptions opts;
      if (kc.cluster == 2) opts.cluster = {2, 1, 1};
      const jit::Dim3 grid{static_cast<unsigned>(hb), 1u, static_cast<unsigned>(parts.size())};
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<float> ms;
      for (int rep = 0; rep < 13; ++rep) {
        flush.fill(static_cast<std::uint8_t>(rep));
        cudaEventRecord(e0);
        jit::launch(k, grid, {static_cast<unsigned>(mla::sm90::threads_of(kc.direct)), 1, 1}, mla::sm90::kSmemBytes, nullptr, args, opts);
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

INSTANTIATE_TEST_SUITE_P(AnchorShapes, MlaSm90Timing,
                         ::testing::Values(Shape{128, 128}, Shape{64, 128}, Shape{128, 64}, Shape{64, 64},
                                           Shape{128, 16}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "b" + std::to_string(info.param.batch) + "_h" + std::to_string(info.param.heads);
                         });

}  // namespace
}  // namespace deca::test
