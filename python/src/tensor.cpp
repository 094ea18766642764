// DLPack object -> deca::TensorView, in one place, so that every op sees the same rules:
// dtype from the DLPack (code, bits), shape and element strides as given, device CPU or CUDA.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"

namespace deca::python {
namespace {

// DLPack 1.1 type code of float8 e4m3fn (newer than nanobind's dtype_code enum).
constexpr std::uint8_t kDLFloat8E4M3Fn = 10;
// DLPack device types.
constexpr int kDLCPU = 1;
constexpr int kDLCUDA = 2;
constexpr int kDLCUDAHost = 3;  // pinned host memory: the CPU backend reads it directly

// The dtype as array libraries spell it, for messages ("uint16", "float64", "bfloat16").
std::string dlpack_dtype_name(nb::dlpack::dtype dt) {
  std::string base;
  switch (dt.code) {
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int): base = "int"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt): base = "uint"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float): base = "float"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat): base = "bfloat"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Complex): base = "complex"; break;
    case static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool): return "bool";
    case kDLFloat8E4M3Fn: return "float8_e4m3fn";
    default: base = "dlpack_code" + std::to_string(dt.code) + "_";
  }
  std::string name = base + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

std::optional<DType> native_dtype(nb::dlpack::dtype dt) {
  if (dt.lanes != 1) return std::nullopt;
  using Code = nb::dlpack::dtype_code;
  const auto code = dt.code;
  if (code == static_cast<std::uint8_t>(Code::Bfloat) && dt.bits == 16) return DType::kBF16;
  if (code == static_cast<std::uint8_t>(Code::Float) && dt.bits == 16) return DType::kFP16;
  if (code == static_cast<std::uint8_t>(Code::Float) && dt.bits == 32) return DType::kFP32;
  if (code == kDLFloat8E4M3Fn && dt.bits == 8) return DType::kFP8E4M3;
  if (code == static_cast<std::uint8_t>(Code::Int) && dt.bits == 8) return DType::kINT8;
  if (code == static_cast<std::uint8_t>(Code::UInt) && dt.bits == 8) return DType::kUINT8;
  if (code == static_cast<std::uint8_t>(Code::Int) && dt.bits == 32) return DType::kINT32;
  if (code == static_cast<std::uint8_t>(Code::UInt) && dt.bits == 32) return DType::kUINT32;
  return std::nullopt;
}

// Raw-bit containers that may carry a dtype the array library lacks: 16-bit integers hold
// bf16/fp16 bits, uint8 holds fp8 bits. Only these reinterpretations are allowed, so that a
// declared dtype never silently relabels real numbers.
bool holds_bits_of(nb::dlpack::dtype dt, DType declared) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes != 1) return false;
  const bool is_int = dt.code == static_cast<std::uint8_t>(Code::Int) ||
                      dt.code == static_cast<std::uint8_t>(Code::UInt);
  switch (declared) {
    case DType::kBF16:
    case DType::kFP16:
      return is_int && dt.bits == 16;
    case DType::kFP8E4M3:
      return dt.code == static_cast<std::uint8_t>(Code::UInt) && dt.bits == 8;
    default:
      return false;
  }
}

template <typename Array>
Tensor view_of(Array array, const std::optional<std::string>& declared, const std::string& where) {
  Tensor t;
  const nb::dlpack::dtype dt = array.dtype();
  t.origin_dtype = dlpack_dtype_name(dt);

  DType dtype;
  const std::optional<DType> native = native_dtype(dt);
  if (declared) {
    const DType want = parse_dtype(*declared, where);
    if (native && *native == want) {
      dtype = want;
    } else if (holds_bits_of(dt, want)) {
      dtype = want;
    } else {
      const char* bits = want == DType::kBF16 || want == DType::kFP16 ? " (or its bits as uint16)"
                         : want == DType::kFP8E4M3                   ? " (or its bits as uint8)"
                                                                     : "";
      throw Error(where + ": expected dtype " + dtype_name(want) + bits + ", got " +
                  t.origin_dtype);
    }
  } else if (native) {
    dtype = *native;
  } else if (dt.bits == 16 && (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
                               dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt))) {
    throw Error(where + ": expected bf16 or fp16, got " + t.origin_dtype +
                " bits without a dtype keyword saying which (e.g. q_dtype=\"bf16\")");
  } else {
    throw Error(where + ": expected dtype bf16, fp16, fp32, fp8_e4m3, int8, uint8, int32 or "
                        "uint32, got " + t.origin_dtype);
  }

  const std::size_t rank = array.ndim();
  if (rank > static_cast<std::size_t>(kMaxRank)) {
    throw Error(where + ": expected rank <= " + std::to_string(kMaxRank) + ", got " +
                std::to_string(rank));
  }

  Device device;
  switch (array.device_type()) {
    case kDLCPU:
    case kDLCUDAHost:
      device = Device::cpu();
      break;
    case kDLCUDA:
      device = Device::cuda(array.device_id());
      break;
    default:
      throw Error(where + ": expected a CPU or CUDA tensor, got DLPack device type " +
                  std::to_string(array.device_type()));
  }

  std::int64_t shape[kMaxRank];
  std::int64_t strides[kMaxRank];
  for (std::size_t i = 0; i < rank; ++i) {
    shape[i] = static_cast<std::int64_t>(array.shape(i));
    strides[i] = array.stride(i);
  }
  // data() already includes the DLPack byte_offset.
  t.view = make_tensor(const_cast<void*>(static_cast<const void*>(array.data())), dtype,
                       static_cast<int>(rank), shape, strides, device);
  return t;
}

std::string python_type_name(nb::handle object) {
  return nb::cast<std::string>(nb::type_name(object.type()));
}

bool is_jax(nb::handle object) {
  nb::object module = nb::getattr(object.type(), "__module__", nb::none());
  if (!nb::isinstance<nb::str>(module)) return false;
  const std::string name = nb::cast<std::string>(module);
  return name.rfind("jax", 0) == 0;  // jax, jaxlib
}

}  // namespace

DType parse_dtype(const std::string& name, const std::string& where) {
  static constexpr DType kAll[] = {DType::kBF16,  DType::kFP16,  DType::kFP32,  DType::kFP8E4M3,
                                   DType::kINT8,  DType::kUINT8, DType::kINT32, DType::kUINT32};
  for (DType d : kAll) {
    if (name == dtype_name(d)) return d;
  }
  throw Error(where + ": expected a dtype name (bf16, fp16, fp32, fp8_e4m3, int8, uint8, int32, "
                      "uint32), got \"" + name + "\"");
}

Tensor import_tensor(nb::handle object, const std::optional<std::string>& declared,
                     const std::string& where, bool writable) {
  if (writable) {
    nb::ndarray<> array;
    if (!nb::try_cast(object, array, false)) {
      throw Error(where + ": expected a writable DLPack tensor (numpy, torch, cupy, jax), got " +
                  python_type_name(object) + (nb::hasattr(object, "__dlpack__") ? " (read-only?)" : ""));
    }
    Tensor t = view_of(array, declared, where);
    t.output = array;
    return t;
  }
  nb::ndarray<nb::ro> array;
  if (!nb::try_cast(object, array, false)) {
    throw Error(where + ": expected a DLPack tensor (numpy, torch, cupy, jax), got " +
                python_type_name(object));
  }
  Tensor t = view_of(array, declared, where);
  t.input = array;
  // Whether the memory could also be imported for writing: a deca.Tensor made for reading may
  // later be passed as an output, and must not then write into read-only memory. jax arrays
  // are immutable although plain DLPack does not say so.
  nb::ndarray<> writable_array;
  if (!is_jax(object) && nb::try_cast(object, writable_array, false)) t.output = writable_array;
  return t;
}

void register_tensor(nb::module_& m) {
  nb::enum_<DeviceKind>(m, "DeviceKind")
      .value("CPU", DeviceKind::kCPU)
      .value("CUDA", DeviceKind::kCUDA);

  nb::class_<Device>(m, "Device")
      .def(nb::init<>())
      .def_rw("kind", &Device::kind)
      .def_rw("index", &Device::index)
      .def("__eq__", [](const Device& a, const Device& b) { return a == b; })
      .def("__repr__", [](const Device& d) { return to_string(d); });

  nb::class_<Tensor>(m, "Tensor",
                     "A DLPack tensor as deca sees it (pointer, dtype, shape, element strides, "
                     "device). Keeps the source memory alive.")
      .def(
          "__init__",
          [](Tensor* self, nb::handle object, std::optional<std::string> dtype, std::string where,
             bool writable) {
            new (self) Tensor(import_tensor(object, dtype, where, writable));
          },
          nb::arg("object"), nb::arg("dtype").none() = nb::none(), nb::arg("where") = "tensor",
          nb::arg("writable") = false)
      .def_prop_ro("dtype", [](const Tensor& t) { return std::string(dtype_name(t.view.dtype)); })
      .def_prop_ro("origin_dtype", [](const Tensor& t) { return t.origin_dtype; })
      .def_prop_ro("shape",
                   [](const Tensor& t) {
                     nb::list s;
                     for (int i = 0; i < t.view.rank; ++i) s.append(t.view.shape[i]);
                     return nb::tuple(s);
                   })
      .def_prop_ro("strides",
                   [](const Tensor& t) {
                     nb::list s;
                     for (int i = 0; i < t.view.rank; ++i) s.append(t.view.stride[i]);
                     return nb::tuple(s);
                   })
      .def_prop_ro("device", [](const Tensor& t) { return t.view.device; })
      .def_prop_ro("writable", [](const Tensor& t) { return t.output.is_valid(); },
                   "whether the memory may be written (an output may be given as this tensor)")
      .def_prop_ro("data_ptr",
                   [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.view.data); })
      .def_prop_ro("nbytes",
                   [](const Tensor& t) {
                     return static_cast<std::size_t>(t.view.numel()) * dtype_size(t.view.dtype);
                   })
      .def("__repr__", [](const Tensor& t) { return "deca.Tensor(" + t.view.describe() + ")"; });

  m.def("parse_dtype", [](const std::string& name, const std::string& where) {
    return std::string(dtype_name(parse_dtype(name, where)));
  });
}

}  // namespace deca::python
