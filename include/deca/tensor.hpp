// Non-owning tensor views: what every deca entry point takes. A view carries a pointer, a dtype,
// a shape and strides in elements, and the device the memory lives on. deca never allocates or
// frees the memory a view points at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace deca {

// The numeric values are part of the ABI: kernels/ and the params structs carry them as ints.
enum class DType : int {
  kBF16 = 0,
  kFP16 = 1,
  kFP32 = 2,
  kFP8E4M3 = 3,  // e4m3fn: no infinities, 0x7F / 0xFF are NaN
  kINT8 = 4,
  kUINT8 = 5,  // raw bytes (the MLA 656-byte FP8 token)
  kINT32 = 6,
  kUINT32 = 7,
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

enum class DeviceKind : int { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;
  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::kCUDA, index}; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};
std::string to_string(Device device);

inline constexpr int kMaxRank = 6;

// A view with rank 0 and a null pointer is "absent": optional arguments are passed that way.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFP32;
  int rank = 0;
  std::int64_t shape[kMaxRank] = {};
  std::int64_t stride[kMaxRank] = {};  // in elements, not bytes
  Device device = {};

  bool defined() const { return data != nullptr || rank > 0; }
  std::int64_t numel() const;
  std::int64_t size(int dim) const { return shape[dim < 0 ? dim + rank : dim]; }
  bool is_contiguous() const;
  // "[2, 3, 4] bf16 on cuda:0"; used in error messages.
  std::string describe() const;
};

// Row-major contiguous view.
TensorView make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                       Device device = {});
// Explicit strides (elements).
TensorView make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                       std::initializer_list<std::int64_t> strides, Device device = {});
TensorView make_tensor(void* data, DType dtype, int rank, const std::int64_t* shape,
                       const std::int64_t* strides, Device device = {});

}  // namespace deca
