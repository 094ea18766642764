// GQA decode bindings: GqaConfig / GqaPlan mirror the C++ structs (enums as the strings the
// Python API uses), and two run entry points: with a plan (engines; workspace passed in) and
// with a config (one-off calls; the C++ API plans and allocates per call).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "api/gqa_config.hpp"
#include "api/gqa_prepare.hpp"
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

// The fused decode step's style by the names Python uses ("none", "neox", "gptj").
RopeStyle parse_rope_style(const std::string& name) {
  if (name == "none") return RopeStyle::kNone;
  if (name == "neox") return RopeStyle::kNeox;
  if (name == "gptj") return RopeStyle::kGptj;
  throw Error("GqaConfig: rope_style: expected \"none\", \"neox\" or \"gptj\", got \"" + name + "\"");
}
const char* rope_style_name(RopeStyle s) {
  return s == RopeStyle::kNeox ? "neox" : (s == RopeStyle::kGptj ? "gptj" : "none");
}

}  // namespace

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

namespace {

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

// How far a fast-path call goes. Only kRun is GqaPlan.run; the others are the stages
// tools/py_host_cost.py times to split a call's host cost (same signature, same arguments).
enum class FastStage {
  kNothing,        // the binding's own floor: nanobind converts the arguments and returns
  kImport,         // + the import of every tensor (torch ones through their C API)
  kWithoutLaunch,  // + every check, the kernel lookup and the params: all but the launch
  kRun,            // + the launch (or, on the CPU, the computation)
};

// GqaPlan.run's fast path: Python objects in, one import each (dtypes from the plan), one
// gqa_decode call. Messages still name "gqa_decode: <argument>"; any failure makes the Python
// layer retry through its checked import, which raises the message a user sees.
template <FastStage stage>
void run_planned_fast(const GqaPlan& plan, nb::handle q, nb::handle k_cache, nb::handle v_cache,
                      nb::handle page_table, nb::handle seq_lens, nb::handle out, nb::handle lse,
                      nb::handle tree_mask, nb::handle sinks, nb::handle k_scales,
                      nb::handle v_scales, float k_scale, float v_scale, float softmax_scale,
                      float out_scale, nb::handle workspace, std::uintptr_t stream,
                      bool lse_heads_first_layout, bool q_len_axis, bool kv_pair) {
  if constexpr (stage == FastStage::kNothing) return;
  const GqaConfig& c = plan.config;
  constexpr const char* fn = "gqa_decode";
  const auto in = [](nb::handle h, std::optional<DType> dtype, const char* name) {
    return import_fast(h, dtype, {fn, name}, false);
  };
  const auto maybe = [](nb::handle h, const char* name, bool writable) {
    return import_fast_optional(h, std::nullopt, {fn, name}, writable);
  };
  Tensor tq = in(q, c.q_dtype, "q");
  // kv_pair: k_cache is FlashInfer's [pages, 2, ...] (K at index 0 of axis 1, V at 1) and
  // v_cache is not read.
  std::optional<Tensor> pair;
  if (kv_pair) pair = in(k_cache, c.kv_dtype, "k_cache");
  const Tensor tk = pair ? select_kv_half(*pair, 0, "gqa_decode: k_cache")
                         : in(k_cache, c.kv_dtype, "k_cache");
  const Tensor tv = pair ? select_kv_half(*pair, 1, "gqa_decode: k_cache")
                         : in(v_cache, c.kv_dtype, "v_cache");
  const Tensor tpt = in(page_table, std::nullopt, "page_table");
  const Tensor tsl = in(seq_lens, std::nullopt, "seq_lens");
  Tensor tout = import_fast(out, c.out_dtype, {fn, "out"}, true);
  std::optional<Tensor> tlse = maybe(lse, "lse", true);
  lse_heads_first(tlse, lse_heads_first_layout);
  if (q_len_axis) {
    insert_q_len_axis(tq, "gqa_decode: q");
    insert_q_len_axis(tout, "gqa_decode: out");
    if (tlse) insert_q_len_axis(*tlse, "gqa_decode: lse");
  }
  const std::optional<Tensor> tmask = maybe(tree_mask, "tree_mask", false);
  const std::optional<Tensor> tsinks = maybe(sinks, "sinks", false);
  const std::optional<Tensor> tks = maybe(k_scales, "k_scales", false);
  const std::optional<Tensor> tvs = maybe(v_scales, "v_scales", false);
  const std::optional<Tensor> tws = maybe(workspace, "workspace", true);
  const auto ptr = ptr_or_null;
  const GqaDecodeArgs a =
      make_args(tq, tk, tv, tpt, tsl, tout, ptr(tlse), ptr(tmask), ptr(tsinks), ptr(tks),
                ptr(tvs), k_scale, v_scale, softmax_scale, out_scale, ptr(tws), stream);
  if constexpr (stage == FastStage::kImport) return;
  nb::gil_scoped_release release;
  if constexpr (stage == FastStage::kWithoutLaunch) {
    api::gqa_decode_without_launch(plan, a);
  } else {
    gqa_decode(plan, a);
  }
}

template <FastStage stage>
void def_fast(nb::module_& m, const char* name) {
  // v_cache may be None: with kv_pair, k_cache holds both halves.
  m.def(name, &run_planned_fast<stage>, nb::arg("plan"), nb::arg("q"), nb::arg("k_cache"),
        nb::arg("v_cache").none(), nb::arg("page_table"), nb::arg("seq_lens"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("tree_mask").none(), nb::arg("sinks").none(),
        nb::arg("k_scales").none(), nb::arg("v_scales").none(), nb::arg("k_scale"),
        nb::arg("v_scale"), nb::arg("softmax_scale"), nb::arg("out_scale"),
        nb::arg("workspace").none(), nb::arg("stream"), nb::arg("lse_heads_first") = false,
        nb::arg("q_len_axis") = false, nb::arg("kv_pair") = false);
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
          "rope_style", [](const GqaConfig& c) { return rope_style_name(c.rope_style); },
          [](GqaConfig& c, const std::string& v) { c.rope_style = parse_rope_style(v); })
      .def_rw("rotary_dim", &GqaConfig::rotary_dim)
      .def_prop_rw(
          "split_mode",
          [](const GqaConfig& c) { return c.split_mode == SplitMode::kAuto ? "auto" : "fixed"; },
          [](GqaConfig& c, const std::string& v) { c.split_mode = parse_split_mode(v); })
      .def_rw("split_tokens", &GqaConfig::split_tokens)
      .def_rw("checked", &GqaConfig::checked)
      .def_rw("skip_softmax_factor", &GqaConfig::skip_softmax_factor)
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

  // The one-off call's config from its tensors (the C++ one-off's own derivation and messages),
  // which the Python layer plans once per call shape instead of once per call.
  m.def(
      "gqa_oneoff_config",
      [](const GqaConfig& config, const Tensor& q, const Tensor& k_cache, const Tensor& page_table,
         const Tensor* out) {
        GqaDecodeArgs a;
        a.q = q.view;
        a.k_cache = k_cache.view;
        a.page_table = page_table.view;
        a.out = view_or_absent(out);
        return api::oneshot_gqa_config(config, a);
      },
      nb::arg("config"), nb::arg("q"), nb::arg("k_cache"), nb::arg("page_table"),
      nb::arg("out").none());
  def_run<GqaPlan>(m, "gqa_decode_planned", "plan");
  def_run<GqaConfig>(m, "gqa_decode_oneoff", "config");
  def_fast<FastStage::kRun>(m, "gqa_decode_planned_fast");
  // Host-cost probes for tools/py_host_cost.py (not API): the fast path stopped early.
  def_fast<FastStage::kNothing>(m, "_gqa_fast_nothing");
  def_fast<FastStage::kImport>(m, "_gqa_fast_import");
  def_fast<FastStage::kWithoutLaunch>(m, "_gqa_fast_without_launch");
}

}  // namespace deca::python
