#include "deca/tensor.hpp"

#include <string>

#include "deca/error.hpp"
#include "deca/version.hpp"

namespace deca {

const char* version() { return DECA_VERSION; }

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
    case DType::kINT32:
    case DType::kUINT32:
      return 4;
    case DType::kFP8E4M3:
    case DType::kINT8:
    case DType::kUINT8:
      return 1;
  }
  throw Error("dtype_size: unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kINT8: return "int8";
    case DType::kUINT8: return "uint8";
    case DType::kINT32: return "int32";
    case DType::kUINT32: return "uint32";
  }
  return "unknown";
}

std::string to_string(Device device) {
  return device.kind == DeviceKind::kCPU ? std::string("cpu")
                                         : "cuda:" + std::to_string(device.index);
}

std::int64_t TensorView::numel() const {
  // Unsigned for the same reason as make_tensor's strides: expect_sizes refuses a count that
  // does not fit 64 bits before an op uses it.
  std::uint64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= static_cast<std::uint64_t>(shape[i]);
  return static_cast<std::int64_t>(n);
}

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorView::describe() const {
  if (!defined()) return "absent";
  // String appends, not an ostream (see float_string in src/api/check.cpp).
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "] ";
  s += dtype_name(dtype);
  s += " on ";
  s += to_string(device);
  return s;
}

TensorView make_tensor(void* data, DType dtype, int rank, const std::int64_t* shape,
                       const std::int64_t* strides, Device device) {
  if (rank < 0 || rank > kMaxRank) {
    throw Error("make_tensor: rank: expected 0.." + std::to_string(kMaxRank) + ", got " +
                std::to_string(rank));
  }
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  t.device = device;
  std::int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = strides ? strides[i] : expected;
    // Unsigned: a row-major stride of an absurd shape wraps instead of overflowing (undefined
    // behaviour); the ops' size checks refuse such views before any stride is used.
    expected = static_cast<std::int64_t>(static_cast<std::uint64_t>(expected) *
                                         static_cast<std::uint64_t>(shape[i]));
  }
  return t;
}

TensorView make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                       Device device) {
  return make_tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(), nullptr, device);
}

TensorView make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                       std::initializer_list<std::int64_t> strides, Device device) {
  if (shape.size() != strides.size()) {
    throw Error("make_tensor: strides: expected " + std::to_string(shape.size()) +
                " entries (one per dim), got " + std::to_string(strides.size()));
  }
  return make_tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(), strides.begin(),
                     device);
}

}  // namespace deca
