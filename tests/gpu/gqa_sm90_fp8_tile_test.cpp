// The e4m3 wgmma tile of docs/design-gqa-sm90.md (kernels/gqa/sm90/fp8_tile.cuh): one 128-token
// tile of an fp8 cache against a double-precision reference computed on the same stored bytes,
// for a flat and a peaked softmax. The two-term split of q and P is what issue 8 asks for: the
// float64 simulation (tools/sim_two_term.py) predicts ~0.2 % relative RMS, one term 3.5-5 %; the
// bound here (0.6 %) lies between. Written with the design and not yet run on a GPU (2026-12-01):
// the next GPU round checks it first. Outputs are poisoned with NaN first. Skipped without an sm_90
// GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/test_seed.hpp"
#include "deca/quant.hpp"
#include "gpu/device_buffer.hpp"
#include "jit/gqa_sm90_tile_spec.hpp"
#include "jit/kernel_cache.hpp"
#include "kernels/gqa/sm90/fp8_tile_traits.cuh"

namespace deca::test {
namespace {

namespace g = ::deca::gqa::sm90;

bool have_sm90() {
  if (!cuda::available()) return false;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  return prop.major == 9 && prop.minor == 0;
}

// One tile: K, V as e4m3 bytes of N(0, 1) values over a per-tensor scale (max |x| -> 448), q as
// N(0, q_sigma) floats.
void run_tile(float q_sigma, double lse_tol, std::uint64_t salt) {
  SCOPED_TRACE(q_sigma);
  constexpr int T = g::kTileTokens, D = g::kTileDim, R = g::kTileRows;
  auto rng = make_rng(salt);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto quantize = [&](std::vector<std::uint8_t>& bytes, float& scale) {
    std::vector<float> x(static_cast<std::size_t>(T) * D);
    float amax = 0.f;
    for (float& v : x) {
      v = normal(rng);
      amax = std::max(amax, std::fabs(v));
    }
    scale = amax / 448.f;
    bytes.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) bytes[i] = float_to_fp8e4m3(x[i] / scale);
  };
  std::vector<std::uint8_t> k, v;
  float k_scale = 0.f, v_scale = 0.f;
  quantize(k, k_scale);
  quantize(v, v_scale);
  std::vector<float> q(static_cast<std::size_t>(R) * D);
  for (float& x : q) x = q_sigma * normal(rng);
  const float softmax_scale = 1.f / std::sqrt(static_cast<float>(D));

  // Reference in double on the stored bytes.
  std::vector<double> ref(static_cast<std::size_t>(R) * D, 0.0), ref_lse(R);
  for (int r = 0; r < R; ++r) {
    std::vector<double> logit(T);
    double mx = -INFINITY;
    for (int t = 0; t < T; ++t) {
      double acc = 0.0;
      for (int d = 0; d < D; ++d) acc += static_cast<double>(q[r * D + d]) * fp8e4m3_to_float(k[t * D + d]);
      logit[t] = acc * k_scale * softmax_scale;
      mx = std::max(mx, logit[t]);
    }
    double sum = 0.0;
    for (int t = 0; t < T; ++t) sum += std::exp(logit[t] - mx);
    ref_lse[r] = mx + std::log(sum);
    for (int t = 0; t < T; ++t) {
      const double p = std::exp(logit[t] - mx) / sum;
      for (int d = 0; d < D; ++d) ref[r * D + d] += p * fp8e4m3_to_float(v[t * D + d]) * v_scale;
    }
  }

  DeviceBuffer dk(k.size()), dv(v.size()), dq(q.size() * 4), dout(ref.size() * 4), dlse(R * 4);
  cudaMemcpy(dk.get(), k.data(), k.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dv.get(), v.data(), v.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dq.get(), q.data(), q.size() * 4, cudaMemcpyHostToDevice);
  dout.fill(0xFF);  // NaN
  dlse.fill(0xFF);
  g::Fp8TileProbeParams p{};
  p.k = dk.as<unsigned char>();
  p.v = dv.as<unsigned char>();
  p.q = dq.as<float>();
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.softmax_scale = softmax_scale;
  p.out = dout.as<float>();
  p.lse = dlse.as<float>();
  const jit::LoadedKernel& kernel = jit::get_kernel(gqa_sm90_fp8_tile_spec(), 0);
  void* args[] = {&p};
  jit::launch(kernel, {1, 1, 1}, {g::kTileThreads, 1, 1}, g::kFp8TileSmemBytes, nullptr, args);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(ref.size()), lse(R);
  cudaMemcpy(out.data(), dout.get(), out.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse.data(), dlse.get(), lse.size() * 4, cudaMemcpyDeviceToHost);

  double num = 0.0, den = 0.0, lse_err = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "out[" << i / D << "][" << i % D << "] = " << out[i];
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  for (int r = 0; r < R; ++r) lse_err = std::max(lse_err, std::fabs(lse[r] - ref_lse[r]));
  const double rel_rms = std::sqrt(num / den);
  std::printf("[fp8 tile] q sigma %.1f: rel RMS %.4f %%, LSE max abs error %.2e\n", q_sigma,
              100.0 * rel_rms, lse_err);
  EXPECT_LE(rel_rms, 0.006);
  EXPECT_LE(lse_err, lse_tol);
}

TEST(GqaSm90Fp8Tile, TwoTermE4m3WgmmaMatchesTheReference) {
  DECA_REQUIRE_GPU();
  if (!have_sm90()) GTEST_SKIP() << "wgmma needs a compute capability 9.0 GPU";
  // tools/sim_fp8_tile.py (these steps in float64 with ml_dtypes' e4m3, 20 draws each): rel RMS
  // <= 0.09 % / 0.33 % and LSE errors <= 3.4e-4 / 1.9e-2 (the logits' error grows with |q|).
  run_tile(1.f, 2e-3, 301);  // a flat softmax over the 128 tokens
  run_tile(8.f, 3e-2, 302);  // a peaked one: a few tokens carry most of the weight
}

}  // namespace
}  // namespace deca::test
