// Checked mode (issue 9): the default, and check_gqa_run / check_mla_run over a Python workspace
// tensor. The GIL is released while they wait for the stream.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "bindings.hpp"

namespace deca::python {

namespace {

const void* workspace_data(const Tensor* workspace) {
  return workspace ? workspace->view.data : nullptr;
}

}  // namespace

void register_checked(nb::module_& m) {
  m.def("checked_by_default", &checked_by_default);
  m.def(
      "check_gqa_run",
      [](const GqaPlan& plan, const Tensor* workspace, std::uintptr_t stream) {
        nb::gil_scoped_release release;  // a stream synchronisation
        check_gqa_run(plan, workspace_data(workspace), reinterpret_cast<void*>(stream));
      },
      nb::arg("plan"), nb::arg("workspace").none(), nb::arg("stream"));
  m.def(
      "check_mla_run",
      [](const MlaPlan& plan, const Tensor* workspace, std::uintptr_t stream) {
        nb::gil_scoped_release release;
        check_mla_run(plan, workspace_data(workspace), reinterpret_cast<void*>(stream));
      },
      nb::arg("plan"), nb::arg("workspace").none(), nb::arg("stream"));
}

}  // namespace deca::python
