#include "api/gqa_fused.hpp"

#include <cstdint>
#include <string>

#include "api/check.hpp"
#include "deca/error.hpp"

namespace deca::api {

namespace {

constexpr const char* kFn = "gqa_decode";
constexpr const char* kOnDevice = "plan.config.device";
constexpr const char* kFlag = "plan.config.rope_style != kNone";

std::string s(std::int64_t v) { return std::to_string(v); }

// k_new / v_new: [batch, q_len, num_kv_heads, head_dim] in q's dtype.
void check_new_tokens(const GqaConfig& c, const char* name, const TensorView& t, const TensorView& q) {
  expect_tensor(kFn, name, t, c.device, kOnDevice, {c.q_dtype}, "plan.config.q_dtype", 4,
                "[batch, q_len, num_kv_heads, head_dim]");
  expect_dim(kFn, name, t, 0, "batch", q.shape[0], "q's batch");
  expect_dim(kFn, name, t, 1, "q_len", q.shape[1], "q's q_len");
  expect_dim(kFn, name, t, 2, "num_kv_heads", c.num_kv_heads, "plan.config.num_kv_heads");
  expect_dim(kFn, name, t, 3, "head_dim", c.head_dim, "plan.config.head_dim");
  // The kernels read pairs of elements: rows start 4-byte aligned.
  expect_aligned(kFn, name, t, 4, "rows 4-byte aligned: the kernels read element pairs");
}

// CPU: every position the rotation reads is a row of cos_sin_cache.
void check_host_positions(const GqaDecodeArgs& a) {
  const std::int64_t batch = a.q.shape[0];
  const std::int64_t q_len = a.q.shape[1];
  const std::int64_t max_position = a.cos_sin_cache.shape[0];
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = load_i32(a.seq_lens, b);
    if (len == 0) continue;  // an empty request rotates and writes nothing
    for (std::int64_t i = 0; i < q_len; ++i) {
      const std::int64_t pos = a.positions.defined() ? load_i32(a.positions, b, i) : len - q_len + i;
      if (pos < 0 || pos >= max_position) {
        const std::string where = a.positions.defined()
                                      ? "positions[" + s(b) + "][" + s(i) + "]"
                                      : "seq_lens[" + s(b) + "] - q_len + " + s(i) + " (the position of new token " +
                                            s(i) + ")";
        fail(kFn, where, "a position in [0, " + s(max_position) + ") (cos_sin_cache's rows)", s(pos));
      }
    }
  }
}

}  // namespace

void validate_rope_config(std::string_view fn, std::string_view prefix, const GqaConfig& c) {
  const std::string pre(prefix);
  if (c.rope_style != RopeStyle::kNone && c.rope_style != RopeStyle::kNeox &&
      c.rope_style != RopeStyle::kGptj) {
    fail(fn, pre + ".rope_style", "RopeStyle::kNone, kNeox or kGptj",
         "value " + std::to_string(static_cast<int>(c.rope_style)));
  }
  if (!is_fused(c)) {
    if (c.rotary_dim != 0) {
      fail(fn, pre + ".rotary_dim", "0 without a rope_style (a plain decode rotates nothing)",
           std::to_string(c.rotary_dim));
    }
    return;
  }
  const int rd = rotary_dims(c);
  if (c.rotary_dim < 0 || rd % 16 != 0 || rd > c.head_dim) {
    fail(fn, pre + ".rotary_dim",
         "a multiple of 16 in 16..head_dim (" + std::to_string(c.head_dim) + "), or 0 = head_dim",
         std::to_string(c.rotary_dim));
  }
}

void check_fused_args(const GqaPlan& plan, const GqaDecodeArgs& a, const TensorView& workspace) {
  const GqaConfig& c = plan.config;
  const bool fused = is_fused(c);
  expect_presence(kFn, "k_new", a.k_new, fused, kFlag);
  expect_presence(kFn, "v_new", a.v_new, fused, kFlag);
  expect_presence(kFn, "cos_sin_cache", a.cos_sin_cache, fused, kFlag);
  if (!fused) {
    expect_presence(kFn, "positions", a.positions, false, kFlag);
    return;
  }
  check_new_tokens(c, "k_new", a.k_new, a.q);
  check_new_tokens(c, "v_new", a.v_new, a.q);
  const int rd = rotary_dims(c);
  expect_tensor(kFn, "cos_sin_cache", a.cos_sin_cache, c.device, kOnDevice,
                {DType::kFP32, DType::kBF16, DType::kFP16}, "", 2, "[max_position, rotary_dim]");
  expect_dim_range(kFn, "cos_sin_cache", a.cos_sin_cache, 0, "max_position", 1, INT32_MAX, "");
  expect_dim(kFn, "cos_sin_cache", a.cos_sin_cache, 1, "rotary_dim", rd,
             "plan.config.rotary_dim (0 = head_dim): cos of rotary_dim / 2 frequencies, then sin");
  if (a.cos_sin_cache.shape[0] > 0 && a.cos_sin_cache.stride[1] != 1) {
    fail(kFn, "cos_sin_cache: stride of dim 1", "1 (rows contiguous)", s(a.cos_sin_cache.stride[1]));
  }
  if (a.positions.defined()) {
    expect_tensor(kFn, "positions", a.positions, c.device, kOnDevice, {DType::kINT32},
                  "(int32; convert int64 positions first)", 2, "[batch, q_len]");
    expect_dim(kFn, "positions", a.positions, 0, "batch", a.q.shape[0], "q's batch");
    expect_dim(kFn, "positions", a.positions, 1, "q_len", a.q.shape[1], "q's q_len");
    if (a.q.shape[1] > 1 && a.positions.stride[1] != 1) {
      fail(kFn, "positions: stride of dim 1", "1 (each request's positions contiguous)",
           s(a.positions.stride[1]));
    }
  }
  // The caches are written: neither may share a byte with an input (they may with each other: K
  // and V as views of one allocation, their slots disjoint).
  const std::initializer_list<NamedView> inputs = {
      {"q", &a.q},           {"k_new", &a.k_new},         {"v_new", &a.v_new},
      {"cos_sin_cache", &a.cos_sin_cache}, {"positions", &a.positions}, {"page_table", &a.page_table},
      {"seq_lens", &a.seq_lens}, {"tree_mask", &a.tree_mask}, {"sinks", &a.sinks},
      {"k_scales", &a.k_scales}, {"v_scales", &a.v_scales}};
  expect_disjoint(kFn, {{"k_cache", &a.k_cache}}, inputs);
  expect_disjoint(kFn, {{"v_cache", &a.v_cache}}, inputs);
  expect_disjoint(kFn, {{"out", &a.out}, {"lse", &a.lse}, {"workspace", &workspace}},
                  {{"k_new", &a.k_new}, {"v_new", &a.v_new}, {"cos_sin_cache", &a.cos_sin_cache},
                   {"positions", &a.positions}});
}

void check_fused_host_data(const GqaConfig& c, const GqaDecodeArgs& a) {
  if (is_fused(c) && c.device.kind == DeviceKind::kCPU) check_host_positions(a);
}

void fill_fused_params(GqaParams& p, const GqaConfig& c, const GqaDecodeArgs& a) {
  if (!is_fused(c)) return;
  p.rope_style = static_cast<int>(c.rope_style);
  p.rotary_dim = rotary_dims(c);
  p.k_new = a.k_new.data;
  p.k_new_stride_batch = a.k_new.stride[0];
  p.k_new_stride_token = a.k_new.stride[1];
  p.k_new_stride_head = a.k_new.stride[2];
  p.v_new = a.v_new.data;
  p.v_new_stride_batch = a.v_new.stride[0];
  p.v_new_stride_token = a.v_new.stride[1];
  p.v_new_stride_head = a.v_new.stride[2];
  p.cos_sin = a.cos_sin_cache.data;
  p.cos_sin_stride = a.cos_sin_cache.stride[0];
  p.cos_sin_dtype = static_cast<int>(a.cos_sin_cache.dtype);
  p.max_position = static_cast<int>(a.cos_sin_cache.shape[0]);
  if (a.positions.defined()) {
    p.positions = static_cast<const int*>(a.positions.data);
    p.positions_stride_batch = a.positions.stride[0];
  }
}

}  // namespace deca::api
