// The per-call import of GqaPlan.run's fast path: Python objects straight to deca::TensorView.
//
// Tensor.__dlpack__ is Python code in torch (argument and stream checks, a few microseconds per
// tensor); torch._C._to_dlpack is the C function behind it and makes the same capsule. The fast
// path hands nanobind that capsule, so six tensors cost a few hundred nanoseconds each instead of
// most of the 39 us a planned run used to cost. Everything else goes through nanobind's own
// import (numpy, cupy, jax) and the same import_tensor rules as every other argument.
#include <optional>
#include <string>
#include <string_view>

#include "bindings.hpp"

namespace deca::python {
namespace {

// torch.Tensor and torch._C._to_dlpack once torch has been imported by the caller (deca never
// imports torch itself). Held as raw new references that are never released: objects that
// outlive the interpreter must not be decref'd by static destructors at exit.
struct TorchHooks {
  PyObject* tensor_type = nullptr;
  PyObject* to_dlpack = nullptr;
};

const TorchHooks& torch_hooks() {
  static TorchHooks hooks;
  if (hooks.to_dlpack) return hooks;
  PyObject* modules = PyImport_GetModuleDict();  // borrowed
  PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed
  if (!torch) return hooks;
  PyObject* type = PyObject_GetAttrString(torch, "Tensor");
  PyObject* c = PyObject_GetAttrString(torch, "_C");
  PyObject* fn = c ? PyObject_GetAttrString(c, "_to_dlpack") : nullptr;
  Py_XDECREF(c);
  if (!type || !fn || !PyType_Check(type)) {
    PyErr_Clear();
    Py_XDECREF(type);
    Py_XDECREF(fn);
    return hooks;
  }
  hooks.tensor_type = type;
  hooks.to_dlpack = fn;
  return hooks;
}

bool is_jax_array(nb::handle object) {
  PyObject* module = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(object.ptr())),
                                            "__module__");
  if (!module) {
    PyErr_Clear();
    return false;
  }
  const char* name = PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : nullptr;
  const bool jax = name && (std::string_view(name).starts_with("jax"));
  Py_DECREF(module);
  return jax;
}

}  // namespace

Tensor import_fast(nb::handle object, const char* declared, const std::string& where,
                   bool writable) {
  // jax arrays are immutable but DLPack cannot say so: refuse them as outputs here, as the
  // Python import does.
  if (writable && is_jax_array(object)) {
    throw Error(where + ": expected a writable array, got an immutable jax array");
  }
  const TorchHooks& torch = torch_hooks();
  const std::optional<std::string> dtype =
      declared ? std::optional<std::string>(declared) : std::nullopt;
  if (torch.tensor_type &&
      PyObject_TypeCheck(object.ptr(), reinterpret_cast<PyTypeObject*>(torch.tensor_type))) {
    nb::object capsule =
        nb::steal(PyObject_CallOneArg(torch.to_dlpack, object.ptr()));
    if (!capsule.is_valid()) {
      // e.g. a dtype this torch cannot export: the caller's checked path views it as bits.
      PyErr_Clear();
      throw Error(where + ": torch could not export this tensor through DLPack");
    }
    return import_tensor(capsule, dtype, where, writable);
  }
  return import_tensor(object, dtype, where, writable);
}

}  // namespace deca::python
