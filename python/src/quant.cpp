// Quantiser bindings (include/deca/quant.hpp): host-side producers of deca's quantized caches.
#include "bindings.hpp"

namespace deca::python {

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
      [](const Tensor& src, const Tensor& out) {
        nb::gil_scoped_release release;
        pack_mla_fp8(src.view, out.view);
      },
      nb::arg("src"), nb::arg("out"));
  m.def(
      "quantize_mla_fp8_e4m3",
      [](const Tensor& src, const Tensor& out) {
        nb::gil_scoped_release release;
        return quantize_mla_fp8_e4m3(src.view, out.view);
      },
      nb::arg("src"), nb::arg("out"));
  m.def(
      "unpack_mla_fp8",
      [](const Tensor& src, const Tensor& out) {
        nb::gil_scoped_release release;
        unpack_mla_fp8(src.view, out.view);
      },
      nb::arg("src"), nb::arg("out"));
}

}  // namespace deca::python
