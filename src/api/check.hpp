// Argument checks shared by every entry point in src/api/. Each check throws a deca::Error whose
// message reads "<fn>: <argument>: expected <what>, got <what came>", so that a caller can fix
// the call from the message alone. All checks only read metadata (and, where a caller asks,
// host memory); none writes anything, so running them all before dispatch keeps the promise that
// a rejected call leaves every output untouched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "deca/tensor.hpp"

namespace deca::api {

// Bytes every row start of a tensor that a GPU kernel loads as 16-byte vectors must be aligned
// to. The CPU path applies the same rule so that a call valid on one backend is valid on both.
inline constexpr std::size_t kRowAlignBytes = 16;

[[noreturn]] void fail(std::string_view fn, std::string_view arg, std::string_view expected,
                       std::string_view got);

// A compute capability to compile for ahead of time (precompile_*_decode): 8.0 or later (the
// kernels need mma.sync and cp.async) and one this NVRTC targets.
void expect_compile_capability(std::string_view fn, int cc);

std::string shape_string(const TensorView& t);
// Shortest readable form of a float for messages: "0.5", "nan", "inf".
std::string float_string(double value);

// A tensor must be given (defined) and its data pointer non-null unless it holds no element.
void expect_present(std::string_view fn, std::string_view arg, const TensorView& t,
                    std::string_view why);
// Optional tensors: present exactly when the plan's feature flag says so.
void expect_presence(std::string_view fn, std::string_view arg, const TensorView& t, bool wanted,
                     std::string_view flag);

void expect_device(std::string_view fn, std::string_view arg, const TensorView& t, Device device,
                   std::string_view why);
void expect_dtype(std::string_view fn, std::string_view arg, const TensorView& t, DType dtype,
                  std::string_view why);
void expect_dtype_in(std::string_view fn, std::string_view arg, const TensorView& t,
                     std::initializer_list<DType> allowed, std::string_view why);
// `dims` names the dimensions, e.g. "[batch, q_len, num_q_heads, head_dim]".
void expect_rank(std::string_view fn, std::string_view arg, const TensorView& t, int rank,
                 std::string_view dims);
// Sizes: non-negative and small enough for the int fields of the params structs, and an element
// count that fits 64 bits (six dims of 2^31 do not).
void expect_sizes(std::string_view fn, std::string_view arg, const TensorView& t);
void expect_dim_checked(std::string_view fn, std::string_view arg, const TensorView& t, int dim,
                        std::string_view dim_name, std::int64_t expected, std::string_view why);
void expect_dim_range_checked(std::string_view fn, std::string_view arg, const TensorView& t,
                              int dim, std::string_view dim_name, std::int64_t lo,
                              std::int64_t hi, std::string_view why);

// The checks a decode call makes per argument (a few dozen per call) are inline: the test is a
// compare, and the out-of-line *_checked function, which repeats it and builds the message, runs
// only when it fails. Per call that is host time in every layer of every decode step.
inline void expect_dim(std::string_view fn, std::string_view arg, const TensorView& t, int dim,
                       std::string_view dim_name, std::int64_t expected, std::string_view why) {
  if (t.shape[dim] != expected) [[unlikely]] {
    expect_dim_checked(fn, arg, t, dim, dim_name, expected, why);
  }
}
inline void expect_dim_range(std::string_view fn, std::string_view arg, const TensorView& t,
                             int dim, std::string_view dim_name, std::int64_t lo, std::int64_t hi,
                             std::string_view why) {
  if (t.shape[dim] < lo || t.shape[dim] > hi) [[unlikely]] {
    expect_dim_range_checked(fn, arg, t, dim, dim_name, lo, hi, why);
  }
}

// Strides non-negative: deca walks every view forwards (docs/semantics.md, "Errors").
void expect_non_negative_strides(std::string_view fn, std::string_view arg, const TensorView& t);
// Strides non-negative; the last dimension contiguous (stride 1) when it has more than one
// element: the params structs carry no stride for it.
void expect_strides(std::string_view fn, std::string_view arg, const TensorView& t);
// An output must not map two indices onto one element (the result would depend on write order).
void expect_no_overlap(std::string_view fn, std::string_view arg, const TensorView& t);
// The bytes a view can touch, [first, last] inclusive, from its pointer, shape, strides and element
// size: what the overlap rule compares. `empty` views (no element) touch nothing.
struct ByteSpan {
  std::uintptr_t first = 0;
  std::uintptr_t last = 0;
  bool empty = true;
};
// Refuses a view whose byte extent overflows 64 bits or wraps the address space: every later
// offset computation (the reference's and the kernels') may then assume it does not.
ByteSpan expect_byte_span(std::string_view fn, std::string_view arg, const TensorView& t);

// A tensor argument by the name the caller gave it; absent and empty views are skipped.
struct NamedView {
  std::string_view name;
  const TensorView* view;
};
// The overlap rule of every op, checked before anything runs: no output shares a byte with any
// input, nor with another output. Byte spans are compared, not elements: views whose spans
// intersect are refused even where their elements would interleave without touching (no op
// needs such layouts, and an exact test would cost a walk over both views). Inputs may overlap
// each other freely (K and V as views of one allocation).
void expect_disjoint(std::string_view fn, std::initializer_list<NamedView> outputs,
                     std::initializer_list<NamedView> inputs);

// Data pointer and the byte stride of every dimension but the last are multiples of `bytes`.
void expect_aligned(std::string_view fn, std::string_view arg, const TensorView& t,
                    std::size_t bytes, std::string_view why);

// The checks every tensor argument gets, in this order: presence (non-null data), device, dtype,
// rank, sizes, strides, byte extent, element-size alignment.
void expect_tensor_checked(std::string_view fn, std::string_view arg, const TensorView& t,
                           Device device, std::string_view device_why,
                           std::initializer_list<DType> dtypes, std::string_view dtype_why,
                           int rank, std::string_view dims);

// True only where every check of expect_tensor_checked passes (the converse need not hold: a
// false sends the tensor through those checks, which decide). One pass over the dims instead of
// eight calls; check_test.cpp runs both on the same views.
bool tensor_passes_fast(const TensorView& t, Device device, std::initializer_list<DType> dtypes,
                        int rank);

inline void expect_tensor(std::string_view fn, std::string_view arg, const TensorView& t,
                          Device device, std::string_view device_why,
                          std::initializer_list<DType> dtypes, std::string_view dtype_why,
                          int rank, std::string_view dims) {
  if (!tensor_passes_fast(t, device, dtypes, rank)) [[unlikely]] {
    expect_tensor_checked(fn, arg, t, device, device_why, dtypes, dtype_why, rank, dims);
  }
}

// Every value of a 1-D fp32 host tensor finite: per-head scales, like the scalar ones they replace.
void expect_finite_host(std::string_view fn, std::string_view arg, const TensorView& t);

// Whole host tensors of int32: value at a flat index, for data checks on CPU tensors.
inline std::int32_t load_i32(const TensorView& t, std::int64_t i0, std::int64_t i1 = 0,
                             std::int64_t i2 = 0) {
  const auto* base = static_cast<const std::int32_t*>(t.data);
  std::int64_t off = i0 * t.stride[0];
  if (t.rank > 1) off += i1 * t.stride[1];
  if (t.rank > 2) off += i2 * t.stride[2];
  return base[off];
}

}  // namespace deca::api
