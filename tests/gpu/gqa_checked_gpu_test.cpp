// Checked mode on the GPU (GqaConfig::checked): bad page ids and sequence lengths planted in device memory
// are never dereferenced (a huge or negative page id would fault; the lead's GPU round also runs
// this under compute-sanitizer memcheck), the bad keys contribute nothing, every other request's
// output is still the reference's, and check_gqa_run raises the deca::Error that names the entry,
// then finds the record cleared. On valid inputs a checked run is bitwise the unchecked one.
// Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "common/test_seed.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

GqaCaseSpec spec_of(DType kv, std::vector<int> lens, int page = 16, int head_dim = 128) {
  GqaCaseSpec s;
  s.num_q_heads = 16;
  s.num_kv_heads = 2;
  s.head_dim = head_dim;
  s.page_size = page;
  s.kv_dtype = kv;
  s.batch = static_cast<int>(lens.size());
  s.seq_lens = std::move(lens);
  return s;
}

struct Outputs {
  HostTensor out, lse;
};

// The CPU reference of the case as it stands (its page table and lengths must be valid).
Outputs reference(GqaCase& c) {
  poison_outputs(c);
  cpu::gqa_decode(c.params);
  Outputs r{HostTensor(c.out.dtype(), c.out.shape()), HostTensor(DType::kFP32, c.lse.shape())};
  std::memcpy(r.out.raw(), c.out.raw(), c.out.bytes());
  std::memcpy(r.lse.raw(), c.lse.raw(), c.lse.bytes());
  return r;
}

int& table_entry(GqaCase& c, int b, int column) {
  return c.page_table.data<int>()[static_cast<std::int64_t>(b) * c.page_table.shape()[1] + column];
}

// A checked plan's run of the case as it stands (bad entries included); the error check_gqa_run
// raised ("" when none), and a second check's (must be "": the first one cleared the record).
struct CheckedRun {
  GpuRun gpu;
  std::string error, second_error;
};

CheckedRun run_checked(const GqaCase& c, const GpuOptions& o = {}) {
  CheckedRun r;
  GqaPlan plan;
  plan.config = gpu_config(c, o);
  plan.config.checked = true;
  plan_with(plan, o);
  EXPECT_NE(plan.kernel_name.find("_chk"), std::string::npos) << plan.kernel_name;
  DeviceCase dev(c, plan);
  cuda::gqa_decode(plan, dev.params, nullptr);
  const cudaError_t rc = cudaDeviceSynchronize();
  EXPECT_EQ(rc, cudaSuccess) << plan.kernel_name << ": " << cudaGetErrorName(rc)
                             << " (a bad id was dereferenced?)";
  try {
    check_gqa_run(plan, dev.ws.get(), nullptr);
  } catch (const Error& e) {
    r.error = e.what();
  }
  try {
    check_gqa_run(plan, dev.ws.get(), nullptr);
  } catch (const Error& e) {
    r.second_error = e.what();
  }
  r.gpu = dev.results(c, plan);
  return r;
}

// Relative L2 of request b's output against the reference, and its NaN count.
struct RequestDiff {
  double rel_l2 = 0;
  long long nan = 0;
  double lse_max_abs = 0;
  long long lse_inf_mismatch = 0;
};

RequestDiff diff_request(const GqaCase& c, const HostTensor& out, const HostTensor& lse,
                         const Outputs& ref, int b) {
  RequestDiff d;
  const auto& s = c.spec;
  const std::int64_t per = static_cast<std::int64_t>(s.q_len) * s.num_q_heads * s.head_dim;
  double num = 0, den = 0;
  for (std::int64_t i = b * per; i < (b + 1) * per; ++i) {
    const double a = out.get(i), e = ref.out.get(i);
    if (std::isnan(a)) {
      ++d.nan;
      continue;
    }
    num += (a - e) * (a - e);
    den += e * e;
  }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const std::int64_t rows = static_cast<std::int64_t>(s.q_len) * s.num_q_heads;
  for (std::int64_t i = b * rows; i < (b + 1) * rows; ++i) {
    const float a = lse.data<float>()[i], e = ref.lse.data<float>()[i];
    if (std::isnan(a)) {
      ++d.nan;
    } else if (std::isinf(a) || std::isinf(e)) {
      if (a != e) ++d.lse_inf_mismatch;
    } else {
      d.lse_max_abs = std::max(d.lse_max_abs, static_cast<double>(std::fabs(a - e)));
    }
  }
  return d;
}

void expect_request_matches(const GqaCase& c, const CheckedRun& r, const Outputs& ref, int b,
                            const std::string& what) {
  const RequestDiff d = diff_request(c, r.gpu.out, r.gpu.lse, ref, b);
  EXPECT_EQ(d.nan, 0) << what << " request " << b << " " << seed_message();
  EXPECT_EQ(d.lse_inf_mismatch, 0) << what << " request " << b;
  EXPECT_LE(d.rel_l2, out_tolerance(c.spec.out_dtype)) << what << " request " << b;
  EXPECT_LE(d.lse_max_abs, 2e-2) << what << " request " << b;
}

struct PageCase {
  std::string name;
  DType kv;
  std::vector<int> lens;
  int bad_request;
  int bad_value;
  GpuOptions opt;
  int head_dim = 128;
};

void PrintTo(const PageCase& c, std::ostream* os) { *os << c.name; }

std::vector<PageCase> page_cases() {
  GpuOptions beams;
  beams.beam_width = 2;
  GpuOptions fixed;
  fixed.split_mode = SplitMode::kFixed;
  fixed.split_tokens = 256;
  GpuOptions hopper16;  // the 16-bit Hopper kernel (the plans' default for these caches on sm_90a)
  hopper16.hopper_16bit = 1;
  GpuOptions portable16;  // the portable kernel (DECA_GQA_SM90_16BIT=0)
  portable16.hopper_16bit = 0;
  GpuOptions hopper16_fixed = fixed;
  hopper16_fixed.hopper_16bit = 1;
  return {
      {"bf16_huge_wgmma16", DType::kBF16, {300, 1000, 77, 500}, 2, 1 << 30, hopper16},
      {"fp16_negative_wgmma16", DType::kFP16, {300, 1000, 77, 500}, 2, -7, hopper16},
      {"bf16_long_splits_wgmma16", DType::kBF16, {20000, 77, 3000}, 1, 99999, hopper16},
      {"fp16_fixed_splits_wgmma16", DType::kFP16, {4000, 77, 3000}, 1, 1 << 30, hopper16_fixed},
      // head_dim 256 (32-token tiles of two 16-key pages).
      {"bf16_huge_d256_wgmma16", DType::kBF16, {300, 1000, 77, 500}, 2, 1 << 30, hopper16, 256},
      {"fp16_long_splits_d256_wgmma16", DType::kFP16, {20000, 77, 3000}, 1, 99999, hopper16, 256},
      {"bf16_fixed_splits_d256_wgmma16", DType::kBF16, {4000, 77, 3000}, 1, -7, hopper16_fixed, 256},
      {"bf16_huge", DType::kBF16, {300, 1000, 77, 500}, 2, 1 << 30, portable16},
      {"bf16_negative", DType::kBF16, {300, 1000, 77, 500}, 2, -7, portable16},
      {"fp8_past_pool", DType::kFP8E4M3, {300, 1000, 77, 500}, 2, 0, {}},  // 0: num_pages
      {"fp8_long_splits", DType::kFP8E4M3, {20000, 77, 3000}, 1, 99999, {}},
      {"int8_fixed_splits", DType::kINT8, {4000, 77, 3000}, 1, 1 << 30, fixed},
      {"bf16_beams", DType::kBF16, {300, 300, 77, 77}, 3, 1 << 30, beams},
  };
}

class GqaCheckedPage : public ::testing::TestWithParam<PageCase> {};

// Request `bad_request` has length 77 (page 16: pages 0..4, the last one holding keys 64..76):
// its last page's id is made bad. Expected: the error naming page_table[b][4]; that request's
// output equal to the reference over its first 64 keys (the bad page contributes nothing); every
// other request's output the reference's.
TEST_P(GqaCheckedPage, BadPageIdIsSkippedAndReported) {
  DECA_REQUIRE_GPU();
  const PageCase& pc = GetParam();
  auto rng = make_rng(std::hash<std::string>{}(pc.name));
  GqaCase c = build_gqa_case(spec_of(pc.kv, pc.lens, 16, pc.head_dim), rng);
  ASSERT_EQ(c.lens[pc.bad_request], 77);
  const Outputs ref = reference(c);
  // The bad request's expectation: the same case with its length cut to the bad page's start
  // (q_len 1, no window: the query sees keys 0..63 either way).
  int* lens = c.seq_lens.data<int>();
  lens[pc.bad_request] = 64;
  const Outputs ref_cut = reference(c);
  lens[pc.bad_request] = 77;

  const int num_pages = static_cast<int>(c.k_pool.shape()[0]);
  const int bad = pc.bad_value == 0 ? num_pages : pc.bad_value;
  table_entry(c, pc.bad_request, 4) = bad;
  const CheckedRun r = run_checked(c, pc.opt);

  EXPECT_EQ(r.error, "gqa_decode: page_table[" + std::to_string(pc.bad_request) +
                         "][4]: expected a page id in [0, " + std::to_string(num_pages) +
                         "), got " + std::to_string(bad) + " (found by the checked GPU run)");
  EXPECT_EQ(r.second_error, "");
  for (int b = 0; b < c.spec.batch; ++b) {
    expect_request_matches(c, r, b == pc.bad_request ? ref_cut : ref, b, pc.name);
  }
  std::printf("[gpu] checked %-20s %-60s splits=%d\n", pc.name.c_str(),
              r.gpu.plan.kernel_name.c_str(), r.gpu.plan.num_splits);
}

INSTANTIATE_TEST_SUITE_P(Cases, GqaCheckedPage, ::testing::ValuesIn(page_cases()),
                         [](const auto& info) { return info.param.name; });

// A length past what the page table can address (or past the plan's max_seq_len) reads as 0:
// zeros and LSE -inf for that request, the others untouched; the error names seq_lens[b].
TEST(GqaCheckedGpu, BadSeqLenReadsAsEmptyAndIsReported) {
  DECA_REQUIRE_GPU();
  for (int mode = 0; mode < 3; ++mode) {
    auto rng = make_rng(900 + mode);
    GqaCase c = build_gqa_case(spec_of(DType::kFP8E4M3, {300, 1000, 77, 500}), rng);
    const Outputs ref = reference(c);
    const int table_keys = static_cast<int>(c.page_table.shape()[1]) * c.spec.page_size;
    // 0: past the plan's max_seq_len (1000, the longest) but inside the table; 1: past the
    // table (its spare column holds a huge id that must not be read); 2: negative.
    const int bad = mode == 0 ? 1001 : (mode == 1 ? table_keys + 1 : -3);
    ASSERT_GT(table_keys, 1001);
    c.seq_lens.data<int>()[1] = bad;
    const CheckedRun r = run_checked(c);
    EXPECT_EQ(r.error, "gqa_decode: seq_lens[1]: expected 0 or a length in [q_len, " +
                           std::to_string(std::min(table_keys, 1000)) +
                           "] (q_len..min(max_pages * page_size, plan.config.max_seq_len)), got " +
                           std::to_string(bad) + " (found by the checked GPU run)");
    EXPECT_EQ(r.second_error, "");
    const std::int64_t per = static_cast<std::int64_t>(c.spec.num_q_heads) * c.spec.head_dim;
    for (std::int64_t i = per; i < 2 * per; ++i) ASSERT_EQ(r.gpu.out.get(i), 0.0) << i;
    for (int h = 0; h < c.spec.num_q_heads; ++h) {
      EXPECT_EQ(r.gpu.lse.data<float>()[c.spec.num_q_heads + h], -INFINITY) << h;
    }
    for (int b : {0, 2, 3}) expect_request_matches(c, r, ref, b, "seq_len mode " + std::to_string(mode));
  }
}

// Valid inputs: a checked run writes bitwise what the unchecked run writes, and leaves no record.
TEST(GqaCheckedGpu, ValidInputsGiveTheUncheckedBytes) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(910);
  GqaCase c = build_gqa_case(spec_of(DType::kFP8E4M3, {20000, 77, 3000, 1}, 64), rng);
  const CheckedRun checked = run_checked(c);
  EXPECT_EQ(checked.error, "");
  GqaPlan plan;
  plan.config = gpu_config(c, {});
  plan.config.checked = false;
  cuda::plan_gqa_decode(plan);
  EXPECT_EQ(plan.kernel_name.find("_chk"), std::string::npos) << plan.kernel_name;
  EXPECT_EQ(plan.num_splits, checked.gpu.plan.num_splits);
  EXPECT_EQ(checked.gpu.plan.workspace_bytes, plan.workspace_bytes + kCheckBytes);
  DeviceCase dev(c, plan);
  cuda::gqa_decode(plan, dev.params, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const GpuRun plain = dev.results(c, plan);
  EXPECT_TRUE(same_bytes(plain.out, checked.gpu.out, static_cast<long long>(plain.out.bytes())));
  EXPECT_TRUE(same_bytes(plain.lse, checked.gpu.lse, static_cast<long long>(plain.lse.bytes())));
}

// Through the public API: a checked plan needs its (larger) workspace even without splits, and
// the one-shot gqa_decode(config, args) raises the error itself.
TEST(GqaCheckedGpu, OneShotCallRaisesTheError) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(911);
  GqaCase c = build_gqa_case(spec_of(DType::kBF16, {40, 77}), rng);
  table_entry(c, 1, 2) = -1;
  DeviceBuffer q(c.q), k(c.k_pool), v(c.v_pool), pt(c.page_table), sl(c.seq_lens),
      out(c.out.bytes()), lse(c.lse.bytes());
  const Device gpu = Device::cuda(0);
  const GqaCaseSpec& s = c.spec;
  const std::int64_t pool = c.k_pool.shape()[0];
  GqaDecodeArgs a;
  a.q = make_tensor(q.get(), s.q_dtype, {s.batch, s.q_len, s.num_q_heads, s.head_dim}, gpu);
  a.k_cache = make_tensor(k.get(), s.kv_dtype, {pool, s.page_size, s.num_kv_heads, s.head_dim}, gpu);
  a.v_cache = make_tensor(v.get(), s.kv_dtype, {pool, s.page_size, s.num_kv_heads, s.head_dim}, gpu);
  a.page_table = make_tensor(pt.get(), DType::kINT32, {s.batch, c.page_table.shape()[1]}, gpu);
  a.seq_lens = make_tensor(sl.get(), DType::kINT32, {s.batch}, gpu);
  a.out = make_tensor(out.get(), s.out_dtype, {s.batch, s.q_len, s.num_q_heads, s.head_dim}, gpu);
  a.lse = make_tensor(lse.get(), DType::kFP32, {s.batch, s.q_len, s.num_q_heads}, gpu);
  GqaConfig cfg;
  cfg.lse = true;
  cfg.device = gpu;
  cfg.checked = true;
  try {
    gqa_decode(cfg, a);
    ADD_FAILURE() << "a page id of -1 was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gqa_decode: page_table[1][2]: expected a page id in [0, "),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace deca::test
