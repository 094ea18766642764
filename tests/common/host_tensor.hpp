// A small owning host tensor for tests: contiguous storage of any deca dtype, a TensorView of
// it, and element access by flat index with the value decoded to / rounded from float.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "deca/quant.hpp"
#include "deca/tensor.hpp"

namespace deca::test {

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    const std::size_t bytes = static_cast<std::size_t>(numel()) * dtype_size(dtype_);
    storage_.assign((bytes + 7) / 8 + 1, 0);  // 8-byte aligned, never empty
  }

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const {
    return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1},
                           std::multiplies<std::int64_t>());
  }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  void* raw() { return storage_.data(); }
  const void* raw() const { return storage_.data(); }
  template <typename T> T* data() { return reinterpret_cast<T*>(storage_.data()); }
  template <typename T> const T* data() const { return reinterpret_cast<const T*>(storage_.data()); }

  // Row-major contiguous view on the CPU.
  TensorView view() const {
    std::vector<std::int64_t> strides(shape_.size());
    std::int64_t s = 1;
    for (int i = static_cast<int>(shape_.size()) - 1; i >= 0; --i) {
      strides[i] = s;
      s *= shape_[i];
    }
    return make_tensor(const_cast<std::uint64_t*>(storage_.data()), dtype_,
                       static_cast<int>(shape_.size()), shape_.data(), strides.data());
  }

  // Every byte set to b (e.g. 0xFF: NaN in bf16, fp16, fp32 and fp8 e4m3).
  void fill_bytes(std::uint8_t b) { std::memset(storage_.data(), b, bytes()); }

  float get(std::int64_t i) const {
    switch (dtype_) {
      case DType::kBF16: return bf16_to_float(data<std::uint16_t>()[i]);
      case DType::kFP16: return fp16_to_float(data<std::uint16_t>()[i]);
      case DType::kFP32: return data<float>()[i];
      case DType::kFP8E4M3: return fp8e4m3_to_float(data<std::uint8_t>()[i]);
      case DType::kINT8: return data<std::int8_t>()[i];
      case DType::kUINT8: return data<std::uint8_t>()[i];
      case DType::kINT32: return static_cast<float>(data<std::int32_t>()[i]);
      case DType::kUINT32: return static_cast<float>(data<std::uint32_t>()[i]);
    }
    return 0.f;
  }

  // Rounds to nearest even into the dtype (int8: rounded and clamped to [-127, 127]).
  void set(std::int64_t i, float v) {
    switch (dtype_) {
      case DType::kBF16: data<std::uint16_t>()[i] = float_to_bf16(v); break;
      case DType::kFP16: data<std::uint16_t>()[i] = float_to_fp16(v); break;
      case DType::kFP32: data<float>()[i] = v; break;
      case DType::kFP8E4M3: data<std::uint8_t>()[i] = float_to_fp8e4m3(v); break;
      case DType::kINT8: {
        float r = std::nearbyint(v);
        r = r > 127.f ? 127.f : (r < -127.f ? -127.f : r);
        data<std::int8_t>()[i] = static_cast<std::int8_t>(r);
        break;
      }
      case DType::kUINT8: data<std::uint8_t>()[i] = static_cast<std::uint8_t>(v); break;
      case DType::kINT32: data<std::int32_t>()[i] = static_cast<std::int32_t>(v); break;
      case DType::kUINT32: data<std::uint32_t>()[i] = static_cast<std::uint32_t>(v); break;
    }
  }

 private:
  DType dtype_ = DType::kFP32;
  std::vector<std::int64_t> shape_;
  std::vector<std::uint64_t> storage_;
};

// Values of a float-like dtype x rounded into it and decoded back.
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kBF16: return bf16_to_float(float_to_bf16(x));
    case DType::kFP16: return fp16_to_float(float_to_fp16(x));
    case DType::kFP8E4M3: return fp8e4m3_to_float(float_to_fp8e4m3(x));
    default: return x;
  }
}

// Whether the first `bytes` bytes of two tensors are equal (bit-exact results).
inline bool same_bytes(const HostTensor& a, const HostTensor& b, long long bytes) {
  return std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(bytes)) == 0;
}

}  // namespace deca::test
