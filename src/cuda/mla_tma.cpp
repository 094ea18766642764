#include "cuda/mla_tma.hpp"

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "deca/error.hpp"
#include "jit/driver.hpp"
#include "kernels/mla/params.cuh"

namespace deca::cuda {

static_assert(sizeof(CUtensorMap) == sizeof(mla::TensorMapBytes), "a CUtensorMap fills kv_map");
static_assert(alignof(mla::TensorMapBytes) >= alignof(CUtensorMap), "kv_map is aligned as a CUtensorMap");
static_assert(alignof(mla::TensorMapBytes) >= 64, "the copy unit reads the map 64-byte aligned");

bool mla_dense_tma_rows(bool dense, int kv_format, const mla::sm90::KernelClass& k, int page_size) {
  return dense && kv_format == kMlaKvBF16 && !k.direct && k.cluster == 2 && page_size >= mla::sm90::kTokens &&
         page_size % mla::sm90::kTokens == 0;
}

DenseRowsMap dense_rows_map(const void* kv, long long stride_block, long long stride_slot, int page_size,
                            int num_blocks) {
  DenseRowsMap m;
  constexpr long long kStrideLimit = 1ll << 40;
  const auto stride_ok = [&](long long s) { return s > 0 && s % 16 == 0 && s < kStrideLimit; };
  const bool ok = reinterpret_cast<std::uintptr_t>(kv) % 16 == 0 && stride_ok(stride_block) &&
                  stride_ok(stride_slot) && num_blocks > 0 && page_size >= mla::sm90::kTokens &&
                  page_size % mla::sm90::kTokens == 0;
  if (!ok) return m;
  m.ok = true;
  m.dims[0] = mla::sm90::kDimQK;
  m.dims[1] = static_cast<std::uint64_t>(page_size);
  m.dims[2] = static_cast<std::uint64_t>(num_blocks);
  m.strides[0] = static_cast<std::uint64_t>(stride_slot);
  m.strides[1] = static_cast<std::uint64_t>(stride_block);
  m.box[0] = 64;  // one chunk: 64 bf16 = the 128 bytes the 128-byte swizzle spans
  m.box[1] = static_cast<std::uint32_t>(mla::sm90::kTokens);
  m.box[2] = 1;
  return m;
}

void encode_dense_rows_map(mla::DecodeKernelParams& kp, mla::TensorMapBytes& map_out, const char* fn) {
  const MlaSparseParams& p = kp.p;
  const DenseRowsMap m = dense_rows_map(p.kv, p.kv_stride_block, p.kv_stride_slot, p.page_size, p.num_blocks);
  kp.dense.use_map = 0;
  if (!m.ok) return;
  CUtensorMap map;
  const CUresult rc = jit::driver().TensorMapEncodeTiled(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<unsigned char*>(p.kv), m.dims, m.strides, m.box,
      m.element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    const char* name = nullptr;
    jit::driver().GetErrorName(rc, &name);
    throw Error(std::string(fn) + ": kv_cache: expected a cache cuTensorMapEncodeTiled maps (" +
                std::to_string(m.dims[2]) + " blocks of " + std::to_string(m.dims[1]) + " slots, strides " +
                std::to_string(m.strides[1]) + " / " + std::to_string(m.strides[0]) + " bytes), got " +
                (name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(rc))));
  }
  std::memcpy(&map_out, &map, sizeof(map));
  kp.dense.use_map = 1;
}

}  // namespace deca::cuda
