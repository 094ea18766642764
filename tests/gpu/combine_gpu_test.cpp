// The `combine` op on CUDA tensors against the CPU reference: random partials with empty (-inf)
// pieces whose rows hold NaN, whole rows of empty pieces, the sink on and off, odd dim_v and head
// counts, bf16 / fp16 / fp32 outputs poisoned before the run. Skipped where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "common/test_seed.hpp"
#include "deca/mla.hpp"
#include "gpu/device_buffer.hpp"

namespace deca::test {
namespace {

TensorView on_device(TensorView v, const DeviceBuffer& b) {
  v.data = b.get();
  v.device = Device::cuda(0);
  return v;
}

void run_case(int splits, int batch, int q_len, int heads, int dim_v, DType out_dtype, bool sink,
              std::uint64_t salt) {
  SCOPED_TRACE("splits " + std::to_string(splits) + " heads " + std::to_string(heads) +
               " dim_v " + std::to_string(dim_v) + " out " + dtype_name(out_dtype) +
               (sink ? " sink" : ""));
  auto rng = make_rng(salt);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  HostTensor po(DType::kFP32, {splits, batch, q_len, heads, dim_v});
  HostTensor pl(DType::kFP32, {splits, batch, q_len, heads});
  HostTensor snk(DType::kFP32, {heads});
  for (std::int64_t i = 0; i < po.numel(); ++i) po.data<float>()[i] = normal(rng);
  for (std::int64_t i = 0; i < snk.numel(); ++i) snk.data<float>()[i] = 2.f * normal(rng);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::int64_t rows = static_cast<std::int64_t>(batch) * q_len * heads;
  for (std::int64_t r = 0; r < rows; ++r) {
    const bool all_empty = r % 7 == 3;
    for (int j = 0; j < splits; ++j) {
      const bool empty = all_empty || u(rng) < 0.2f;
      pl.data<float>()[j * rows + r] = empty ? neg_inf : 3.f * normal(rng);
      if (empty) {
        for (int d = 0; d < dim_v; ++d) po.data<float>()[(j * rows + r) * dim_v + d] = NAN;
      }
    }
  }
  HostTensor out(out_dtype, {batch, q_len, heads, dim_v}), lse(DType::kFP32, {batch, q_len, heads});
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  CombineArgs a;
  a.partial_out = po.view();
  a.partial_lse = pl.view();
  if (sink) a.attn_sink = snk.view();
  a.out = out.view();
  a.lse = lse.view();
  combine(a);

  DeviceBuffer dpo(po), dpl(pl), dsnk(snk), dout(out.bytes()), dlse(lse.bytes());
  dout.fill(0xFF);
  dlse.fill(0xFF);
  CombineArgs g;
  g.partial_out = on_device(po.view(), dpo);
  g.partial_lse = on_device(pl.view(), dpl);
  if (sink) g.attn_sink = on_device(snk.view(), dsnk);
  g.out = on_device(out.view(), dout);
  g.lse = on_device(lse.view(), dlse);
  combine(g);
  cuda_ok(cudaDeviceSynchronize(), "combine");
  HostTensor gout(out_dtype, out.shape()), glse(DType::kFP32, lse.shape());
  dout.to_host(gout);
  dlse.to_host(glse);

  const double tol = out_dtype == DType::kBF16 ? 1e-2 : out_dtype == DType::kFP16 ? 2e-3 : 1e-4;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double a0 = gout.get(i), b0 = out.get(i);
    ASSERT_FALSE(std::isnan(a0)) << "out[" << i << "]";
    ASSERT_LE(std::fabs(a0 - b0), tol * (1 + std::fabs(b0))) << "out[" << i << "]";
  }
  for (std::int64_t i = 0; i < lse.numel(); ++i) {
    const float a0 = glse.data<float>()[i], b0 = lse.data<float>()[i];
    if (std::isinf(b0)) {
      ASSERT_EQ(a0, b0) << "lse[" << i << "]";
    } else {
      ASSERT_NEAR(a0, b0, 1e-4 * (1 + std::fabs(b0))) << "lse[" << i << "]";
    }
  }
}

TEST(CombineGpu, MatchesCpuReference) {
  DECA_REQUIRE_GPU();
  DECA_SEED_TRACE();
  std::uint64_t salt = 0;
  run_case(2, 3, 1, 8, 512, DType::kBF16, false, ++salt);
  run_case(5, 2, 2, 13, 512, DType::kBF16, true, ++salt);
  run_case(3, 2, 3, 5, 100, DType::kFP16, true, ++salt);
  run_case(1, 4, 1, 9, 128, DType::kFP32, false, ++salt);
  run_case(7, 1, 4, 33, 37, DType::kFP32, true, ++salt);
}

}  // namespace
}  // namespace deca::test
