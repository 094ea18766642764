// Shared pieces of the nanobind module deca._C: the Tensor wrapper that turns any DLPack-capable
// object into a deca::TensorView, and one register function per binding file.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "deca/deca.hpp"

namespace deca::python {

namespace nb = nanobind;

// A tensor handed in from Python. It holds the DLPack import, which keeps the memory alive for
// as long as the wrapper lives, and the view deca reads. Inputs are imported read-only (so that
// read-only numpy arrays work); outputs are imported writable (so that they cannot be).
struct Tensor {
  nb::ndarray<nb::ro> input;
  nb::ndarray<> output;
  TensorView view;
  std::string origin_dtype;  // the dtype as the array library named it, e.g. "uint16"
};

// `where` names the function and argument for error messages ("gqa_decode: q"). `declared` is
// the dtype the caller says the memory holds: needed for raw bits (uint16 holding bf16/fp16,
// uint8 holding fp8_e4m3), checked against the tensor's own dtype otherwise.
Tensor import_tensor(nb::handle object, const std::optional<std::string>& declared,
                     const std::string& where, bool writable);

DType parse_dtype(const std::string& name, const std::string& where);

// "<fn>: <arg>" for a message, built only when one is thrown: the fast path makes no string
// per tensor on success (most names are past the small-string buffer: a heap allocation each).
struct FastWhere {
  const char* fn;
  const char* arg;
  std::string str() const { return std::string(fn) + ": " + arg; }
};

// import_tensor for the per-call fast path (GqaPlan.run, MlaPlan.run_*): torch tensors read through their C
// API (fast_import.cpp), jax arrays refused as outputs; `declared` is the dtype the plan
// expects, if any. Throws deca::Error on anything it cannot take, and the Python layer then
// retries on its checked path.
Tensor import_fast(nb::handle object, std::optional<DType> declared, const FastWhere& where,
                   bool writable);

// import_fast of an optional argument: nothing for None.
inline std::optional<Tensor> import_fast_optional(nb::handle object, std::optional<DType> declared,
                                                  const FastWhere& where, bool writable) {
  return object.is_none() ? std::optional<Tensor>()
                          : std::optional<Tensor>(import_fast(object, declared, where, writable));
}

// An LSE passed in the peers' layout [batch, heads, q_len] (FlashAttention's and FlashMLA's
// returned tensor) as deca's [batch, q_len, heads] view of the same memory: dims 1 and 2 and
// their strides swapped. The compat layers' fast paths pass the tensor they return, so Python
// makes no transposed view per call. Anything but rank 3 is left for the API's shape check.
inline void lse_heads_first(std::optional<Tensor>& lse, bool heads_first) {
  if (!heads_first || !lse || lse->view.rank != 3) return;
  std::swap(lse->view.shape[1], lse->view.shape[2]);
  std::swap(lse->view.stride[1], lse->view.stride[2]);
}

// FlashInfer's one-token shapes as deca's: a unit q_len axis inserted at 1 (q, out [batch,
// heads, dim] -> [batch, 1, heads, dim]; lse [batch, heads] -> [batch, 1, heads]) with the
// stride torch's unsqueeze(1) gives it, so that deca sees what the Python view x[:, None]
// would hand it, without making that view per call. A view already at deca's largest rank is
// refused (throws), as the import of the Python view would.
inline void insert_q_len_axis(Tensor& t, const char* where) {
  TensorView& v = t.view;
  if (v.rank < 1) return;  // left for the API's rank check
  if (v.rank >= kMaxRank) {
    throw Error(std::string(where) + ": expected rank < " + std::to_string(kMaxRank) + ", got " +
                std::to_string(v.rank));
  }
  for (int i = v.rank; i > 1; --i) {
    v.shape[i] = v.shape[i - 1];
    v.stride[i] = v.stride[i - 1];
  }
  v.shape[1] = 1;
  v.stride[1] = v.rank > 1 ? v.shape[2] * v.stride[2] : 1;
  ++v.rank;
}

// One half of FlashInfer's combined cache [pages, 2, ...]: index `which` of axis 1 (torch's
// cache[:, which]), a view of the same memory without that axis. Throws unless axis 1 holds 2.
inline Tensor select_kv_half(const Tensor& pair, int which, const char* where) {
  const TensorView& p = pair.view;
  if (p.rank < 2 || p.shape[1] != 2) {
    throw Error(std::string(where) + ": expected [pages, 2, ...], got " + p.describe());
  }
  Tensor t;
  t.origin_dtype = pair.origin_dtype;
  TensorView& v = t.view;
  v = p;
  v.data = static_cast<char*>(p.data) +
           static_cast<std::ptrdiff_t>(which) * p.stride[1] *
               static_cast<std::ptrdiff_t>(dtype_size(p.dtype));
  for (int i = 1; i + 1 < p.rank; ++i) {
    v.shape[i] = p.shape[i + 1];
    v.stride[i] = p.stride[i + 1];
  }
  v.rank = p.rank - 1;
  return t;
}

// An optional import as the pointer the helpers below and make_args take: null for None.
inline const Tensor* ptr_or_null(const std::optional<Tensor>& tensor) {
  return tensor ? &*tensor : nullptr;
}

// Optional tensor argument: an absent view for None.
inline TensorView view_or_absent(const Tensor* tensor) {
  return tensor ? tensor->view : TensorView{};
}

// The run fields the args of every decode op share: the optional workspace (its pointer and size
// in bytes; left unset for None) and the stream (a cudaStream_t passed as an integer).
template <typename Args>
void set_workspace_and_stream(Args& a, const Tensor* workspace, std::uintptr_t stream) {
  if (workspace) {
    a.workspace = workspace->view.data;
    a.workspace_bytes =
        static_cast<std::size_t>(workspace->view.numel()) * dtype_size(workspace->view.dtype);
  }
  a.stream = reinterpret_cast<void*>(stream);
}

void register_tensor(nb::module_& m);
// gqa_decode's arguments from imported tensors (gqa.cpp); gqa_fused.cpp adds the fused ones.
GqaDecodeArgs make_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& page_table, const Tensor& seq_lens, const Tensor& out,
                        const Tensor* lse, const Tensor* tree_mask, const Tensor* sinks,
                        const Tensor* k_scales, const Tensor* v_scales, float k_scale,
                        float v_scale, float softmax_scale, float out_scale,
                        const Tensor* workspace, std::uintptr_t stream);
void register_gqa(nb::module_& m);
void register_gqa_fused(nb::module_& m);
void register_mla(nb::module_& m);
void register_quant(nb::module_& m);
void register_checked(nb::module_& m);
void register_fast_import(nb::module_& m);

}  // namespace deca::python
