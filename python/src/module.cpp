// deca._C: the nanobind module. The pure-Python package deca (python/deca/) wraps it with
// keyword defaults, output allocation and the numpy dtype escape hatches.
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "deca decode-attention kernels (low-level binding; use the deca package)";

  // deca::Error carries messages that name the argument; ValueError is the Python category
  // for "this argument has the wrong value", so callers catching ValueError see it too.
  nb::exception<deca::Error>(m, "Error", PyExc_ValueError);

  m.def("version", [] { return std::string(deca::version()); });

  deca::python::register_tensor(m);
  deca::python::register_gqa(m);
  deca::python::register_gqa_fused(m);
  deca::python::register_mla(m);
  deca::python::register_quant(m);
  deca::python::register_checked(m);
  deca::python::register_fast_import(m);
}
