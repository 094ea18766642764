// GQA decode bindings: GqaConfig / GqaPlan mirror the C++ structs (enums as the strings the
// Python API uses), and two run entry points: with a plan (engines; workspace passed in) and
// with a config (one-off calls; the C++ API plans and allocates per call).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace deca::python {
namespace {

KvLayout parse_layout(const std::string& name) {
  if (name == "NHD") return KvLayout::kNHD;
  if (name == "HND") return KvLayout::kHND;
  throw Error("GqaConfig: layout: expected \"NHD\" or \"HND\", got \"" + name + "\"");
}

SplitMode parse_split_mode(const std::string& name) {
  if (name == "auto") return SplitMode::kAuto;
  if (name == "fixed") return SplitMode::kFixed;
  throw Error("GqaConfig: split_mode: expected \"auto\" or \"fixed\", got \"" + name + "\"");
}

// Everything a run needs besides the plan or config. Tensors arrive as deca._C.Tensor, already
// imported (and named) by the Python layer; nanobind keeps them alive for the call.
GqaDecodeArgs make_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& page_table, const Tensor& seq_lens, const Tensor& out,
                        const Tensor* lse, const Tensor* tree_mask, const Tensor* sinks,
                        const Tensor* k_scales, const Tensor* v_scales, float k_scale,
                        float v_scale, float softmax_scale, float out_scale,
                        const Tensor* workspace, std::uintptr_t stream) {
  GqaDecodeArgs a;
  a.q = q.view;
  a.k_cache = k_cache.view;
  a.v_cache = v_cache.view;
  a.page_table = page_table.view;
  a.seq_lens = seq_lens.view;
  a.out = out.view;
  a.lse = view_or_absent(lse);
  a.tree_mask = view_or_absent(tree_mask);
  a.sinks = view_or_absent(sinks);
  a.k_scales = view_or_absent(k_scales);
  a.v_scales = view_or_absent(v_scales);
  a.k_scale = k_scale;
  a.v_scale = v_scale;
  a.softmax_scale = softmax_scale;
  a.out_scale = out_scale;
  set_workspace_and_stream(a, workspace, stream);
  return a;
}

// One run entry point per way to name what runs: a GqaPlan (engines; workspace passed in) or a
// GqaConfig (one-off calls); gqa_decode has an overload for each. `first` names that argument.
template <typename First>
void def_run(nb::module_& m, const char* name, const char* first) {
  m.def(
      name,
      [](const First& what, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
         const Tensor& page_table, const Tensor& seq_lens, const Tensor& out, const Tensor* lse,
         const Tensor* tree_mask, const Tensor* sinks, const Tensor* k_scales,
         const Tensor* v_scales, float k_scale, float v_scale, float softmax_scale,
         float out_scale, const Tensor* workspace, std::uintptr_t stream) {
        const GqaDecodeArgs a =
            make_args(q, k_cache, v_cache, page_table, seq_lens, out, lse, tree_mask, sinks,
                      k_scales, v_scales, k_scale, v_scale, softmax_scale, out_scale, workspace,
                      stream);
        nb::gil_scoped_release release;
        gqa_decode(what, a);
      },
      nb::arg(first), nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("page_table"),
      nb::arg("seq_lens"), nb::arg("out"), nb::arg("lse").none(), nb::arg("tree_mask").none(),
      nb::arg("sinks").none(), nb::arg("k_scales").none(), nb::arg("v_scales").none(),
      nb::arg("k_scale"), nb::arg("v_scale"), nb::arg("softmax_scale"), nb::arg("out_scale"),
      nb::arg("workspace").none(), nb::arg("stream"));
}

}  // namespace

void register_gqa(nb::module_& m) {
  nb::class_<GqaConfig>(m, "GqaConfig")
      .def(nb::init<>())
      .def_rw("num_q_heads", &GqaConfig::num_q_heads)
      .def_rw("num_kv_heads", &GqaConfig::num_kv_heads)
      .def_rw("head_dim", &GqaConfig::head_dim)
      .def_rw("page_size", &GqaConfig::page_size)
      .def_prop_rw(
          "layout", [](const GqaConfig& c) { return c.layout == KvLayout::kNHD ? "NHD" : "HND"; },
          [](GqaConfig& c, const std::string& v) { c.layout = parse_layout(v); })
      .def_prop_rw(
          "q_dtype", [](const GqaConfig& c) { return std::string(dtype_name(c.q_dtype)); },
          [](GqaConfig& c, const std::string& v) { c.q_dtype = parse_dtype(v, "GqaConfig: q_dtype"); })
      .def_prop_rw(
          "kv_dtype", [](const GqaConfig& c) { return std::string(dtype_name(c.kv_dtype)); },
          [](GqaConfig& c, const std::string& v) {
            c.kv_dtype = parse_dtype(v, "GqaConfig: kv_dtype");
          })
      .def_prop_rw(
          "out_dtype", [](const GqaConfig& c) { return std::string(dtype_name(c.out_dtype)); },
          [](GqaConfig& c, const std::string& v) {
            c.out_dtype = parse_dtype(v, "GqaConfig: out_dtype");
          })
      .def_rw("max_batch", &GqaConfig::max_batch)
      .def_rw("max_q_len", &GqaConfig::max_q_len)
      .def_rw("max_seq_len", &GqaConfig::max_seq_len)
      .def_rw("tree_mask", &GqaConfig::tree_mask)
      .def_rw("sinks", &GqaConfig::sinks)
      .def_rw("lse", &GqaConfig::lse)
      .def_rw("per_head_kv_scale", &GqaConfig::per_head_kv_scale)
      .def_rw("window", &GqaConfig::window)
      .def_rw("softcap", &GqaConfig::softcap)
      .def_rw("beam_width", &GqaConfig::beam_width)
      .def_prop_rw(
          "split_mode",
          [](const GqaConfig& c) { return c.split_mode == SplitMode::kAuto ? "auto" : "fixed"; },
          [](GqaConfig& c, const std::string& v) { c.split_mode = parse_split_mode(v); })
      .def_rw("split_tokens", &GqaConfig::split_tokens)
      .def_rw("device", &GqaConfig::device);

  nb::class_<GqaPlan>(m, "GqaPlan")
      .def_ro("config", &GqaPlan::config)
      .def_ro("num_splits", &GqaPlan::num_splits)
      .def_ro("split_tokens", &GqaPlan::split_tokens)
      .def_ro("workspace_bytes", &GqaPlan::workspace_bytes)
      .def_ro("kernel_name", &GqaPlan::kernel_name)
      .def_ro("sm_count", &GqaPlan::sm_count);

  m.def("plan_gqa_decode", [](const GqaConfig& config) { return plan_gqa_decode(config); },
        nb::arg("config"));
  m.def(
      "precompile_gqa_decode",
      [](const GqaConfig& config, int compute_capability) {
        nb::gil_scoped_release release;  // NVRTC takes a second or two
        return precompile_gqa_decode(config, compute_capability);
      },
      nb::arg("config"), nb::arg("compute_capability"));

  def_run<GqaPlan>(m, "gqa_decode_planned", "plan");
  def_run<GqaConfig>(m, "gqa_decode_oneoff", "config");
}

}  // namespace deca::python
