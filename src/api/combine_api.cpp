// combine: merge split-KV partial results by LSE. Validation, params, dispatch to the CPU
// reference or the CUDA kernel (kernels/mla/combine/combine.cuh) by the tensors' device.
#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "api/params_fill.hpp"
#include "cuda/backend.hpp"
#include "cpu/reference.hpp"
#include "deca/error.hpp"
#include "deca/mla.hpp"
#include "kernels/mla/params.cuh"

namespace deca {

namespace {
constexpr std::int64_t kMaxCombineSplits = 65536;
}  // namespace

void combine(const CombineArgs& a) {
  using namespace api;
  constexpr const char* fn = "combine";
  constexpr const char* cpu_only = "every tensor on partial_out's device";
  const Device dev = a.partial_out.device;
  if (dev.kind == DeviceKind::kCUDA) {
    const int count = cuda::device_count();
    if (dev.index < 0 || dev.index >= count) {
      fail(fn, "partial_out",
           count > 0 ? "a tensor on cpu or cuda:0..cuda:" + std::to_string(count - 1)
                     : std::string("a tensor on cpu (no CUDA device is present)"),
           "a tensor on " + to_string(dev));
    }
  } else if (dev != Device::cpu()) {
    fail(fn, "partial_out", "a tensor on cpu or cuda:N", "a tensor on " + to_string(dev));
  }

  expect_tensor(fn, "partial_out", a.partial_out, dev, cpu_only, {DType::kFP32}, "", 5,
                "[num_splits, batch, q_len, num_heads, dim_v]");
  const TensorView& po = a.partial_out;
  // A bound on the splits keeps a stride-0 view of 2^31 splits from running for hours; split-KV
  // runs use at most a few per SM.
  expect_dim_range(fn, "partial_out", po, 0, "num_splits", 1, kMaxCombineSplits,
                   "at least one split, at most 65536");
  expect_dim_range(fn, "partial_out", po, 4, "dim_v", 1, INT32_MAX, "at least one value dim");

  expect_tensor(fn, "partial_lse", a.partial_lse, dev, cpu_only, {DType::kFP32}, "", 4,
                "[num_splits, batch, q_len, num_heads]");
  const char* dims[] = {"num_splits", "batch", "q_len", "num_heads"};
  for (int d = 0; d < 4; ++d) {
    expect_dim(fn, "partial_lse", a.partial_lse, d, dims[d], po.shape[d],
               ("partial_out's " + std::string(dims[d])).c_str());
  }
  const bool sink = a.attn_sink.defined();
  if (sink) {
    expect_tensor(fn, "attn_sink", a.attn_sink, dev, cpu_only, {DType::kFP32}, "", 1,
                  "[num_heads]");
    expect_dim(fn, "attn_sink", a.attn_sink, 0, "num_heads", po.shape[3],
               "partial_out's num_heads");
  }

  expect_tensor(fn, "out", a.out, dev, cpu_only, {DType::kBF16, DType::kFP16, DType::kFP32}, "", 4,
                "[batch, q_len, num_heads, dim_v]");
  const char* out_dims[] = {"batch", "q_len", "num_heads", "dim_v"};
  for (int d = 0; d < 4; ++d) {
    expect_dim(fn, "out", a.out, d, out_dims[d], po.shape[d + 1],
               ("partial_out's " + std::string(out_dims[d])).c_str());
  }
  expect_no_overlap(fn, "out", a.out);

  const bool lse = a.lse.defined();
  if (lse) {
    expect_tensor(fn, "lse", a.lse, dev, cpu_only, {DType::kFP32}, "", 3,
                  "[batch, q_len, num_heads]");
    for (int d = 0; d < 3; ++d) {
      expect_dim(fn, "lse", a.lse, d, out_dims[d], po.shape[d + 1],
                 ("partial_out's " + std::string(out_dims[d])).c_str());
    }
    expect_no_overlap(fn, "lse", a.lse);
  }

  expect_disjoint(fn, {{"out", &a.out}, {"lse", &a.lse}},
                  {{"partial_out", &a.partial_out},
                   {"partial_lse", &a.partial_lse},
                   {"attn_sink", &a.attn_sink}});

  CombineParams p{};
  p.num_splits = static_cast<int>(po.shape[0]);
  p.batch = static_cast<int>(po.shape[1]);
  p.q_len = static_cast<int>(po.shape[2]);
  p.num_heads = static_cast<int>(po.shape[3]);
  p.dim_v = static_cast<int>(po.shape[4]);
  p.out_dtype = static_cast<int>(a.out.dtype);
  p.partial_out = static_cast<const float*>(po.data);
  p.po_stride_split = po.stride[0];
  p.po_stride_batch = po.stride[1];
  p.po_stride_token = po.stride[2];
  p.po_stride_head = po.stride[3];
  p.partial_lse = static_cast<const float*>(a.partial_lse.data);
  p.pl_stride_split = a.partial_lse.stride[0];
  p.pl_stride_batch = a.partial_lse.stride[1];
  p.pl_stride_token = a.partial_lse.stride[2];
  p.pl_stride_head = a.partial_lse.stride[3];
  if (sink) p.attn_sink = static_cast<const float*>(a.attn_sink.data);
  fill_out_lse(p, a.out, a.lse, lse);
  if (a.out.numel() == 0) return;
  if (dev.kind == DeviceKind::kCUDA) {
    cuda::combine(p, dev.index, a.stream);
    return;
  }
  cpu::combine(p);
}

}  // namespace deca
