#include "api/check.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "deca/error.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca::api {

namespace {

// A tensor without elements is never read or written: its strides and pointer cannot matter.
bool has_no_elements(const TensorView& t) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return true;
  }
  return false;
}

std::string cat(std::string_view a, std::string_view b = {}, std::string_view c = {}) {
  std::string s(a);
  s += b;
  s += c;
  return s;
}

std::string with_why(std::string_view expected, std::string_view why) {
  if (why.empty()) return std::string(expected);
  return cat(expected, " (", cat(why, ")"));
}

std::string pointer_string(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string list_string(const std::vector<int>& values) {
  std::string s;
  for (int v : values) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

}  // namespace

void expect_compile_capability(std::string_view fn, int cc) {
  std::vector<int> archs = jit::nvrtc_supported_archs();
  archs.erase(std::remove_if(archs.begin(), archs.end(), [](int a) { return a < 80; }), archs.end());
  const bool known = archs.empty() || std::find(archs.begin(), archs.end(), cc) != archs.end();
  if (cc < 80 || !known) {
    fail(fn, "compute_capability",
         archs.empty() ? std::string("0 (the device's) or >= 80")
                       : "0 (the device's) or one this NVRTC targets: " + list_string(archs),
         std::to_string(cc));
  }
}

void fail(std::string_view fn, std::string_view arg, std::string_view expected,
          std::string_view got) {
  std::string msg(fn);
  msg += ": ";
  msg += arg;
  msg += ": expected ";
  msg += expected;
  msg += ", got ";
  msg += got;
  throw Error(msg);
}

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  s += "]";
  return s;
}

// std::to_chars, not an ostream: a module that links libstdc++ statically may run before (or
// without) iostream's locale set-up, and then `<<` drops digits or crashes (issue 6).
std::string float_string(double value) {
  // Whole numbers print every digit (sizes and counts pass through here); others take the
  // shortest form that reads back to the same value ("0.5", "1e+30", "nan", "-inf"), as a float
  // when it is one (a float argument 0.1f prints "0.1", not its 17-digit double expansion).
  char buf[64];
  std::to_chars_result r;
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 1e15) {
    r = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed);
  } else if (std::isfinite(value) && static_cast<double>(static_cast<float>(value)) == value) {
    r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(value));
  } else {
    r = std::to_chars(buf, buf + sizeof buf, value);
  }
  return std::string(buf, r.ptr);
}

void expect_present(std::string_view fn, std::string_view arg, const TensorView& t,
                    std::string_view why) {
  if (!t.defined()) fail(fn, arg, with_why("a tensor", why), "absent");
  // numel() is only meaningful once sizes are known to be non-negative; a negative size is
  // reported by expect_sizes, so only a positive element count demands a pointer here.
  bool has_elements = true;
  for (int i = 0; i < t.rank; ++i) has_elements = has_elements && t.shape[i] > 0;
  if (t.data == nullptr && has_elements) {
    fail(fn, arg, cat("a non-null data pointer for ", t.describe()), "nullptr");
  }
}

void expect_presence(std::string_view fn, std::string_view arg, const TensorView& t, bool wanted,
                     std::string_view flag) {
  if (wanted) {
    expect_present(fn, arg, t, cat(flag, " is true"));
  } else if (t.defined()) {
    fail(fn, arg, cat("absent (", flag, " is false)"), t.describe());
  }
}

void expect_device(std::string_view fn, std::string_view arg, const TensorView& t, Device device,
                   std::string_view why) {
  if (t.device != device) {
    fail(fn, arg, with_why(cat("device ", to_string(device)), why), to_string(t.device));
  }
}

void expect_dtype(std::string_view fn, std::string_view arg, const TensorView& t, DType dtype,
                  std::string_view why) {
  if (t.dtype != dtype) {
    fail(fn, arg, with_why(cat("dtype ", dtype_name(dtype)), why), dtype_name(t.dtype));
  }
}

void expect_dtype_in(std::string_view fn, std::string_view arg, const TensorView& t,
                     std::initializer_list<DType> allowed, std::string_view why) {
  std::string names;
  for (DType d : allowed) {
    if (d == t.dtype) return;
    names += names.empty() ? "" : " | ";
    names += dtype_name(d);
  }
  fail(fn, arg, with_why(cat("dtype ", names), why), dtype_name(t.dtype));
}

void expect_rank(std::string_view fn, std::string_view arg, const TensorView& t, int rank,
                 std::string_view dims) {
  if (t.rank != rank) {
    fail(fn, arg, cat("rank ", std::to_string(rank), cat(" ", dims)),
         cat("rank ", std::to_string(t.rank), cat(" ", shape_string(t))));
  }
}

void expect_sizes(std::string_view fn, std::string_view arg, const TensorView& t) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > INT_MAX) {
      fail(fn, arg, cat("dim ", std::to_string(i), " size in 0..2147483647"),
           cat(std::to_string(t.shape[i]), " (shape ", cat(shape_string(t), ")")));
    }
  }
  if (has_no_elements(t)) return;
  std::int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) {
    if (__builtin_mul_overflow(n, t.shape[i], &n)) {
      fail(fn, arg, "an element count below 2^63", cat("shape ", shape_string(t)));
    }
  }
}

void expect_dim_checked(std::string_view fn, std::string_view arg, const TensorView& t, int dim,
                        std::string_view dim_name, std::int64_t expected, std::string_view why) {
  if (t.shape[dim] != expected) {
    std::string where = cat(arg, ": dim ", std::to_string(dim));
    where = cat(where, " (", cat(dim_name, ")"));
    fail(fn, where, with_why(std::to_string(expected), why), std::to_string(t.shape[dim]));
  }
}

void expect_dim_range_checked(std::string_view fn, std::string_view arg, const TensorView& t,
                              int dim, std::string_view dim_name, std::int64_t lo,
                              std::int64_t hi, std::string_view why) {
  if (t.shape[dim] < lo || t.shape[dim] > hi) {
    std::string where = cat(arg, ": dim ", std::to_string(dim));
    where = cat(where, " (", cat(dim_name, ")"));
    fail(fn, where, with_why(cat(std::to_string(lo), "..", std::to_string(hi)), why),
         std::to_string(t.shape[dim]));
  }
}

void expect_non_negative_strides(std::string_view fn, std::string_view arg, const TensorView& t) {
  // numpy 2 gives empty arrays zero strides; an empty view is never walked, so any strides do.
  if (has_no_elements(t)) return;
  for (int i = 0; i < t.rank; ++i) {
    if (t.stride[i] < 0) {
      fail(fn, arg, cat("a non-negative stride for dim ", std::to_string(i)),
           cat("stride ", std::to_string(t.stride[i])));
    }
  }
}

void expect_strides(std::string_view fn, std::string_view arg, const TensorView& t) {
  if (has_no_elements(t)) return;
  expect_non_negative_strides(fn, arg, t);
  const int last = t.rank - 1;
  if (t.rank > 0 && t.shape[last] > 1 && t.stride[last] != 1) {
    fail(fn, arg, cat("the last dim (", std::to_string(last), ") contiguous, stride 1"),
         cat("stride ", std::to_string(t.stride[last])));
  }
}

void expect_no_overlap(std::string_view fn, std::string_view arg, const TensorView& t) {
  if (has_no_elements(t)) return;
  // Sufficient condition: ordering the dims of size > 1 by stride, each stride exceeds the
  // furthest element reachable through the smaller ones.
  std::array<int, kMaxRank> order{};
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1) order[n++] = i;
  }
  // Insertion sort: at most kMaxRank dims.
  for (int i = 1; i < n; ++i) {
    for (int j = i; j > 0 && t.stride[order[j]] < t.stride[order[j - 1]]; --j) {
      std::swap(order[j], order[j - 1]);
    }
  }
  std::int64_t reach = 0;  // largest offset reachable through the dims seen so far
  for (int k = 0; k < n; ++k) {
    const int d = order[k];
    if (t.stride[d] <= reach) {
      fail(fn, arg, "strides that map every index to its own element (an output must not overlap)",
           cat("shape ", shape_string(t),
               cat(", stride ", std::to_string(t.stride[d]), cat(" of dim ", std::to_string(d)))));
    }
    reach += (t.shape[d] - 1) * t.stride[d];
  }
}

ByteSpan expect_byte_span(std::string_view fn, std::string_view arg, const TensorView& t) {
  ByteSpan span;
  if (!t.defined() || has_no_elements(t)) return span;
  const auto too_large = [&] {
    fail(fn, arg, "a byte extent (sum of (size - 1) * |stride| * element size) below 2^63",
         cat("shape ", shape_string(t), cat(", element size ", std::to_string(dtype_size(t.dtype)))));
  };
  std::int64_t low = 0, high = 0;  // element offsets of the lowest and highest element
  for (int i = 0; i < t.rank; ++i) {
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &reach)) too_large();
    if (__builtin_add_overflow(reach < 0 ? low : high, reach, reach < 0 ? &low : &high)) too_large();
  }
  const auto elem = static_cast<std::int64_t>(dtype_size(t.dtype));
  std::int64_t low_bytes = 0, high_bytes = 0;
  if (__builtin_mul_overflow(low, elem, &low_bytes)) too_large();
  if (__builtin_mul_overflow(high, elem, &high_bytes)) too_large();
  if (__builtin_add_overflow(high_bytes, elem - 1, &high_bytes)) too_large();
  const auto base = reinterpret_cast<std::uintptr_t>(t.data);
  // Unsigned arithmetic: a span that wraps around the address space is refused like an overflow.
  const std::uintptr_t below = static_cast<std::uintptr_t>(-low_bytes);
  const std::uintptr_t above = static_cast<std::uintptr_t>(high_bytes);
  if (below > base || above > UINTPTR_MAX - base) too_large();
  span.first = base - below;
  span.last = base + above;
  span.empty = false;
  return span;
}

void expect_disjoint(std::string_view fn, std::initializer_list<NamedView> outputs,
                     std::initializer_list<NamedView> inputs) {
  const auto span_text = [](const ByteSpan& s) {
    return cat("bytes [", pointer_string(reinterpret_cast<const void*>(s.first)),
               cat(", ", pointer_string(reinterpret_cast<const void*>(s.last)), "]"));
  };
  const auto against = [&](const NamedView& out, const ByteSpan& os, const NamedView& other,
                           const ByteSpan& s, const char* kind) {
    if (s.empty || s.last < os.first || os.last < s.first) return;
    fail(fn, out.name,
         cat("memory that shares no byte with ", other.name,
             cat(" (", kind, " must not overlap)")),
         cat(span_text(os), cat(" against ", other.name, cat("'s ", span_text(s)))));
  };
  // Every span once (a call has a dozen views; per pair it was the larger part of this check).
  constexpr std::size_t kMaxViews = 16;
  if (inputs.size() > kMaxViews || outputs.size() > kMaxViews) {
    fail(fn, "expect_disjoint", "at most 16 inputs and 16 outputs (an internal limit)",
         cat(std::to_string(inputs.size()), " inputs, ",
             cat(std::to_string(outputs.size()), " outputs")));
  }
  std::array<ByteSpan, kMaxViews> out_spans{}, in_spans{};
  bool any_output = false;
  std::size_t i = 0;
  for (const NamedView& o : outputs) {
    out_spans[i] = expect_byte_span(fn, o.name, *o.view);
    any_output = any_output || !out_spans[i].empty;
    ++i;
  }
  if (!any_output) return;
  i = 0;
  for (const NamedView& in : inputs) in_spans[i++] = expect_byte_span(fn, in.name, *in.view);
  std::size_t k = 0;
  for (auto o = outputs.begin(); o != outputs.end(); ++o, ++k) {
    const ByteSpan& os = out_spans[k];
    if (os.empty) continue;
    i = 0;
    for (const NamedView& in : inputs) against(*o, os, in, in_spans[i++], "an output and an input");
    i = 0;
    for (auto p = outputs.begin(); p != o; ++p) against(*o, os, *p, out_spans[i++], "two outputs");
  }
}

void expect_aligned(std::string_view fn, std::string_view arg, const TensorView& t,
                    std::size_t bytes, std::string_view why) {
  if (has_no_elements(t)) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  if (addr % bytes != 0) {
    fail(fn, arg, with_why(cat("a data pointer aligned to ", std::to_string(bytes), " bytes"), why),
         cat(pointer_string(t.data), " (", cat(std::to_string(addr % bytes), " bytes past)")));
  }
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(t.dtype));
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;  // a stride never taken cannot misalign anything
    const std::int64_t stride_bytes = t.stride[i] * elem;
    if (stride_bytes % static_cast<std::int64_t>(bytes) != 0) {
      fail(fn, arg,
           with_why(cat("the stride of dim ", std::to_string(i),
                        cat(" a multiple of ", std::to_string(bytes), " bytes")),
                    why),
           cat(std::to_string(stride_bytes), " bytes (",
               cat(std::to_string(t.stride[i]), " elements)")));
    }
  }
}

bool tensor_passes_fast(const TensorView& t, Device device, std::initializer_list<DType> dtypes,
                        int rank) {
  if (t.rank != rank || rank < 1 || rank > kMaxRank || t.device != device) return false;
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == t.dtype;
  if (!dtype_ok) return false;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > INT_MAX) return false;
    empty = empty || t.shape[i] == 0;
  }
  // No element: presence, strides, extent and alignment have nothing to check (as above).
  if (empty) return true;
  if (t.data == nullptr) return false;
  if (t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1) return false;
  const auto elem = static_cast<std::int64_t>(dtype_size(t.dtype));
  if (reinterpret_cast<std::uintptr_t>(t.data) % static_cast<std::uintptr_t>(elem) != 0) {
    return false;
  }
  // Sizes below 2^31 and strides below 2^31 keep every product below 2^62: a view with a larger
  // stride goes through the exact overflow checks.
  std::int64_t count = 1, high = 0;
  for (int i = 0; i < rank; ++i) {
    if (t.stride[i] < 0 || t.stride[i] > INT_MAX) return false;
    if (__builtin_mul_overflow(count, t.shape[i], &count)) return false;
    if (__builtin_add_overflow(high, (t.shape[i] - 1) * t.stride[i], &high)) return false;
  }
  std::int64_t high_bytes = 0;
  if (__builtin_mul_overflow(high, elem, &high_bytes)) return false;
  if (__builtin_add_overflow(high_bytes, elem - 1, &high_bytes)) return false;
  return static_cast<std::uintptr_t>(high_bytes) <=
         UINTPTR_MAX - reinterpret_cast<std::uintptr_t>(t.data);
}

void expect_tensor_checked(std::string_view fn, std::string_view arg, const TensorView& t,
                           Device device, std::string_view device_why,
                           std::initializer_list<DType> dtypes, std::string_view dtype_why,
                           int rank, std::string_view dims) {
  expect_present(fn, arg, t, dims);
  expect_device(fn, arg, t, device, device_why);
  expect_dtype_in(fn, arg, t, dtypes, dtype_why);
  expect_rank(fn, arg, t, rank, dims);
  expect_sizes(fn, arg, t);
  expect_strides(fn, arg, t);
  expect_byte_span(fn, arg, t);
  expect_aligned(fn, arg, t, dtype_size(t.dtype), "the element size");
}

void expect_finite_host(std::string_view fn, std::string_view arg, const TensorView& t) {
  const auto* base = static_cast<const float*>(t.data);
  for (std::int64_t i = 0; i < t.shape[0]; ++i) {
    const float v = base[i * t.stride[0]];
    if (!std::isfinite(v)) {
      fail(fn, cat(arg, "[", cat(std::to_string(i), "]")), "a finite value", float_string(v));
    }
  }
}

}  // namespace deca::api
