// Quantiser bindings (include/deca/quant.hpp): host-side producers of deca's quantized caches.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"

namespace deca::python {
namespace {

// The packers' format by the name the Python API uses: "fp8_sparse" (the 656-byte token) or
// "model1" (the 584-byte one).
MlaCacheFormat token_format(const char* fn, const std::string& name) {
  if (name == "fp8_sparse") return MlaCacheFormat::kFP8Sparse;
  if (name == "model1") return MlaCacheFormat::kModel1;
  throw Error(std::string(fn) + ": format: expected \"fp8_sparse\" or \"model1\", got \"" +
              name + "\"");
}

}  // namespace

void register_quant(nb::module_& m) {
  m.def("choose_fp8_scale", [](const Tensor& src) { return choose_fp8_scale(src.view); },
        nb::arg("src"));
  m.def("choose_int8_scale", [](const Tensor& src) { return choose_int8_scale(src.view); },
        nb::arg("src"));
  m.def(
      "quantize_fp8",
      [](const Tensor& src, const Tensor& out, float scale) {
        nb::gil_scoped_release release;
        quantize_fp8(src.view, out.view, scale);
      },
      nb::arg("src"), nb::arg("out"), nb::arg("scale"));
  m.def(
      "quantize_int8",
      [](const Tensor& src, const Tensor& out, float scale) {
        nb::gil_scoped_release release;
        quantize_int8(src.view, out.view, scale);
      },
      nb::arg("src"), nb::arg("out"), nb::arg("scale"));
  m.def(
      "pack_mla_fp8",
      [](const Tensor& src, const Tensor& out, const std::string& format) {
        const MlaCacheFormat f = token_format("pack_mla_fp8", format);
        nb::gil_scoped_release release;
        pack_mla_fp8(src.view, out.view, f);
      },
      nb::arg("src"), nb::arg("out"), nb::arg("format") = "fp8_sparse");
  m.def(
      "quantize_mla_fp8_e4m3",
      [](const Tensor& src, const Tensor& out) {
        nb::gil_scoped_release release;
        return quantize_mla_fp8_e4m3(src.view, out.view);
      },
      nb::arg("src"), nb::arg("out"));
  m.def(
      "unpack_mla_fp8",
      [](const Tensor& src, const Tensor& out, const std::string& format) {
        const MlaCacheFormat f = token_format("unpack_mla_fp8", format);
        nb::gil_scoped_release release;
        unpack_mla_fp8(src.view, out.view, f);
      },
      nb::arg("src"), nb::arg("out"), nb::arg("format") = "fp8_sparse");
}

}  // namespace deca::python
