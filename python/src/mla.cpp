// MLA decode bindings: MlaConfig / MlaPlan mirror the C++ structs (kv_format as the string the
// Python API uses); dense, sparse and combine runs take deca._C.Tensor arguments already imported
// and named by the Python layer.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace deca::python {
namespace {

MlaCacheFormat parse_kv_format(const std::string& name) {
  for (const MlaCacheFormat f : {MlaCacheFormat::kDefault, MlaCacheFormat::kBF16,
                                 MlaCacheFormat::kFP8E4M3, MlaCacheFormat::kFP8Sparse,
                                 MlaCacheFormat::kModel1}) {
    if (name == mla_cache_format_name(f)) return f;
  }
  throw Error("MlaConfig: kv_format: expected \"default\", \"bf16\", \"fp8_e4m3\", "
              "\"fp8_sparse\" or \"model1\", got \"" + name + "\"");
}

// MlaConfig::lse_of_empty_row as Python spells it: "-inf" (deca's) or "+inf" (FlashMLA's).
const char* lse_of_empty_row_name(MlaLseOfEmptyRow v) {
  return v == MlaLseOfEmptyRow::kPosInf ? "+inf" : "-inf";
}

MlaLseOfEmptyRow parse_lse_of_empty_row(const std::string& name) {
  if (name == "-inf") return MlaLseOfEmptyRow::kNegInf;
  if (name == "+inf") return MlaLseOfEmptyRow::kPosInf;
  throw Error("MlaConfig: lse_of_empty_row: expected \"-inf\" or \"+inf\", got \"" + name + "\"");
}

// The second cache's arguments (MODEL1), absent when None.
void set_extra(MlaSparseArgs& a, const Tensor* kv, const Tensor* indices, const Tensor* length) {
  a.extra_kv_cache = view_or_absent(kv);
  a.extra_indices = view_or_absent(indices);
  a.extra_topk_length = view_or_absent(length);
}

// The fields dense and sparse args share.
template <typename Args>
void set_common(Args& a, const Tensor& q, const Tensor& kv_cache, const Tensor& out,
                const Tensor* lse, float softmax_scale, const Tensor* workspace,
                std::uintptr_t stream) {
  a.q = q.view;
  a.kv_cache = kv_cache.view;
  a.out = out.view;
  a.lse = view_or_absent(lse);
  a.softmax_scale = softmax_scale;
  set_workspace_and_stream(a, workspace, stream);
}

// MlaPlan.run_sparse's fast path (GqaPlan.run's pattern, gqa.cpp): Python objects in, one import
// each, one mla_decode_sparse call; any failure makes the Python layer retry through its checked
// import, which raises the message a user sees. q and out are bf16 in every MLA call: declaring
// it lets their raw bits (numpy uint16) through, as a plan's dtypes do for GQA.
void mla_sparse_planned_fast(const MlaPlan& plan, nb::handle q, nb::handle kv_cache,
                             nb::handle indices, nb::handle topk_length, nb::handle attn_sink,
                             nb::handle out, nb::handle lse, float softmax_scale,
                             nb::handle workspace, std::uintptr_t stream, bool reuse_schedule,
                             nb::handle extra_kv_cache, nb::handle extra_indices,
                             nb::handle extra_topk_length, bool lse_heads_first_layout) {
  constexpr const char* fn = "mla_decode_sparse";
  const Tensor tq = import_fast(q, DType::kBF16, {fn, "q"}, false);
  const Tensor tkv = import_fast(kv_cache, std::nullopt, {fn, "kv_cache"}, false);
  const Tensor tidx = import_fast(indices, DType::kINT32, {fn, "indices"}, false);
  const std::optional<Tensor> tlen =
      import_fast_optional(topk_length, DType::kINT32, {fn, "topk_length"}, false);
  const std::optional<Tensor> tsink =
      import_fast_optional(attn_sink, std::nullopt, {fn, "attn_sink"}, false);
  const Tensor tout = import_fast(out, DType::kBF16, {fn, "out"}, true);
  std::optional<Tensor> tlse = import_fast_optional(lse, std::nullopt, {fn, "lse"}, true);
  lse_heads_first(tlse, lse_heads_first_layout);
  const std::optional<Tensor> tws =
      import_fast_optional(workspace, std::nullopt, {fn, "workspace"}, true);
  const std::optional<Tensor> tekv =
      import_fast_optional(extra_kv_cache, std::nullopt, {fn, "extra_kv_cache"}, false);
  const std::optional<Tensor> teidx =
      import_fast_optional(extra_indices, DType::kINT32, {fn, "extra_indices"}, false);
  const std::optional<Tensor> telen =
      import_fast_optional(extra_topk_length, DType::kINT32, {fn, "extra_topk_length"}, false);
  MlaSparseArgs a;
  set_common(a, tq, tkv, tout, ptr_or_null(tlse), softmax_scale, ptr_or_null(tws), stream);
  a.indices = tidx.view;
  a.topk_length = view_or_absent(ptr_or_null(tlen));
  a.attn_sink = view_or_absent(ptr_or_null(tsink));
  set_extra(a, ptr_or_null(tekv), ptr_or_null(teidx), ptr_or_null(telen));
  a.reuse_schedule = reuse_schedule;
  nb::gil_scoped_release release;
  mla_decode_sparse(plan, a);
}

// The dtype a dense plan's cache is declared as on the fast path: the 16- and 8-bit value
// formats let their raw bits (numpy uint16 / uint8) through, as q's; the 656-byte token is bytes.
std::optional<DType> dense_cache_dtype(const MlaPlan& plan) {
  switch (plan.config.kv_format) {
    case MlaCacheFormat::kDefault:
    case MlaCacheFormat::kBF16: return DType::kBF16;
    case MlaCacheFormat::kFP8E4M3: return DType::kFP8E4M3;
    default: return std::nullopt;
  }
}

// MlaPlan.run_dense's fast path, as mla_sparse_planned_fast.
void mla_dense_planned_fast(const MlaPlan& plan, nb::handle q, nb::handle kv_cache,
                            nb::handle block_table, nb::handle cache_seqlens, nb::handle out,
                            nb::handle lse, float softmax_scale, float kv_scale,
                            nb::handle workspace, std::uintptr_t stream, bool reuse_schedule) {
  constexpr const char* fn = "mla_decode_dense";
  const Tensor tq = import_fast(q, DType::kBF16, {fn, "q"}, false);
  const Tensor tkv = import_fast(kv_cache, dense_cache_dtype(plan), {fn, "kv_cache"}, false);
  const Tensor tbt = import_fast(block_table, DType::kINT32, {fn, "block_table"}, false);
  const Tensor tsl = import_fast(cache_seqlens, DType::kINT32, {fn, "cache_seqlens"}, false);
  const Tensor tout = import_fast(out, DType::kBF16, {fn, "out"}, true);
  const std::optional<Tensor> tlse = import_fast_optional(lse, std::nullopt, {fn, "lse"}, true);
  const std::optional<Tensor> tws =
      import_fast_optional(workspace, std::nullopt, {fn, "workspace"}, true);
  MlaDenseArgs a;
  set_common(a, tq, tkv, tout, ptr_or_null(tlse), softmax_scale, ptr_or_null(tws), stream);
  a.block_table = tbt.view;
  a.cache_seqlens = tsl.view;
  a.kv_scale = kv_scale;
  a.reuse_schedule = reuse_schedule;
  nb::gil_scoped_release release;
  mla_decode_dense(plan, a);
}

}  // namespace

void register_mla(nb::module_& m) {
  m.attr("MLA_DIM_QK") = kMlaDimQK;
  m.attr("MLA_DIM_V") = kMlaDimV;
  m.attr("MLA_DIM_NOPE") = kMlaDimNope;
  m.attr("MLA_DIM_ROPE") = kMlaDimRope;
  m.attr("MLA_FP8_TOKEN_BYTES") = kMlaFp8TokenBytes;
  m.attr("MLA_MODEL1_DIM_QK") = kMlaModel1DimQK;
  m.attr("MLA_MODEL1_TOKEN_BYTES") = kMlaModel1TokenBytes;
  m.def("mla_model1_page_bytes", [](int page_size) { return mla_model1_page_bytes(page_size); },
        nb::arg("page_size"));

  nb::class_<MlaConfig>(m, "MlaConfig")
      .def(nb::init<>())
      .def_rw("num_heads", &MlaConfig::num_heads)
      .def_rw("page_size", &MlaConfig::page_size)
      .def_rw("sparse", &MlaConfig::sparse)
      .def_prop_rw(
          "kv_format",
          [](const MlaConfig& c) { return std::string(mla_cache_format_name(c.kv_format)); },
          [](MlaConfig& c, const std::string& v) { c.kv_format = parse_kv_format(v); })
      .def_rw("max_batch", &MlaConfig::max_batch)
      .def_rw("max_q_len", &MlaConfig::max_q_len)
      .def_rw("max_seq_len", &MlaConfig::max_seq_len)
      .def_rw("topk", &MlaConfig::topk)
      .def_rw("lse", &MlaConfig::lse)
      .def_prop_rw(
          "lse_of_empty_row",
          [](const MlaConfig& c) { return std::string(lse_of_empty_row_name(c.lse_of_empty_row)); },
          [](MlaConfig& c, const std::string& v) { c.lse_of_empty_row = parse_lse_of_empty_row(v); })
      .def_rw("attn_sink", &MlaConfig::attn_sink)
      .def_rw("topk_length", &MlaConfig::topk_length)
      .def_rw("extra_topk", &MlaConfig::extra_topk)
      .def_rw("extra_page_size", &MlaConfig::extra_page_size)
      .def_rw("extra_topk_length", &MlaConfig::extra_topk_length)
      .def_rw("checked", &MlaConfig::checked)
      .def_rw("device", &MlaConfig::device);

  nb::class_<MlaPlan>(m, "MlaPlan")
      .def_ro("config", &MlaPlan::config)
      .def_ro("num_splits", &MlaPlan::num_splits)
      .def_ro("workspace_bytes", &MlaPlan::workspace_bytes)
      .def_ro("sm_count", &MlaPlan::sm_count)
      .def_ro("num_parts", &MlaPlan::num_parts)
      .def_ro("kernel_name", &MlaPlan::kernel_name);

  m.def("plan_mla_decode", [](const MlaConfig& config) { return plan_mla_decode(config); },
        nb::arg("config"));

  m.def(
      "mla_decode_dense_planned",
      [](const MlaPlan& plan, const Tensor& q, const Tensor& kv_cache, const Tensor& block_table,
         const Tensor& cache_seqlens, const Tensor& out, const Tensor* lse, float softmax_scale,
         float kv_scale, const Tensor* workspace, std::uintptr_t stream, bool reuse_schedule) {
        MlaDenseArgs a;
        set_common(a, q, kv_cache, out, lse, softmax_scale, workspace, stream);
        a.block_table = block_table.view;
        a.cache_seqlens = cache_seqlens.view;
        a.kv_scale = kv_scale;
        a.reuse_schedule = reuse_schedule;
        nb::gil_scoped_release release;
        mla_decode_dense(plan, a);
      },
      nb::arg("plan"), nb::arg("q"), nb::arg("kv_cache"), nb::arg("block_table"),
      nb::arg("cache_seqlens"), nb::arg("out"), nb::arg("lse").none(), nb::arg("softmax_scale"),
      nb::arg("kv_scale"), nb::arg("workspace").none(), nb::arg("stream"),
      nb::arg("reuse_schedule") = false);

  m.def(
      "mla_decode_sparse_planned",
      [](const MlaPlan& plan, const Tensor& q, const Tensor& kv_cache, const Tensor& indices,
         const Tensor* topk_length, const Tensor* attn_sink, const Tensor& out, const Tensor* lse,
         float softmax_scale, const Tensor* workspace, std::uintptr_t stream, bool reuse_schedule,
         const Tensor* extra_kv_cache, const Tensor* extra_indices,
         const Tensor* extra_topk_length) {
        MlaSparseArgs a;
        set_common(a, q, kv_cache, out, lse, softmax_scale, workspace, stream);
        a.indices = indices.view;
        a.topk_length = view_or_absent(topk_length);
        a.attn_sink = view_or_absent(attn_sink);
        set_extra(a, extra_kv_cache, extra_indices, extra_topk_length);
        a.reuse_schedule = reuse_schedule;
        nb::gil_scoped_release release;
        mla_decode_sparse(plan, a);
      },
      nb::arg("plan"), nb::arg("q"), nb::arg("kv_cache"), nb::arg("indices"),
      nb::arg("topk_length").none(), nb::arg("attn_sink").none(), nb::arg("out"),
      nb::arg("lse").none(), nb::arg("softmax_scale"), nb::arg("workspace").none(),
      nb::arg("stream"), nb::arg("reuse_schedule") = false,
      nb::arg("extra_kv_cache").none() = nb::none(), nb::arg("extra_indices").none() = nb::none(),
      nb::arg("extra_topk_length").none() = nb::none());

  m.def("mla_decode_dense_planned_fast", &mla_dense_planned_fast, nb::arg("plan"), nb::arg("q"),
        nb::arg("kv_cache"), nb::arg("block_table"), nb::arg("cache_seqlens"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("softmax_scale"), nb::arg("kv_scale"),
        nb::arg("workspace").none(), nb::arg("stream"), nb::arg("reuse_schedule"));

  m.def("mla_decode_sparse_planned_fast", &mla_sparse_planned_fast, nb::arg("plan"), nb::arg("q"),
        nb::arg("kv_cache"), nb::arg("indices"), nb::arg("topk_length").none(),
        nb::arg("attn_sink").none(), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("softmax_scale"), nb::arg("workspace").none(), nb::arg("stream"),
        nb::arg("reuse_schedule"), nb::arg("extra_kv_cache").none() = nb::none(),
        nb::arg("extra_indices").none() = nb::none(),
        nb::arg("extra_topk_length").none() = nb::none(), nb::arg("lse_heads_first") = false);

  m.def(
      "combine",
      [](const Tensor& partial_out, const Tensor& partial_lse, const Tensor* attn_sink,
         const Tensor& out, const Tensor* lse, std::uintptr_t stream) {
        CombineArgs a;
        a.partial_out = partial_out.view;
        a.partial_lse = partial_lse.view;
        a.attn_sink = view_or_absent(attn_sink);
        a.out = out.view;
        a.lse = view_or_absent(lse);
        a.stream = reinterpret_cast<void*>(stream);
        nb::gil_scoped_release release;
        combine(a);
      },
      nb::arg("partial_out"), nb::arg("partial_lse"), nb::arg("attn_sink").none(),
      nb::arg("out"), nb::arg("lse").none(), nb::arg("stream"));
}

}  // namespace deca::python
