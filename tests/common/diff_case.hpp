// The differential test's case interface (tests/gpu/differential_test.cpp runs every op on the GPU
// and on the CPU reference and compares them; tests/cpu/differential_draw_test.cpp keeps the
// generator honest without a GPU). A case owns host tensors and the views an op call takes into
// them; a runner moves the views to the memory of a side (the CPU: as they are; the GPU: mirrored
// buffers), poisons every output buffer with NaN, lets the case plan and call the op there, and
// compares what each side wrote.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensor.hpp"
#include "deca/tensor.hpp"

namespace deca::test::diff {

// One op family each; a family is a case type (tests/common/diff_gqa.hpp, diff_mla.hpp) and a
// share of the draws (diff_draw.hpp).
enum class Family : int { kGqa = 0, kMlaSparse, kMlaDense, kCombine, kCount };

inline const char* family_name(Family f) {
  switch (f) {
    case Family::kGqa: return "gqa";
    case Family::kMlaSparse: return "mla_sparse";
    case Family::kMlaDense: return "mla_dense";
    case Family::kCombine: return "combine";
    default: return "?";
  }
}

// ---- drawing ------------------------------------------------------------------------------------

using Rng = std::mt19937_64;

inline int uniform(Rng& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
inline double uniform_real(Rng& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}
inline bool chance(Rng& rng, double p) {
  return std::uniform_real_distribution<double>(0, 1)(rng) < p;
}
// An integer in [lo, hi] (lo >= 1) whose logarithm is uniform: small and large sizes alike.
inline int log_uniform(Rng& rng, int lo, int hi) {
  const double x = std::exp(uniform_real(rng, std::log(lo), std::log(hi + 1.0)));
  return std::clamp(static_cast<int>(x), lo, hi);
}
template <class T>
T pick(Rng& rng, std::initializer_list<T> values) {
  return *(values.begin() + uniform(rng, 0, static_cast<int>(values.size()) - 1));
}
// With probability p one of the edge values (boundaries of kernel tiles and head blocks), else
// any value in [lo, hi].
inline int edge_or_uniform(Rng& rng, double p, std::initializer_list<int> edges, int lo, int hi) {
  return chance(rng, p) ? pick(rng, edges) : uniform(rng, lo, hi);
}

// ---- strided views ------------------------------------------------------------------------------

// A contiguous [.., rows, dim] tensor copied into rows of dim + pad elements (pad bytes 0xFF).
inline HostTensor padded_copy(const HostTensor& t, int pad) {
  std::vector<std::int64_t> shape = t.shape();
  const std::int64_t dim = shape.back();
  shape.back() = dim + pad;
  HostTensor p(t.dtype(), shape);
  p.fill_bytes(0xFF);
  const std::size_t e = dtype_size(t.dtype());
  const std::int64_t rows = dim > 0 ? t.numel() / dim : 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(p.raw()) + r * (dim + pad) * e,
                static_cast<const char*>(t.raw()) + r * dim * e, dim * e);
  }
  return p;
}

// A view of rows of `dim` elements in `t`, whose last dim holds dim + pad.
inline TensorView padded_view(const HostTensor& t, int pad) {
  std::vector<std::int64_t> shape = t.shape(), stride(shape.size());
  std::int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) stride[i] = s, s *= shape[i];
  shape.back() -= pad;
  return make_tensor(const_cast<void*>(t.raw()), t.dtype(), static_cast<int>(shape.size()),
                     shape.data(), stride.data());
}

// ---- running ------------------------------------------------------------------------------------

// Where a case runs: the plan's device, how a view into the case's host tensors becomes a view of
// that side's memory, device memory for a workspace (the same buffer for every call of a case,
// zeroed once when first given), and the stream. `workspace_short` passes that many bytes fewer
// than the plan asks for (a call that must be refused).
struct Side {
  Device device = Device::cpu();
  std::function<TensorView(const TensorView&)> move = [](const TensorView& v) { return v; };
  std::function<void*(std::size_t)> workspace = [](std::size_t) { return nullptr; };
  void* stream = nullptr;
  std::size_t workspace_short = 0;
  bool gpu() const { return device.kind == DeviceKind::kCUDA; }
};

// An output of a case: the host tensor that holds it (its every byte is poisoned before a run) and
// the view the op writes. Bytes of the tensor outside the view must keep their poison.
struct Output {
  const char* name;  // "out", "lse"
  HostTensor* storage;
  TensorView view;
  bool lse;
};

// Error bounds of a case: relative RMS of the whole output, of any one row (the last dim) and the
// largest absolute LSE difference.
struct Tolerance {
  double out_rel = 1e-2;
  double row_rel = 5e-2;
  double lse_abs = 2e-3;
};

class DiffCase {
 public:
  virtual ~DiffCase() = default;
  virtual Family family() const = 0;
  // One line with everything drawn: what a failure report prints.
  virtual std::string describe() const = 0;
  // Every host tensor a view of the call points into (inputs and outputs).
  virtual std::vector<HostTensor*> tensors() = 0;
  virtual std::vector<Output> outputs() = 0;
  // GPU runs per case: a second one checks what a first leaves behind (a reused workspace or
  // schedule): it must write bitwise what the first wrote.
  virtual int passes() const { return 1; }
  // Plans for side.device (or takes the plan keep_plan made for it), calls the op (pass 0 or 1)
  // with every view moved to the side and, on the GPU, reads a checked plan's record (which must
  // be clean: the data are valid). Returns the plan's kernel name. Throws deca::Error when a side
  // refuses the config or the call. Safe to call from several threads at once (each with its own
  // side's memory): it changes nothing in the case.
  virtual std::string run(const Side& side, int pass) = 0;
  // Makes the plan for `device` once; later runs there use that one plan object.
  virtual void keep_plan(Device) {}
  // The bounds for a GPU run of `kernel` against the reference.
  virtual Tolerance tolerance(const std::string& kernel) const = 0;
};

// ---- what the decode families' cases share -------------------------------------------------------

// "1,2,3": a case's lengths in its describe() line.
inline std::string joined(const std::vector<int>& values) {
  std::string s;
  for (int v : values) s += (s.empty() ? "" : ",") + std::to_string(v);
  return s;
}

// A case's tensors(): `tensors`, then those of `optional` that hold anything (padded copies,
// inputs a draw left out).
inline std::vector<HostTensor*> case_tensors(std::vector<HostTensor*> tensors,
                                             std::initializer_list<HostTensor*> optional) {
  for (HostTensor* t : optional) {
    if (!t->shape().empty()) tensors.push_back(t);
  }
  return tensors;
}

// A plan's config on `device` (a draw's config names none: each side sets its own).
template <class Config>
Config for_device(Config config, Device device) {
  config.device = device;
  return config;
}

// The plan a run on side.device uses: the one keep_plan made there, else one made now (into
// `made`) from `config` on that device.
template <class Plan, class Config, class Make>
const Plan& plan_for(const Side& side, const std::optional<Plan>& kept, const Config& config,
                     std::optional<Plan>& made, Make&& make) {
  if (kept && kept->config.device == side.device) return *kept;
  return made.emplace(make(for_device(config, side.device)));
}

// A call's views (those given) moved to the side, and the side's workspace for `plan` (short by
// side.workspace_short) and stream.
template <class Args, class Plan>
void to_side(const Side& side, const Plan& plan, Args& a, const std::vector<TensorView*>& views) {
  for (TensorView* v : views) {
    if (v->defined()) *v = side.move(*v);
  }
  a.workspace = plan.workspace_bytes ? side.workspace(plan.workspace_bytes) : nullptr;
  a.workspace_bytes = plan.workspace_bytes - std::min(plan.workspace_bytes, side.workspace_short);
  a.stream = side.stream;
}

// A decode's outputs: out (in its padded copy when the draw pads the rows) and, when asked for,
// the LSE.
inline std::vector<Output> decode_outputs(HostTensor& out, HostTensor& padded_out, bool padded,
                                          const TensorView& out_view, HostTensor& lse,
                                          const TensorView& lse_view, bool with_lse) {
  std::vector<Output> o = {{"out", padded ? &padded_out : &out, out_view, false}};
  if (with_lse) o.push_back({"lse", &lse, lse_view, true});
  return o;
}

// ---- comparing ----------------------------------------------------------------------------------

// Calls fn(element offset in `owner`, row number) for every element of `v`, a view into `owner`
// (the same offsets index any copy of it); rows are runs of the last dim.
template <class Fn>
void for_each_element(const TensorView& v, const HostTensor& owner, Fn&& fn) {
  const std::int64_t base =
      (static_cast<const char*>(v.data) - static_cast<const char*>(owner.raw())) /
      static_cast<std::int64_t>(dtype_size(v.dtype));
  std::int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) n *= v.shape[d];
  const std::int64_t row = v.rank > 0 ? v.shape[v.rank - 1] : 1;
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t rest = flat, off = base;
    for (int d = v.rank - 1; d >= 0; --d) {
      off += (rest % v.shape[d]) * v.stride[d];
      rest /= v.shape[d];
    }
    fn(off, row > 0 ? flat / row : 0);
  }
}

struct Mismatch {
  double out_rel = 0;  // relative RMS over every output element
  double row_rel = 0;  // worst row's relative RMS (a row the reference has as zeros: absolute)
  double lse_abs = 0;  // worst finite LSE difference
  long long nan = 0;   // NaN on the GPU side (unwritten or computed) where the reference has none
  long long ref_nan = 0;       // NaN in the reference: the CPU side left an element unwritten
  long long inf_mismatch = 0;  // an LSE infinite on one side only, or of the other sign
  long long zero_rows = 0;     // a row the reference has as zeros (no visible key) not zero here
  long long gap_writes = 0;    // bytes outside the view that lost their poison, either side
  bool within(const Tolerance& t) const {
    return nan == 0 && ref_nan == 0 && inf_mismatch == 0 && zero_rows == 0 && gap_writes == 0 &&
           out_rel <= t.out_rel && row_rel <= t.row_rel && lse_abs <= t.lse_abs;
  }
  std::string text() const {
    return "out_rel=" + std::to_string(out_rel) + " row_rel=" + std::to_string(row_rel) +
           " lse_abs=" + std::to_string(lse_abs) + " nan=" + std::to_string(nan) +
           " ref_nan=" + std::to_string(ref_nan) + " inf_mismatch=" + std::to_string(inf_mismatch) +
           " zero_rows=" + std::to_string(zero_rows) + " gap_writes=" + std::to_string(gap_writes);
  }
};

// Bytes of `t` (a copy of `owner`, which `v` views) outside the elements of `v` that are not
// `poison`.
inline long long gap_bytes_written(const HostTensor& t, const HostTensor& owner,
                                   const TensorView& v, std::uint8_t poison) {
  std::vector<unsigned char> in_view(t.bytes(), 0);
  const std::size_t esize = dtype_size(v.dtype);
  for_each_element(v, owner, [&](std::int64_t off, std::int64_t) {
    std::fill_n(in_view.begin() + off * static_cast<std::int64_t>(esize), esize, 1);
  });
  const auto* bytes = static_cast<const unsigned char*>(t.raw());
  long long n = 0;
  for (std::size_t i = 0; i < t.bytes(); ++i) n += !in_view[i] && bytes[i] != poison;
  return n;
}

// Compares output `o` as the GPU wrote it (`got`, a copy of o.storage) with the reference's
// (`ref`, another copy); accumulates into `m`. Both were poisoned with 0xFF before their runs.
inline void compare_output(const Output& o, const HostTensor& ref, const HostTensor& got,
                           Mismatch& m) {
  m.gap_writes += gap_bytes_written(ref, *o.storage, o.view, 0xFF) +
                  gap_bytes_written(got, *o.storage, o.view, 0xFF);
  if (o.lse) {
    for_each_element(o.view, *o.storage, [&](std::int64_t off, std::int64_t) {
      const float a = got.get(off), b = ref.get(off);
      if (std::isnan(b)) ++m.ref_nan;
      else if (std::isnan(a)) ++m.nan;
      else if (std::isinf(a) || std::isinf(b)) m.inf_mismatch += a != b;
      else m.lse_abs = std::max(m.lse_abs, static_cast<double>(std::fabs(a - b)));
    });
    return;
  }
  double num = 0, den = 0, row_num = 0, row_den = 0;
  bool row_nonzero_here = false;
  std::int64_t current = -1;
  const auto close_row = [&] {
    if (current < 0) return;
    if (row_den == 0) {
      m.zero_rows += row_nonzero_here;
    } else {
      m.row_rel = std::max(m.row_rel, std::sqrt(row_num / row_den));
    }
  };
  for_each_element(o.view, *o.storage, [&](std::int64_t off, std::int64_t row) {
    if (row != current) {
      close_row();
      current = row, row_num = row_den = 0, row_nonzero_here = false;
    }
    const double a = got.get(off), b = ref.get(off);
    if (std::isnan(b)) {
      ++m.ref_nan;
      return;
    }
    if (std::isnan(a)) {
      ++m.nan;
      return;
    }
    num += (a - b) * (a - b), den += b * b;
    row_num += (a - b) * (a - b), row_den += b * b;
    row_nonzero_here = row_nonzero_here || a != 0;
  });
  close_row();
  m.out_rel = std::max(m.out_rel, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
}

// Copies of every output's storage, in outputs() order.
inline std::vector<HostTensor> snapshot(const std::vector<Output>& outs) {
  std::vector<HostTensor> v;
  for (const Output& o : outs) v.push_back(*o.storage);
  return v;
}

inline void poison(const std::vector<Output>& outs) {
  for (const Output& o : outs) o.storage->fill_bytes(0xFF);
}

}  // namespace deca::test::diff
