// The fused decode step on the GPU (GqaConfig::rope_style): one launch that rotates q and k_new,
// appends k_new / v_new and attends, against
//  - "rotate, append" done separately (tests/common/fused_gqa_case.hpp): the pools byte for byte,
//    every byte outside the new slots (other requests' slots, spare pages) untouched;
//  - the CPU reference of the fused step: outputs within the usual bound;
//  - the plain decode kernel on the separately appended cache with the rotated q: the fused
//    variant reads the same q values and cache bytes, so its outputs are the same bits.
// Skips without a GPU, except the host check that every case is a valid fused call.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "common/fused_gqa_case.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/gqa_gpu_runner.hpp"

namespace deca::test {
namespace {

struct FusedGpuCase {
  std::string name;
  GqaCaseSpec spec;
  FusedSpec fused;
  GpuOptions opt;
  std::string kernel;  // a part of the kernel name the case is meant to run (empty: any)
};

std::vector<FusedGpuCase> fused_gpu_cases() {
  std::vector<FusedGpuCase> v;
  auto add = [&](const std::string& name, DType kv, auto&& edit) {
    FusedGpuCase c;
    c.name = name;
    c.spec = base_spec(32, 4, 128, 16, kv);
    c.spec.batch = 4;
    // Page boundaries (new token at slot 0 and at the last slot), the first token of a request,
    // a long one (several tiles, splits).
    c.spec.seq_lens = {17, 32, 1, 700};
    edit(c);
    v.push_back(c);
  };
  for (DType kv : {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kINT8}) {
    const std::string k = dtype_name(kv);
    add("neox_" + k, kv, [&](FusedGpuCase& c) {
      if (kv == DType::kFP16) c.spec.q_dtype = c.spec.out_dtype = DType::kFP16;
    });
    add("gptj_partial64_" + k, kv, [](FusedGpuCase& c) {
      c.fused.style = RopeStyle::kGptj;
      c.fused.rotary_dim = 64;
    });
    add("per_head_hnd_positions_" + k, kv, [](FusedGpuCase& c) {
      c.spec.per_head_scales = true;
      c.spec.layout = KvLayout::kHND;
      c.fused.positions = true;
      c.fused.cos_sin_dtype = DType::kBF16;
    });
    add("q5_tree_window_split_" + k, kv, [](FusedGpuCase& c) {
      c.spec.q_len = 5;
      c.spec.seq_lens = {21, 5, 130, 66};
      c.spec.tree_mask = true;
      c.spec.window = 100;
      c.spec.sinks = true;
      // Fixed splits of 64 keys (128 for the Hopper fp8 kernel's tiles): the new tokens of the
      // 66-key request (61 .. 65) straddle the first boundary, those of the 130-key one
      // (125 .. 129) the second (the first for 128-key splits): two CTAs append a request's
      // tokens, each its own.
      c.opt.split_mode = SplitMode::kFixed;
      c.opt.split_tokens = 64;
    });
  }
  add("q16_group8_two_row_blocks_bf16", DType::kBF16, [](FusedGpuCase& c) {
    c.spec.q_len = 16;  // 128 rows: two row blocks read the new tokens, one writes them
    c.spec.seq_lens = {16, 40, 129, 18};
  });
  add("beams4_fp8", DType::kFP8E4M3, [](FusedGpuCase& c) {
    c.spec.batch = 8;
    c.spec.seq_lens = {90, 90, 90, 90, 33, 33, 33, 33};
    c.opt.beam_width = 4;
  });
  add("lse_softcap_d64_g1_bf16", DType::kBF16, [](FusedGpuCase& c) {
    c.spec = base_spec(4, 4, 64, 32, DType::kBF16);
    c.spec.batch = 3;
    c.spec.seq_lens = {33, 64, 2};
    c.spec.softcap = 15.f;
    c.fused.style = RopeStyle::kGptj;
  });
  add("fp8_out_fp8_cache", DType::kFP8E4M3, [](FusedGpuCase& c) {
    c.spec.out_dtype = DType::kFP8E4M3;
    c.spec.out_scale = 0.25f;
    c.spec.q_len = 2;
    c.spec.seq_lens = {17, 32, 2, 700};  // every length at least q_len: 2 = a request's first tokens
  });
  add("split_auto_long_int8", DType::kINT8, [](FusedGpuCase& c) {
    c.spec.batch = 1;
    c.spec.seq_lens = {5000};
    c.spec.q_len = 2;
  });
  // The Hopper fp8 kernel's other shapes: rows on M with two row blocks (row block 1 reads the
  // new tokens, only row block 0 writes them) and with 32 rows (padding operand rows); rows on N
  // on a two-stage ring (a grid of three CTAs per SM, stages_for_grid) with 128-token pages and a
  // fp16 cos/sin cache.
  add("q16_group8_two_row_blocks_fp8", DType::kFP8E4M3, [](FusedGpuCase& c) {
    c.spec.q_len = 16;
    c.spec.seq_lens = {16, 40, 129, 18};
    c.kernel = "_r64_";
  });
  add("q4_rows32_fp8", DType::kFP8E4M3, [](FusedGpuCase& c) {
    c.spec.q_len = 4;
    c.spec.seq_lens = {17, 32, 4, 700};
    c.kernel = "_r32_";
  });
  add("two_stages_page128_fp8", DType::kFP8E4M3, [](FusedGpuCase& c) {
    c.spec.page_size = 128;
    c.spec.seq_lens = {129, 128, 1, 700};
    c.opt.max_batch = 128;  // 512 units: three CTAs per SM, the two-stage plan
    c.fused.cos_sin_dtype = DType::kFP16;
    c.kernel = "_wgmma_st2";
  });
  // The portable kernel's 8-bit fp8 paths without beams (an fp8 plan on the H200 otherwise takes
  // the Hopper kernel): the widening (path 80) and the two-term e4m3 mma (path 89).
  for (int arch : {80, 89}) {
    add("neox_fp8_path" + std::to_string(arch), DType::kFP8E4M3, [arch](FusedGpuCase& c) {
      c.spec.q_len = 3;
      c.spec.seq_lens = {17, 32, 3, 700};  // new tokens 14 .. 16 straddle a page; 3: the first ones
      c.opt.path_arch = arch;
      c.kernel = arch == 80 ? "_ldsm" : "_2term";
    });
  }
  // head_dim 256: q staged in shared memory after the ring that held the rotated rows.
  add("d256_group8_bf16", DType::kBF16, [](FusedGpuCase& c) {
    c.spec = base_spec(16, 2, 256, 16, DType::kBF16);
    c.spec.batch = 3;
    c.spec.q_len = 2;
    c.spec.seq_lens = {17, 2, 300};
    c.fused.rotary_dim = 64;
  });
  // The 16-bit cases the 16-bit Hopper kernel covers (head_dim 64 / 128 / 256 without beams) through
  // it ("_wgmma16", the plans' default) and through the portable kernel (DECA_GQA_SM90_16BIT=0).
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (!hopper_16bit_covers(v[i].spec.head_dim, v[i].spec.kv_dtype, v[i].opt.beam_width)) continue;
    v[i].opt.hopper_16bit = 0;
    FusedGpuCase w = v[i];
    w.name += "_wgmma16";
    w.opt.hopper_16bit = 1;
    v.push_back(std::move(w));
  }
  return v;
}

// Case fc's host data, from its name's seed: the paged case (beams share their prefix pages, each
// request's new tokens in pages of its own) and the fused inputs (make_fused_inputs refuses a
// length outside the fused step's contract).
GqaCase host_case(const FusedGpuCase& fc, FusedInputs& in) {
  auto rng = make_rng(std::hash<std::string>{}(fc.name));
  GqaCase c = build_gqa_case(fc.spec, rng);
  if (fc.opt.beam_width > 1) share_prefix_pages(c, fc.opt.beam_width, /*own_pages=*/1, fc.spec.q_len);
  in = make_fused_inputs(c, fc.fused, rng);
  return c;
}

// On the host, without a GPU: every case above is a call the fused step's contract allows, and
// the CPU reference of the fused step leaves its caches as "rotate, then append". A case outside
// the contract (a length below q_len) would otherwise show only on the GPU, as the checked run's
// record of seq_lens.
TEST(GqaFusedGpuCases, AreFusedCallsTheCpuReferenceRuns) {
  for (const FusedGpuCase& fc : fused_gpu_cases()) {
    SCOPED_TRACE(fc.name);
    FusedInputs in;
    GqaCase c;
    try {
      c = host_case(fc, in);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    const Unfused u = rotate_and_append(c, in);
    cpu::gqa_decode_fused(c.params);
    EXPECT_TRUE(same_bytes(c.k_pool, u.k_pool)) << "K pool differs from rotate + append";
    if (!fc.spec.kv_one_allocation) EXPECT_TRUE(same_bytes(c.v_pool, u.v_pool)) << "V pool differs";
  }
}

class GqaFusedGpu : public ::testing::TestWithParam<FusedGpuCase> {};

TEST_P(GqaFusedGpu, EqualsRotateAppendDecode) {
  DECA_REQUIRE_GPU();
  const FusedGpuCase& fc = GetParam();
  FusedInputs in;
  GqaCase c = host_case(fc, in);
  const Unfused u = rotate_and_append(c, in);

  // The fused launch.
  GqaPlan plan;
  plan.config = gpu_config(c, fc.opt);
  plan.config.rope_style = fc.fused.style;
  plan.config.rotary_dim = fc.fused.rotary_dim;
  plan_with(plan, fc.opt);
  EXPECT_NE(plan.kernel_name.find(fc.kernel), std::string::npos) << plan.kernel_name << " is not a " << fc.kernel;
  DeviceCase dev(c, plan);
  DeviceBuffer k_new(in.k_new), v_new(in.v_new), cos_sin(in.cos_sin), positions(in.positions);
  bind_fused(dev.params, c, in);
  dev.params.k_new = k_new.get();
  dev.params.v_new = v_new.get();
  dev.params.cos_sin = cos_sin.get();
  dev.params.positions = fc.fused.positions ? positions.as<int>() : nullptr;
  cuda::gqa_decode(plan, dev.params, nullptr);
  cuda_ok(cudaDeviceSynchronize(), plan.kernel_name.c_str());
  check_gqa_run(plan, dev.ws.get(), nullptr);
  const GpuRun gpu = dev.results(c, plan);
  HostTensor k_after(c.k_pool.dtype(), c.k_pool.shape());
  dev.k.to_host(k_after);
  EXPECT_TRUE(same_bytes(k_after, u.k_pool)) << plan.kernel_name << ": K pool differs from rotate + append";
  if (!fc.spec.kv_one_allocation) {
    HostTensor v_after(c.v_pool.dtype(), c.v_pool.shape());
    dev.v.to_host(v_after);
    EXPECT_TRUE(same_bytes(v_after, u.v_pool)) << plan.kernel_name << ": V pool differs from rotate + append";
  }

  // The rotate and append kernels alone (deca-bench's three-launch baseline) leave the same bytes.
  {
    DeviceCase sep(c, plan);
    bind_fused(sep.params, c, in);
    sep.params.k_new = k_new.get();
    sep.params.v_new = v_new.get();
    sep.params.cos_sin = cos_sin.get();
    sep.params.positions = fc.fused.positions ? positions.as<int>() : nullptr;
    DeviceBuffer q_rot(c.q.bytes());
    cuda::gqa_rope_append(plan, sep.params, q_rot.get(), 0, nullptr);
    cuda::gqa_rope_append(plan, sep.params, nullptr, 1, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "gqa_rope_append");
    HostTensor q_host(c.q.dtype(), c.q.shape()), k_host(c.k_pool.dtype(), c.k_pool.shape());
    q_rot.to_host(q_host);
    sep.k.to_host(k_host);
    EXPECT_TRUE(same_bytes(q_host, u.q_rot)) << "gqa_rope_append: rotated q differs";
    EXPECT_TRUE(same_bytes(k_host, u.k_pool)) << "gqa_rope_append: K pool differs";
  }

  // The CPU reference of the fused step.
  poison_outputs(c);
  cpu::gqa_decode_fused(c.params);
  const Diff d = compare(c, gpu);
  std::printf("[gpu] %-34s %-64s splits=%-3d %s\n", fc.name.c_str(), plan.kernel_name.c_str(), plan.num_splits,
              describe(d).c_str());
  EXPECT_EQ(d.nan, 0) << seed_message();
  EXPECT_EQ(d.mismatched_inf, 0) << seed_message();
  EXPECT_LE(d.rel_l2, out_tolerance(c.spec.out_dtype)) << seed_message();
  EXPECT_LE(d.lse_max_abs, lse_tolerance(c.spec, plan.kernel_name)) << seed_message();

  // The plain kernel on the separately appended cache, the rotated q: the same bits.
  c.q = u.q_rot;
  c.k_pool = u.k_pool;
  if (!fc.spec.kv_one_allocation) c.v_pool = u.v_pool;
  c.bind();
  const GpuRun plain = run_gqa_on_gpu(c, fc.opt);
  // The same bits when both plans split the keys alike (their occupancy, read from the compiled
  // kernels, sets the split count); otherwise the usual bound between the two.
  if (plain.plan.num_splits == plan.num_splits) {
    EXPECT_TRUE(same_bytes(plain.out, gpu.out)) << "fused " << plan.kernel_name << " vs plain "
                                                << plain.plan.kernel_name << ": outputs differ";
  } else {
    c.out = plain.out;
    EXPECT_LE(compare(c, gpu).rel_l2, out_tolerance(c.spec.out_dtype))
        << "fused (" << plan.num_splits << " splits) vs plain (" << plain.plan.num_splits << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Fused, GqaFusedGpu, ::testing::ValuesIn(fused_gpu_cases()),
                         [](const auto& info) { return info.param.name; });

// Checked mode: a rotary position past cos_sin_cache's rows is read as row 0 and reported by
// check_gqa_run, naming the entry (the portable and the Hopper fp8 kernel).
TEST(GqaFusedGpuChecked, PositionPastTheCosSinCacheIsReported) {
  DECA_REQUIRE_GPU();
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    GqaCaseSpec spec = base_spec(32, 4, 128, 16, kv);
    spec.batch = 2;
    spec.seq_lens = {40, 9};
    auto rng = make_rng(11);
    GqaCase c = build_gqa_case(spec, rng);
    FusedSpec f;
    f.positions = true;
    FusedInputs in = make_fused_inputs(c, f, rng);
    in.positions.data<int>()[1] = static_cast<int>(in.cos_sin.shape()[0]);  // request 1, token 0
    GqaPlan plan;
    plan.config = gpu_config(c, GpuOptions{});
    plan.config.rope_style = RopeStyle::kNeox;
    plan.config.checked = true;
    cuda::plan_gqa_decode(plan);
    DeviceCase dev(c, plan);
    DeviceBuffer k_new(in.k_new), v_new(in.v_new), cos_sin(in.cos_sin), positions(in.positions);
    bind_fused(dev.params, c, in);
    dev.params.k_new = k_new.get();
    dev.params.v_new = v_new.get();
    dev.params.cos_sin = cos_sin.get();
    dev.params.positions = positions.as<int>();
    cuda::gqa_decode(plan, dev.params, nullptr);
    cuda_ok(cudaDeviceSynchronize(), plan.kernel_name.c_str());
    try {
      check_gqa_run(plan, dev.ws.get(), nullptr);
      ADD_FAILURE() << plan.kernel_name << ": no error reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gqa_decode: positions[1][0]: expected a position in [0, "),
                std::string::npos)
          << plan.kernel_name << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace deca::test
