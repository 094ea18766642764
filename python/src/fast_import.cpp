// The per-call import of GqaPlan.run's fast path: Python objects straight to deca::TensorView.
//
// torch tensors: DLPack costs microseconds per tensor even through torch's C export
// (torch._C._to_dlpack: ~2 us here, a managed tensor allocated and freed; Tensor.__dlpack__,
// what nanobind calls, ~5 us of Python checks), six tensors per call. Where torch offers DLPack's
// C exchange API (a function table on the type, `__dlpack_c_exchange_api__`, DLPack 1.3), one C
// call fills a non-owning DLTensor (tens of nanoseconds); otherwise, or when that call declines a
// tensor (one that requires grad, say), the five facts deca needs -- data_ptr(), shape,
// stride(), dtype, get_device() -- are read through the Python C API (~0.7 us per tensor on the
// H200 machine). Anything unusual (a dtype deca has no name for, a non-strided layout, a declared
// dtype that is not the tensor's) throws, and the Python layer retries on its checked path.
// Everything else goes through nanobind's own import (numpy, cupy, jax) and the same
// import_tensor rules as every other argument.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <string>
#include <string_view>

#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace deca::python {
namespace {

// The ABI of DLPack's C exchange API as far as deca calls it (dlpack.h 1.3: DLTensor, and the
// table's stable header followed by its function pointers, in this order). The table lives as
// long as the process; deca only reads it.
namespace dl {
struct Version {
  std::uint32_t major, minor;
};
struct Device {
  std::int32_t type;  // DLDeviceType: 1 CPU, 2 CUDA
  std::int32_t id;
};
struct DataType {
  std::uint8_t code;  // DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, 10 float8_e4m3fn
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // null: compact row-major
  std::uint64_t byte_offset;
};
struct ApiHeader {
  Version version;
  ApiHeader* prev_api;
};
struct ExchangeApi {
  ApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);  // 0, or -1 + a Python error
  int (*current_work_stream)(std::int32_t device_type, std::int32_t device_id, void** out_stream);
};
constexpr std::int32_t kCpu = 1, kCuda = 2;

std::optional<DType> dtype_of(DataType t) {
  struct Row {
    std::uint8_t code, bits;
    DType dtype;
  };
  static constexpr Row kRows[] = {{0, 8, DType::kINT8},   {0, 32, DType::kINT32}, {1, 8, DType::kUINT8},
                                  {1, 32, DType::kUINT32}, {2, 16, DType::kFP16},  {2, 32, DType::kFP32},
                                  {4, 16, DType::kBF16},   {10, 8, DType::kFP8E4M3}};
  for (const Row& r : kRows) {
    if (t.lanes == 1 && t.code == r.code && t.bits == r.bits) return r.dtype;
  }
  return std::nullopt;
}
}  // namespace dl

// torch.Tensor and torch's dtype objects once torch has been imported by the caller (deca never
// imports torch itself). Held as raw new references that are never released: objects that
// outlive the interpreter must not be decref'd by static destructors at exit.
struct TorchHooks {
  PyObject* tensor_type = nullptr;
  // torch dtype objects (singletons, compared by identity) and the deca dtype of each.
  struct Dtype {
    PyObject* object;
    DType dtype;
  };
  Dtype dtypes[8] = {};
  int num_dtypes = 0;
  // Interned attribute names: a C-string name would be turned into a new str on every call.
  PyObject* dtype_name = nullptr;
  PyObject* shape_name = nullptr;
  PyObject* stride_name = nullptr;
  PyObject* data_ptr_name = nullptr;
  PyObject* get_device_name = nullptr;
  PyObject* is_cpu_name = nullptr;
  PyObject* is_cuda_name = nullptr;
  // DLPack's C exchange API of torch.Tensor (exact type only: the table is the type's), or null
  // (an older torch, or DECA_PY_DLPACK_EXCHANGE=0: the attribute route, for comparisons).
  const dl::ExchangeApi* exchange = nullptr;
};

const TorchHooks& torch_hooks() {
  static TorchHooks hooks;
  if (hooks.tensor_type) return hooks;
  PyObject* modules = PyImport_GetModuleDict();  // borrowed
  PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed
  if (!torch) return hooks;
  PyObject* type = PyObject_GetAttrString(torch, "Tensor");
  if (!type || !PyType_Check(type)) {
    PyErr_Clear();
    Py_XDECREF(type);
    return hooks;
  }
  static constexpr std::pair<const char*, DType> kNames[] = {
      {"bfloat16", DType::kBF16}, {"float16", DType::kFP16},         {"float32", DType::kFP32},
      {"float8_e4m3fn", DType::kFP8E4M3}, {"int8", DType::kINT8},   {"uint8", DType::kUINT8},
      {"int32", DType::kINT32},  {"uint32", DType::kUINT32}};
  for (const auto& [name, dtype] : kNames) {
    PyObject* object = PyObject_GetAttrString(torch, name);
    if (!object) {
      PyErr_Clear();  // an older torch without uint32 or float8: those go the checked path
      continue;
    }
    hooks.dtypes[hooks.num_dtypes++] = {object, dtype};
  }
  hooks.dtype_name = PyUnicode_InternFromString("dtype");
  hooks.shape_name = PyUnicode_InternFromString("shape");
  hooks.stride_name = PyUnicode_InternFromString("stride");
  hooks.data_ptr_name = PyUnicode_InternFromString("data_ptr");
  hooks.get_device_name = PyUnicode_InternFromString("get_device");
  hooks.is_cpu_name = PyUnicode_InternFromString("is_cpu");
  hooks.is_cuda_name = PyUnicode_InternFromString("is_cuda");
  const char* env = std::getenv("DECA_PY_DLPACK_EXCHANGE");
  if (!(env && env[0] == '0' && env[1] == '\0')) {
    PyObject* capsule = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
    if (capsule && PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
      const auto* api =
          static_cast<const dl::ExchangeApi*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
      // Major version 1 is the layout above; the capsule stays referenced with the type.
      if (api && api->header.version.major == 1 && api->dltensor_from_py_object_no_sync) {
        hooks.exchange = api;
      }
    }
    PyErr_Clear();
    Py_XDECREF(capsule);
  }
  hooks.tensor_type = type;
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

// Steals a new reference; throws (after clearing the Python error) when it is null.
nb::object checked(PyObject* result, const FastWhere& where, const char* what) {
  if (!result) {
    PyErr_Clear();
    throw Error(where.str() + ": could not read the torch tensor's " + what);
  }
  return nb::steal(result);
}

std::int64_t as_int(PyObject* object, const FastWhere& where, const char* what) {
  const long long value = PyLong_AsLongLong(object);
  if (value == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(where.str() + ": could not read the torch tensor's " + what);
  }
  return value;
}

// The tensor's dtype as the caller declared it: fp8 bits in uint8 are the one relabelling the
// fast path takes; the rest is checked.
DType settle_dtype(DType dtype, std::optional<DType> declared, const FastWhere& where) {
  if (!declared) return dtype;
  const DType want = *declared;
  if (dtype != want && !(dtype == DType::kUINT8 && want == DType::kFP8E4M3)) {
    throw Error(where.str() + ": expected dtype " + dtype_name(want) + ", got " + dtype_name(dtype));
  }
  return want;
}

// The view through DLPack's C exchange API, written into `out` (made by the caller, so that the
// per-call import copies no Tensor); false where the attribute route must decide (the call
// declined the tensor, or a dtype or device it reports is not one deca names here).
bool torch_view_exchange(const dl::ExchangeApi& api, nb::handle object,
                         std::optional<DType> declared, const FastWhere& where, Tensor& out) {
  dl::Tensor t{};
  if (api.dltensor_from_py_object_no_sync(object.ptr(), &t) != 0) {
    PyErr_Clear();
    return false;
  }
  const std::optional<DType> dtype = dl::dtype_of(t.dtype);
  if (!dtype || (t.device.type != dl::kCpu && t.device.type != dl::kCuda)) return false;
  if (t.ndim < 0 || t.ndim > kMaxRank || (t.ndim > 0 && !t.shape)) {
    throw Error(where.str() + ": expected rank <= " + std::to_string(kMaxRank) + ", got " +
                std::to_string(t.ndim));
  }
  std::int64_t steps[kMaxRank];
  if (t.strides) {
    for (int i = 0; i < t.ndim; ++i) steps[i] = t.strides[i];
  } else {
    std::int64_t step = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      steps[i] = step;
      step *= t.shape[i];
    }
  }
  const DType settled = settle_dtype(*dtype, declared, where);
  out.origin_dtype = dtype_name(settled);
  out.view = make_tensor(static_cast<char*>(t.data) + t.byte_offset, settled, t.ndim, t.shape, steps,
                         t.device.type == dl::kCpu ? Device::cpu() : Device::cuda(t.device.id));
  return true;
}

Tensor torch_view(const TorchHooks& torch, nb::handle object, std::optional<DType> declared,
                  const FastWhere& where) {
  PyObject* o = object.ptr();
  const nb::object dtype_object = checked(PyObject_GetAttr(o, torch.dtype_name), where, "dtype");
  std::optional<DType> dtype;
  for (int i = 0; i < torch.num_dtypes; ++i) {
    if (torch.dtypes[i].object == dtype_object.ptr()) dtype = torch.dtypes[i].dtype;
  }
  if (!dtype) throw Error(where.str() + ": a torch dtype deca reads through its checked path");
  dtype = settle_dtype(*dtype, declared, where);
  const nb::object shape = checked(PyObject_GetAttr(o, torch.shape_name), where, "shape");
  const nb::object strides =
      checked(PyObject_CallMethodNoArgs(o, torch.stride_name), where, "stride");
  const nb::object data =
      checked(PyObject_CallMethodNoArgs(o, torch.data_ptr_name), where, "data_ptr");
  const nb::object device =
      checked(PyObject_CallMethodNoArgs(o, torch.get_device_name), where, "device");
  if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(strides.ptr())) {
    throw Error(where.str() + ": could not read the torch tensor's shape");
  }
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape.ptr());
  if (rank > kMaxRank || PyTuple_GET_SIZE(strides.ptr()) != rank) {
    throw Error(where.str() + ": expected rank <= " + std::to_string(kMaxRank) + ", got " +
                std::to_string(rank));
  }
  std::int64_t sizes[kMaxRank];
  std::int64_t steps[kMaxRank];
  for (Py_ssize_t i = 0; i < rank; ++i) {
    sizes[i] = as_int(PyTuple_GET_ITEM(shape.ptr(), i), where, "shape");
    steps[i] = as_int(PyTuple_GET_ITEM(strides.ptr(), i), where, "stride");
  }
  const std::int64_t index = as_int(device.ptr(), where, "device");
  // get_device() is -1 for CPU tensors and the index for CUDA ones, but also -1 for meta
  // tensors and an index for other accelerators: confirm the kind.
  const nb::object kind = checked(
      PyObject_GetAttr(o, index < 0 ? torch.is_cpu_name : torch.is_cuda_name), where, "device");
  if (kind.ptr() != Py_True) {
    throw Error(where.str() + ": expected a CPU or CUDA torch tensor");
  }
  void* pointer = PyLong_AsVoidPtr(data.ptr());
  if (!pointer && PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(where.str() + ": could not read the torch tensor's data_ptr");
  }
  Tensor t;
  t.origin_dtype = dtype_name(*dtype);
  t.view = make_tensor(pointer, *dtype, static_cast<int>(rank), sizes, steps,
                       index < 0 ? Device::cpu() : Device::cuda(static_cast<int>(index)));
  return t;
}


// call_key's buffer: the encoding of a call's arguments, on the stack (a call's key is a few
// hundred bytes: 97 at most a tensor; a longer one is declined and keyed in Python). Each value
// starts with a tag byte and has a fixed layout or a length, so that two different argument
// lists never encode to the same bytes.
struct KeyBuffer {
  char bytes[2048];
  std::size_t size = 0;

  bool put(const void* data, std::size_t n) {
    if (n > sizeof bytes - size) return false;
    std::memcpy(bytes + size, data, n);
    size += n;
    return true;
  }
  bool tag(char t) { return put(&t, 1); }
};

// A torch tensor in call_key without the exchange API (an older torch, or
// DECA_PY_DLPACK_EXCHANGE=0): its shape, its dtype object (torch's dtypes are singletons: the
// object names the dtype for the process) and get_device() read through the Python C API, under
// a tag of their own.
bool append_torch_attributes(KeyBuffer& key, PyObject* o, const TorchHooks& torch) {
  const nb::object shape = nb::steal(PyObject_GetAttr(o, torch.shape_name));
  const nb::object dtype = nb::steal(PyObject_GetAttr(o, torch.dtype_name));
  const nb::object device = nb::steal(PyObject_CallMethodNoArgs(o, torch.get_device_name));
  if (!shape.is_valid() || !dtype.is_valid() || !device.is_valid() ||
      !PyTuple_Check(shape.ptr())) {
    PyErr_Clear();
    return false;
  }
  const std::uint64_t rank = static_cast<std::uint64_t>(PyTuple_GET_SIZE(shape.ptr()));
  const std::uintptr_t dtype_id = reinterpret_cast<std::uintptr_t>(dtype.ptr());
  const long long index = PyLong_AsLongLong(device.ptr());
  if ((index == -1 && PyErr_Occurred()) || !key.tag('a') || !key.put(&rank, sizeof rank) ||
      !key.put(&dtype_id, sizeof dtype_id) || !key.put(&index, sizeof index)) {
    PyErr_Clear();
    return false;
  }
  for (std::uint64_t i = 0; i < rank; ++i) {
    const long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    if ((size == -1 && PyErr_Occurred()) || !key.put(&size, sizeof size)) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

// call_key's encoding of one argument; false for an argument it does not describe (or a key
// past the buffer). `tensors`: whether a torch tensor is described by its metadata here (an
// item of call_key's `tensors`); an option's value (`values`) must be a plain value.
bool append_key(KeyBuffer& key, PyObject* o, const TorchHooks& torch, bool tensors, int depth) {
  if (o == Py_None) return key.tag('N');
  if (o == Py_True || o == Py_False) return key.tag(o == Py_True ? 'T' : 'F');
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    return key.tag('i') && key.put(&v, sizeof v);
  }
  if (PyFloat_CheckExact(o)) {
    const double v = PyFloat_AS_DOUBLE(o);
    return key.tag('f') && key.put(&v, sizeof v);
  }
  if (PyUnicode_CheckExact(o)) {
    Py_ssize_t n = 0;
    const char* text = PyUnicode_AsUTF8AndSize(o, &n);
    if (!text) {
      PyErr_Clear();
      return false;
    }
    const std::uint64_t size = static_cast<std::uint64_t>(n);
    return key.tag('s') && key.put(&size, sizeof size) && key.put(text, size);
  }
  if (PyTuple_CheckExact(o)) {
    const std::uint64_t n = static_cast<std::uint64_t>(PyTuple_GET_SIZE(o));
    if (depth >= 4 || !key.tag('(') || !key.put(&n, sizeof n)) return false;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (!append_key(key, PyTuple_GET_ITEM(o, i), torch, tensors, depth + 1)) return false;
    }
    return true;
  }
  if (tensors && torch.tensor_type &&
      Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(torch.tensor_type)) {
    dl::Tensor t{};
    if (torch.exchange && torch.exchange->dltensor_from_py_object_no_sync(o, &t) == 0) {
      if (t.ndim < 0 || t.ndim > kMaxRank || (t.ndim > 0 && !t.shape)) return false;
      const std::int64_t head[6] = {t.ndim, t.device.type, t.device.id, t.dtype.code,
                                    t.dtype.bits, t.dtype.lanes};
      return key.tag('t') && key.put(head, sizeof head) &&
             key.put(t.shape, sizeof(std::int64_t) * static_cast<std::size_t>(t.ndim));
    }
    PyErr_Clear();
    return append_torch_attributes(key, o, torch);
  }
  return false;
}

}  // namespace

Tensor import_fast(nb::handle object, std::optional<DType> declared, const FastWhere& where,
                   bool writable) {
  const TorchHooks& torch = torch_hooks();
  if (torch.tensor_type &&
      PyObject_TypeCheck(object.ptr(), reinterpret_cast<PyTypeObject*>(torch.tensor_type))) {
    // The caller's frame holds the tensor for the whole call, so the view needs no owner.
    Tensor t;
    if (torch.exchange && Py_TYPE(object.ptr()) == reinterpret_cast<PyTypeObject*>(torch.tensor_type) &&
        torch_view_exchange(*torch.exchange, object, declared, where, t)) {
      return t;
    }
    return torch_view(torch, object, declared, where);
  }
  // A deca.Tensor (the Python layer's one-off calls hand their own imports to a plan's run):
  // deca.Tensor's rules, as _tensors.tensor applies them; no second import.
  Tensor* imported = nullptr;
  if (nb::try_cast(object, imported, false) && imported != nullptr) {
    if (declared && imported->view.dtype != *declared) {
      throw Error(where.str() + ": expected dtype " + dtype_name(*declared) + ", got " +
                  dtype_name(imported->view.dtype) + " (a deca.Tensor)");
    }
    if (writable && !imported->output.is_valid()) {
      throw Error(where.str() + ": expected a writable tensor, got a deca.Tensor of read-only memory");
    }
    return *imported;
  }
  // jax arrays are immutable but DLPack cannot say so: refuse them as outputs here, as the
  // Python import does. (After the torch test: the module lookup is not free.)
  if (writable && is_jax_array(object)) {
    throw Error(where.str() + ": expected a writable array, got an immutable jax array");
  }
  const std::optional<std::string> dtype =
      declared ? std::optional<std::string>(dtype_name(*declared)) : std::nullopt;
  return import_tensor(object, dtype, where.str(), writable);
}

// Test probes (not API): the view one route makes of a torch tensor, as (data pointer, shape,
// strides, dtype, device kind, device index), or None where that route declines it (the
// exchange route: absent from this torch or turned off, or the call refused the tensor).
void register_fast_import(nb::module_& m) {

  // A bytes object naming what identifies a call's shape, for the prepared-call memos of the
  // plan-less entry points (deca._tensors.call_key). `tensors`: a tuple of the call's tensor
  // arguments, each a torch.Tensor described by its rank, shape, dtype and device (read through
  // DLPack's C exchange API, no Python attribute access; without it, through the attributes),
  // None, a plain value (an int for a length, say) or a tuple of these; `values`: a tuple of the
  // call's options, each None, a bool, an int, a float, a str or a tuple of these, described by
  // its value. None when an item is anything else (another array library, a torch subclass, a
  // tensor among the values, which its metadata would not name): the Python layer then builds
  // its own key.
  m.def("call_key", [](nb::handle tensors, nb::handle values) -> nb::object {
    if (!PyTuple_CheckExact(tensors.ptr()) || !PyTuple_CheckExact(values.ptr())) {
      return nb::none();
    }
    const TorchHooks& torch = torch_hooks();
    KeyBuffer key;
    if (!append_key(key, tensors.ptr(), torch, true, 0) ||
        !append_key(key, values.ptr(), torch, false, 0)) {
      return nb::none();
    }
    return nb::bytes(key.bytes, key.size);
  }, nb::arg("tensors"), nb::arg("values"));
  m.def("_torch_exchange_available", [] { return torch_hooks().exchange != nullptr; });
  m.def("_torch_import_probe", [](nb::handle object, const std::string& route) -> nb::object {
    const TorchHooks& torch = torch_hooks();
    if (!torch.tensor_type ||
        !PyObject_TypeCheck(object.ptr(), reinterpret_cast<PyTypeObject*>(torch.tensor_type))) {
      throw Error("_torch_import_probe: expected a torch.Tensor");
    }
    const FastWhere where{"_torch_import_probe", "tensor"};
    std::optional<Tensor> t;
    if (route == "exchange") {
      Tensor view;
      if (torch.exchange && torch_view_exchange(*torch.exchange, object, std::nullopt, where, view)) {
        t = std::move(view);
      }
    } else if (route == "attributes") {
      t = torch_view(torch, object, std::nullopt, where);
    } else {
      throw Error("_torch_import_probe: route: expected 'exchange' or 'attributes', got '" + route + "'");
    }
    if (!t) return nb::none();
    const TensorView& v = t->view;
    nb::list shape, strides;
    for (int i = 0; i < v.rank; ++i) {
      shape.append(v.shape[i]);
      strides.append(v.stride[i]);
    }
    return nb::make_tuple(reinterpret_cast<std::uintptr_t>(v.data), nb::tuple(shape), nb::tuple(strides),
                          std::string(dtype_name(v.dtype)),
                          v.device.kind == DeviceKind::kCPU ? "cpu" : "cuda", v.device.index);
  });
}

}  // namespace deca::python
