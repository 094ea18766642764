#include "gqa_fused_case.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "api/gqa_prepare.hpp"
#include "cuda/backend.hpp"
#include "data.hpp"
#include "deca/quant.hpp"
#include "timing.hpp"

namespace deca::bench {

namespace {

// The largest |a - b| over two bf16 | fp16 buffers of n elements (device copies downloaded).
double max_abs_diff(const void* a, const void* b, std::size_t n, DType dtype) {
  std::vector<std::uint16_t> ha(n), hb(n);
  check_cuda(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost), "download (fused out)");
  check_cuda(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost), "download (3-launch out)");
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = dtype == DType::kFP16 ? fp16_to_float(ha[i]) : bf16_to_float(ha[i]);
    const float y = dtype == DType::kFP16 ? fp16_to_float(hb[i]) : bf16_to_float(hb[i]);
    m = std::max(m, std::isnan(x) != std::isnan(y) ? INFINITY : static_cast<double>(std::fabs(x - y)));
  }
  return m;
}

}  // namespace

FusedTimes time_fused_step(const GqaPlan& plan, const GqaDecodeArgs& args, const RunOptions& opt,
                           CaseMemory& mem, std::uint64_t seed) {
  GqaConfig fc = plan.config;
  fc.rope_style = RopeStyle::kNeox;
  fc.rotary_dim = 0;
  const GqaPlan fplan = plan_gqa_decode(fc);
  const std::int64_t batch = args.q.shape[0], q_len = args.q.shape[1];
  const std::int64_t hq = fc.num_q_heads, hk = fc.num_kv_heads, d = fc.head_dim;
  const Device device = fc.device;

  // This step's tokens and the cos/sin cache (positions 0 .. max_seq_len - 1, base 10000).
  const std::size_t new_elems = static_cast<std::size_t>(batch * q_len * hk * d);
  Bytes k_new = alloc_bytes(new_elems * 2), v_new = alloc_bytes(new_elems * 2);
  fill_random(k_new.get(), fc.q_dtype, new_elems, seed ^ 0x6b);
  fill_random(v_new.get(), fc.q_dtype, new_elems, seed ^ 0x76);
  const std::int64_t max_pos = fc.max_seq_len;
  std::vector<float> cos_sin(static_cast<std::size_t>(max_pos * d));
  for (std::int64_t pos = 0; pos < max_pos; ++pos) {
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const double angle = pos * std::pow(10000.0, -2.0 * i / d);
      cos_sin[pos * d + i] = static_cast<float>(std::cos(angle));
      cos_sin[pos * d + d / 2 + i] = static_cast<float>(std::sin(angle));
    }
  }
  GqaDecodeArgs fa = args;
  fa.k_new = make_tensor(mem.place(k_new.get(), new_elems * 2), fc.q_dtype, {batch, q_len, hk, d}, device);
  fa.v_new = make_tensor(mem.place(v_new.get(), new_elems * 2), fc.q_dtype, {batch, q_len, hk, d}, device);
  fa.cos_sin_cache = make_tensor(mem.place(cos_sin.data(), cos_sin.size() * 4), DType::kFP32, {max_pos, d}, device);
  fa.workspace = mem.workspace(fplan.workspace_bytes);
  fa.workspace_bytes = fplan.workspace_bytes;
  const std::size_t out_elems = static_cast<std::size_t>(batch * q_len * hq * d);
  Bytes out_host = alloc_bytes(out_elems * 2);
  fa.out = make_tensor(mem.place(out_host.get(), out_elems * 2), fc.out_dtype, {batch, q_len, hq, d}, device);

  FusedTimes f;
  f.kernel_name = fplan.kernel_name;
  CaseResult t;
  time_op(opt, [&](void* stream) {
    GqaDecodeArgs a = fa;
    a.stream = stream;
    gqa_decode(fplan, a);
  }, t);
  f.fused_us = t.time_us;
  f.fused_graph_us = t.time_us_graph;
  if (!opt.cuda) return f;

  // Three launches: q rotated into q_rot, the new tokens appended, the plain decode reading both.
  const GqaParams fp = api::gqa_params(fplan, fa, fa.workspace);
  void* q_rot = mem.place(out_host.get(), out_elems * 2);
  GqaDecodeArgs pa = args;
  pa.q = make_tensor(q_rot, fc.q_dtype, {batch, q_len, hq, d}, device);
  CaseResult t3;
  time_op(opt, [&](void* stream) {
    cuda::gqa_rope_append(fplan, fp, q_rot, 0, stream);
    cuda::gqa_rope_append(fplan, fp, nullptr, 1, stream);
    GqaDecodeArgs a = pa;
    a.stream = stream;
    gqa_decode(plan, a);
  }, t3);
  f.three_us = t3.time_us;
  f.three_graph_us = t3.time_us_graph;
  check_cuda(cudaDeviceSynchronize(), "three-launch run");
  f.max_abs_vs_three = max_abs_diff(fa.out.data, pa.out.data, out_elems, fc.out_dtype);
  return f;
}

}  // namespace deca::bench
