// The phase stamps of the Hopper GQA kernels (kernels/gqa/stamps.cuh, src/cuda/gqa_stamps.cpp,
// deca-bench --stamps): the stamp build of a plan's kernel writes every CTA's record, its events
// in the order the kernel meets them, and the same output bits as the plan's own kernel. Split
// plans (32 and 48 splits, empty splits), rows on M, a plan without splits. Skipped where no GPU
// is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/gqa_stamps.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

std::vector<NamedGpuCase> stamp_cases() {
  std::vector<NamedGpuCase> cases;
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    const std::string dt = dtype_name(kv);
    GqaCaseSpec one = base_spec(64, 8, 128, 64, kv);  // l70-b1-16k's unit: 16 or 32 splits
    one.seq_lens = {16384};
    cases.push_back({"one_16k_" + dt, one, {}});
    GqaCaseSpec ragged = base_spec(64, 8, 128, 64, kv);  // empty splits and an empty request
    ragged.batch = 4, ragged.seq_lens = {8192, 0, 300, 5001};
    GpuOptions s48;
    s48.splits = 48;
    cases.push_back({"ragged_48_" + dt, ragged, s48});
  }
  GqaCaseSpec rows = base_spec(64, 8, 128, 64, DType::kFP8E4M3);  // rows on M, split
  rows.batch = 2, rows.q_len = 4, rows.seq_lens = {6000, 1500};
  cases.push_back({"rows_on_m_fp8", rows, {}});
  GqaCaseSpec many = base_spec(64, 8, 128, 64, DType::kBF16);  // 512 units: no split
  many.batch = 64, many.seq_lens = {};
  for (int b = 0; b < many.batch; ++b) many.seq_lens.push_back(200 + 37 * b);
  GpuOptions one_split;
  one_split.splits = 1;
  cases.push_back({"no_split_bf16", many, one_split});
  return cases;
}

// Every CTA of the grid wrote its record: entry, wait, q, first copies, last PV and its output or
// partial; its coordinates; the first tile exactly when its split has one; every pair of events
// in order (stamp_orders); the merge events on one CTA per unit when split, none otherwise.
void expect_complete(const std::string& name, const GqaPlan& plan, const cuda::StampRun& run, long long units,
                     int requests) {
  ASSERT_EQ(static_cast<long long>(run.ctas.size()), run.grid_ctas) << name;
  const int splits = plan.num_splits;
  long long merged = 0;
  std::uint64_t first_entry = ~0ull, last_end = 0;
  for (std::size_t i = 0; i < run.ctas.size(); ++i) {
    const cuda::CtaStamps& s = run.ctas[i];
    const std::string where = name + " CTA " + std::to_string(i);
    ASSERT_GE(s.sm, 0) << where;
    for (int e : {gqa::kStampEntry, gqa::kStampWaited, gqa::kStampQ, gqa::kStampIssued, gqa::kStampLastPv,
                  gqa::kStampOut}) {
      EXPECT_NE(s.t[e], 0u) << where << " event " << cuda::stamp_event_key(e);
    }
    const long long gy = run.grid_ctas / splits / requests;  // kv heads x row blocks
    EXPECT_EQ(s.x, static_cast<int>(i % splits)) << where;
    EXPECT_EQ(s.y + gy * s.z, static_cast<long long>(i / splits)) << where;
    EXPECT_GE(s.tiles, 0) << where;
    EXPECT_EQ(s.t[gqa::kStampFirstTile] != 0, s.tiles > 0) << where;
    for (const cuda::StampOrder& o : cuda::stamp_orders()) {
      if (s.t[o.before] != 0 && s.t[o.after] != 0) {
        EXPECT_LE(s.t[o.before], s.t[o.after])
            << where << ": " << cuda::stamp_event_key(o.before) << " after " << cuda::stamp_event_key(o.after);
      }
    }
    EXPECT_EQ(s.t[gqa::kStampMergeWeights] != 0, s.t[gqa::kStampMergeEnd] != 0) << where;
    merged += s.t[gqa::kStampMergeEnd] != 0 ? 1 : 0;
    first_entry = std::min(first_entry, s.t[gqa::kStampEntry]);
    last_end = std::max(last_end, *std::max_element(s.t.begin(), s.t.end()));
  }
  EXPECT_EQ(merged, splits > 1 ? units : 0) << name;
  // The marks before and after the launch, in the same clock.
  EXPECT_NE(run.mark_before, 0u) << name;
  EXPECT_LE(run.mark_before, first_entry) << name;
  EXPECT_GE(run.mark_after, last_end) << name;
}

TEST(GqaStampsGpu, EveryCtaStampsItsPhasesInOrderAndTheBitsStay) {
  DECA_REQUIRE_GPU();
  for (NamedGpuCase& sc : stamp_cases()) {
    GqaCase c = build_named_case(sc, 41);
    const GqaPlan plan = gpu_plan(c, sc.opt);
    const std::string name = sc.name + " " + plan.kernel_name;
    ASSERT_TRUE(cuda::gqa_stamps_supported(plan)) << name;
    EXPECT_EQ(plan.num_splits > 1, sc.name != "no_split_bf16") << name;
    // The plan's own kernel, then its stamp build, on the same buffers (outputs poisoned again).
    DeviceCase dev(c, plan);
    cuda::gqa_decode(plan, dev.params, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << name;
    const GpuRun plain = dev.results(c, plan);
    dev.out.fill(0xFF);
    dev.lse.fill(0xFF);
    const cuda::GqaStamper stamper(plan, "GqaStampsGpu");
    EXPECT_EQ(stamper.kernel_name(), plan.kernel_name + "_stamp");
    stamper.clear(nullptr);
    stamper.run(dev.params, nullptr);
    const cuda::StampRun run = stamper.read(dev.params, nullptr);
    const GpuRun stamped = dev.results(c, plan);
    EXPECT_TRUE(same_bytes(plain.out, stamped.out, static_cast<long long>(plain.out.bytes()))) << name;
    EXPECT_TRUE(same_bytes(plain.lse, stamped.lse, static_cast<long long>(plain.lse.bytes()))) << name;
    const long long units = run.grid_ctas / plan.num_splits;  // (request, kv head, row block)
    expect_complete(name, plan, run, units, dev.params.batch);
    const cuda::StampSummary s = cuda::summarize_stamps(run);
    EXPECT_EQ(s.ctas, run.grid_ctas) << name;
    EXPECT_EQ(s.missing, 0) << name;
    EXPECT_GE(s.waves.size(), 1u) << name;
    EXPECT_GT(s.span_us, 0.0) << name;
  }
}

// The portable kernel has no stamp build: refused by name before anything is compiled.
TEST(GqaStampsGpu, PortableKernelIsRefused) {
  DECA_REQUIRE_GPU();
  auto rng = make_rng(42);
  GqaCaseSpec s = base_spec(64, 8, 128, 64, DType::kINT8);
  s.seq_lens = {1000};
  GqaCase c = build_gqa_case(s, rng);
  const GqaPlan plan = gpu_plan(c);
  EXPECT_FALSE(cuda::gqa_stamps_supported(plan)) << plan.kernel_name;
  try {
    const cuda::GqaStamper stamper(plan, "GqaStampsGpu");
    ADD_FAILURE() << "expected a deca::Error for " << plan.kernel_name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GqaStampsGpu: plan.kernel_name"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deca::test
