// Times the sm90a MLA decode kernel a plan runs, alone, and its timing-only builds that leave one
// stage out (config.cuh Ablate: the tensor-core products, the cache's memory traffic, the
// producers or the consumers), so that one GPU round says what bounds it, on three families of
// shapes (tests/jit/mla_sm90_timing_cases.hpp; the NVRTC test compiles the same builds):
//   Sparse/  V3.2's anchor rows: q_len 1, page 64, topk 2048, b128/b64 x h128/h64 and b128 h16;
//   Dense/   bf16 rows at b128 h128 8k, b128 h64 8k, b128 h16 4k, and e4m3 at b128 h128 8k;
//   Model1/  b128 h64 q_len 2 topk 128 (page 256) + extra 1024 (page 64), b128 h128 topk 2048.
// Each kernel is the plan's (cuda::mla_decode_key of the case's MlaConfig), launched as the plan
// launches it (threads, cluster, shared memory: mla_decode_shape) over the partitions the plan's
// scheduler makes (mla::schedule_requests on the host, decode_num_parts partitions). Cold L2
// (256 MB written before every launch), median of 10 after 3 warm-ups, CUDA events around the
// launch alone; the scheduler and the combine of split requests are not included. A kernel with
// TMA rows (bf16 at 128 heads) is timed beside its register producers (reg-rows, reg-producers).
//
// Each line: the shape, the variant, µs, TFLOP/s (2·h·(d_qk + d_v) per visible key of every query
// token), GB/s (sparse: every selected token's stored bytes; dense: every request's tokens once),
// and µs per 64-token block per SM. Blocks are counted per CTA: every (request piece, query token,
// 64-head block) CTA processes the request's ceil(keys / 64) blocks (both caches' for MODEL1), so
// the total is batch x q_len x head blocks x blocks per request; the CTAs that run at once are the
// grid's (head blocks x q_len x partitions, at most one per SM: the shared memory allows no
// second, and decode_num_parts makes the grid fit the SMs), and blocks per SM is the total over
// them. µs per block is the time over blocks per SM, the request's fixed costs (Q, the outputs)
// included, as in docs/perf-notes-mla.md's per-block table.
//
// The test fails if a launch fails or the real kernel leaves a non-finite output (the bf16 rows
// of unsplit requests and the fp32 partial rows of split ones, NaN before the first launch). One test per shape:
// --gtest_filter='Dense/*' times the dense shapes, '*b128_h16*' the 16-head ones. Skips without an
// sm_90 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/device_buffer.hpp"
#include "cuda/mla_tma.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/mla_sm90_timing_cases.hpp"
#include "kernels/mla/model1.cuh"
#include "kernels/mla/schedule/schedule.cuh"
#include "kernels/mla/schedule/work.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::test {
namespace {

constexpr int kPool = 1 << 18;  // V3.2's shared pool of tokens: 172 MB, well past the 60 MB L2

// Bytes of one stored token, and of one page of `page` tokens (MODEL1's page is padded to 576).
long long token_bytes(int format) {
  switch (format) {
    case kMlaKvBF16: return 2 * 576;
    case kMlaKvFP8E4M3: return 576;
    case kMlaKvModel1: return mla::kModel1RowBytes + mla::kModel1ScaleBytes;
    default: return mla::sm90::kTokenBytes;
  }
}
long long page_bytes(int format, int page) {
  if (format != kMlaKvModel1) return page * token_bytes(format);
  return (page * token_bytes(format) + mla::kModel1RowBytes - 1) / mla::kModel1RowBytes * mla::kModel1RowBytes;
}

// A cache's tokens as the requests see them: position j of request b is token
// table[b * stride + j / page] * page + j % page.
struct Pages {
  int page = 64;
  int stride = 0;  // table entries per request; 0: one row every request shares
  std::vector<int> table;
  int num_blocks() const { return static_cast<int>(table.size()); }
  int token(int b, int j) const { return table[static_cast<std::size_t>(b) * stride + j / page] * page + j % page; }
};

// `len` tokens per request in pages of their own, shuffled over the pool (the bench's layout);
// `shared`: one row of `len` tokens in order, which every request sees.
Pages make_pages(int batch, int len, int page, bool shared, std::mt19937& rng) {
  Pages p;
  p.page = page;
  const int per = (len + page - 1) / page;
  p.stride = shared ? 0 : per;
  p.table.resize(static_cast<std::size_t>(shared ? 1 : batch) * per);
  std::iota(p.table.begin(), p.table.end(), 0);
  if (!shared) std::shuffle(p.table.begin(), p.table.end(), rng);
  return p;
}

// `topk` distinct positions of request b's `len`-token context for each of its q_len query tokens,
// as token ids: [batch, q_len, topk].
std::vector<int> select(const Pages& pg, int len, int batch, int q_len, int topk, std::mt19937& rng) {
  std::vector<int> ids(static_cast<std::size_t>(batch) * q_len * topk);
  std::vector<char> seen(len, 0);
  std::uniform_int_distribution<int> any(0, len - 1);
  for (int row = 0; row < batch * q_len; ++row) {
    int* out = ids.data() + static_cast<std::size_t>(row) * topk;
    for (int k = 0; k < topk;) {
      const int pos = any(rng);
      if (seen[pos]) continue;
      seen[pos] = 1;
      out[k++] = pos;
    }
    for (int k = 0; k < topk; ++k) {
      seen[out[k]] = 0;
      out[k] = pg.token(row / q_len, out[k]);
    }
  }
  return ids;
}

// Everything one case's launches read and write, and what its lines report.
struct TimedRun {
  std::vector<DeviceBuffer> keep;  // every buffer kp points into
  mla::DecodeKernelParams kp{};
  mla::TensorMapBytes kv_map{};  // the TMA rows kernel's second parameter
  std::vector<int> offsets;  // split offsets: request r's pieces are offsets[r + 1] - offsets[r]
  int num_parts = 0;
  long long blocks = 0;  // 64-token blocks over every CTA
  double flop = 0, bytes = 0;

  template <class T>
  T* upload(const std::vector<T>& v) {
    keep.emplace_back(v.size() * sizeof(T));
    cudaMemcpy(keep.back().get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return keep.back().as<T>();
  }
  // `bytes` of device memory, every byte `fill` (0x3C: bf16 ~0.0115, e4m3 1.5, fp32 scales
  // ~0.0115, ue8m0 2^-67: finite everywhere; 0xFF: NaN in bf16 and fp32, for the outputs).
  void* device(std::size_t bytes, std::uint8_t fill) {
    keep.emplace_back(bytes);
    keep.back().fill(fill);
    return keep.back().get();
  }
};

// The device bytes of one cache of `format` laid out as `pg` (the first cache or the extra one).
const unsigned char* place_cache(TimedRun& r, const Pages& pg, int format) {
  return static_cast<const unsigned char*>(r.device(pg.num_blocks() * page_bytes(format, pg.page), 0x3C));
}

// The case's inputs, outputs and partitions on `sms` SMs, as the plan's run fills them
// (src/cuda/mla_backend.cpp, mla_dense.cpp): the schedule made on the host by the scheduler's
// own phases.
void make_run(const TimingCase& c, int sms, TimedRun& r) {
  const MlaConfig& cf = c.config;
  const int batch = cf.max_batch, q_len = cf.max_q_len, heads = cf.num_heads;
  const int format = cuda::mla_kv_format(cf);
  const bool model1 = format == kMlaKvModel1;
  const int dqk = model1 ? mla::kModel1Dim : 576;
  std::mt19937 rng(7);
  MlaSparseParams& p = r.kp.p;
  p.batch = batch, p.q_len = q_len, p.num_heads = heads, p.page_size = cf.page_size;
  p.q = r.device(static_cast<std::size_t>(batch) * q_len * heads * dqk * 2, 0x3C);
  p.q_stride_head = dqk, p.q_stride_token = 1LL * dqk * heads, p.q_stride_batch = 1LL * dqk * heads * q_len;
  p.out = r.device(static_cast<std::size_t>(batch) * q_len * heads * 512 * 2, 0xFF);  // NaN until written
  p.out_stride_head = 512, p.out_stride_token = 512LL * heads, p.out_stride_batch = 512LL * heads * q_len;
  p.lse = static_cast<float*>(r.device(static_cast<std::size_t>(batch) * q_len * heads * 4, 0));
  p.lse_stride_head = 1, p.lse_stride_token = heads, p.lse_stride_batch = 1LL * heads * q_len;
  p.softmax_scale = 1.f / std::sqrt(static_cast<float>(dqk));
  p.kv_stride_slot = token_bytes(format);
  p.kv_stride_block = page_bytes(format, cf.page_size);

  std::vector<int> lens(batch, cf.max_seq_len);  // dense: every request's length
  mla::TopkLists lists = mla::one_cache(nullptr, cf.topk);
  long long keys = 0;  // visible keys summed over every query token
  if (!cf.sparse) {
    const Pages pg = make_pages(batch, cf.max_seq_len, cf.page_size, false, rng);
    p.kv = place_cache(r, pg, format);
    p.num_blocks = pg.num_blocks();
    p.topk = cf.max_seq_len;
    p.topk_length = r.upload(lens);
    r.kp.dense.block_table = r.upload(pg.table);
    r.kp.dense.block_table_stride = pg.stride;
    r.kp.dense.max_blocks = pg.stride;
    r.kp.dense.kv_format = format;
    r.kp.dense.kv_scale = 1.f;
    // The TMA rows' map, as the plan's run encodes it (the register variants never read it).
    if (cuda::mla_decode_key(90, "sm90", cf).tma) cuda::encode_dense_rows_map(r.kp, r.kv_map, "mla_sm90_timing");
    lists = mla::one_cache(lens.data(), cf.max_seq_len);
    for (int i = 0; i < q_len; ++i) keys += 1LL * batch * (cf.max_seq_len - (q_len - 1 - i));
    r.bytes = 1.0 * batch * cf.max_seq_len * token_bytes(format);
  } else {
    const int context = c.context > 0 ? c.context : kPool;
    const Pages pg = make_pages(batch, context, cf.page_size, c.context == 0, rng);
    p.kv = place_cache(r, pg, format);
    p.num_blocks = pg.num_blocks();
    p.topk = cf.topk;
    p.indices = r.upload(select(pg, context, batch, q_len, cf.topk, rng));
    p.indices_stride_token = cf.topk, p.indices_stride_batch = 1LL * q_len * cf.topk;
    keys = 1LL * batch * q_len * (cf.topk + cf.extra_topk);
    r.bytes = 1.0 * keys * token_bytes(format);
  }
  if (model1) {
    p.kv_format = kMlaKvModel1;
    lists.extra_topk = cf.extra_topk;
    if (cf.extra_topk > 0) {
      const Pages xp = make_pages(batch, c.extra_context, cf.extra_page_size, false, rng);
      p.extra_page_size = cf.extra_page_size;
      p.extra_num_blocks = xp.num_blocks();
      p.extra_topk = cf.extra_topk;
      p.extra_kv = place_cache(r, xp, format);
      p.extra_kv_stride_block = page_bytes(format, cf.extra_page_size);
      p.extra_indices = r.upload(select(xp, c.extra_context, batch, q_len, cf.extra_topk, rng));
      p.extra_indices_stride_token = cf.extra_topk, p.extra_indices_stride_batch = 1LL * q_len * cf.extra_topk;
    }
  }
  r.flop = 2.0 * heads * (dqk + 512) * static_cast<double>(keys);

  r.num_parts = mla::decode_num_parts(sms, q_len, heads);
  std::vector<mla::SparsePart> parts(r.num_parts);
  r.offsets.assign(batch + 1, 0);
  const int slots = mla::schedule_requests(batch, lists, r.num_parts, parts.data(), r.offsets.data());
  for (int b = 0; b < batch; ++b) r.blocks += mla::request_blocks(lists, b);
  r.blocks *= 1LL * q_len * mla::sm90::head_blocks(heads);
  mla::SparseRun& run = r.kp.run;
  run.parts = r.upload(parts);
  run.split_offsets = r.upload(r.offsets);
  run.partial_o = static_cast<float*>(r.device(static_cast<std::size_t>(slots) * q_len * heads * 512 * 4, 0xFF));
  run.partial_lse = static_cast<float*>(r.device(static_cast<std::size_t>(slots) * q_len * heads * 4, 0));
  run.num_parts = r.num_parts;
  run.max_slots = slots;
  run.stamp = r.upload(std::vector<mla::ScheduleStamp>{model1 ? mla::schedule_stamp<true>(p, r.num_parts)
                                                              : mla::schedule_stamp<false>(p, r.num_parts)});
}

// Median µs of 10 launches after 3 warm-ups, each after the L2 flush. `kv_map`: the TMA rows
// kernel's second parameter, null for the others.
void time_launches(const jit::LoadedKernel& k, const jit::Dim3& grid, const cuda::MlaDecodeShape& shape,
                   mla::DecodeKernelParams& kp, mla::TensorMapBytes* kv_map, const DeviceBuffer& flush,
                   const char* what, double* us) {
  void* one[] = {&kp};
  void* two[] = {&kp, kv_map};
  void** args = kv_map != nullptr ? two : one;
  jit::LaunchOptions opts;
  if (shape.cluster_x > 1) opts.cluster = {static_cast<unsigned>(shape.cluster_x), 1, 1};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int rep = 0; rep < 13; ++rep) {
    flush.fill(static_cast<std::uint8_t>(rep));
    cudaEventRecord(e0);
    jit::launch(k, grid, {static_cast<unsigned>(shape.threads), 1, 1}, static_cast<std::size_t>(shape.smem_bytes),
                nullptr, args, opts);
    cudaEventRecord(e1);
    cuda_ok(cudaEventSynchronize(e1), what);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (rep >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  *us = 1e3 * ms[ms.size() / 2];
}

// Non-finite values the kernel wrote: the final bf16 rows of unsplit requests, the fp32 partial
// rows of every piece of split ones.
long long non_finite_outputs(const TimedRun& r) {
  const MlaSparseParams& p = r.kp.p;
  const long long row = 1LL * p.q_len * p.num_heads * 512;  // one request's (or slot's) values
  std::vector<unsigned short> out(static_cast<std::size_t>(p.batch * row));
  std::vector<float> po(static_cast<std::size_t>(r.offsets.back() * row));
  cudaMemcpy(out.data(), p.out, out.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(po.data(), r.kp.run.partial_o, po.size() * 4, cudaMemcpyDeviceToHost);
  long long bad = 0;
  for (int b = 0; b < p.batch; ++b) {
    if (r.offsets[b + 1] - r.offsets[b] == 1) {
      for (long long i = b * row; i < (b + 1) * row; ++i) bad += (out[i] & 0x7F80) == 0x7F80;  // inf or NaN
    } else {
      for (long long i = r.offsets[b] * row; i < r.offsets[b + 1] * row; ++i) bad += !std::isfinite(po[i]);
    }
  }
  return bad;
}

class MlaSm90Timing : public ::testing::TestWithParam<TimingCase> {};

TEST_P(MlaSm90Timing, KernelAndStageVariants) {
  DECA_REQUIRE_GPU();
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "properties");
  if (prop.major != 9 || prop.minor != 0) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  const TimingCase& c = GetParam();
  const cuda::MlaKernelKey key = timing_key(c);
  const cuda::MlaDecodeShape shape = cuda::mla_decode_shape(key);
  TimedRun r;
  make_run(c, prop.multiProcessorCount, r);
  DeviceBuffer flush(256u << 20);
  const jit::Dim3 grid{static_cast<unsigned>(mla::sm90::head_blocks(c.config.num_heads)),
                       static_cast<unsigned>(c.config.max_q_len), static_cast<unsigned>(r.num_parts)};
  const int ctas = std::min<int>(grid.x * grid.y * grid.z, prop.multiProcessorCount);
  const double per_sm = static_cast<double>(r.blocks) / ctas;
  std::printf("[mla_sm90 timing] %s %s: %s, %d partitions, %d slots, %lld blocks over %d CTAs\n", c.family.c_str(),
              c.name.c_str(), key.name().c_str(), r.num_parts, r.offsets.back(), r.blocks, ctas);
  for (const TimingVariant& v : timing_variants(key)) {
    const jit::LoadedKernel& k = jit::get_kernel(timing_spec(key, v), 0);
    double us = 0;
    mla::TensorMapBytes* map = key.tma && !v.register_rows ? &r.kv_map : nullptr;
    ASSERT_NO_FATAL_FAILURE(time_launches(k, grid, shape, r.kp, map, flush, v.name, &us));
    std::printf("[mla_sm90 timing] %-6s %-28s %-10s %8.1f us  %6.1f TFLOP/s  %6.0f GB/s  %5.2f us/block/SM"
                " (%.1f blocks/SM)\n",
                c.family.c_str(), c.name.c_str(), v.name, us, r.flop / us * 1e-6, r.bytes / us * 1e-3, us / per_sm,
                per_sm);
    if (v.ablate == mla::sm90::kAblateNone) EXPECT_EQ(non_finite_outputs(r), 0) << c.family << " " << c.name;
  }
}

std::string case_name(const ::testing::TestParamInfo<TimingCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Sparse, MlaSm90Timing, ::testing::ValuesIn(sparse_timing_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Dense, MlaSm90Timing, ::testing::ValuesIn(dense_timing_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Model1, MlaSm90Timing, ::testing::ValuesIn(model1_timing_cases()), case_name);

}  // namespace
}  // namespace deca::test
