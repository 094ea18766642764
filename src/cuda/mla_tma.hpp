// Dense bf16 MLA rows by TMA on sm_90a (kernels/mla/sm90/rows.cuh, Cfg::kTma): which plans take
// it, the tensor map's parameters (pure functions, table-tested on the host) and its encoding
// through the driver, once per run (the cache's address may change from call to call).
#pragma once

#include <cstdint>

#include "kernels/mla/schedule/work.cuh"
#include "kernels/mla/sm90/traits.cuh"

namespace deca::cuda {

// Whether the sm90 decode kernel of a plan reads its rows by TMA: dense bf16 rows in a cluster of
// 2 (65..128 heads, where the register producers bound the kernel: docs/perf-notes-mla.md) with
// a page size that is a multiple of 64 (64, 128, 256, 576, ...): a block of 64 tokens is then 64
// consecutive slots of one page, one box per chunk. Smaller pages would take 64 / page boxes per
// chunk through as many block-table entries; they keep the register producers.
bool mla_dense_tma_rows(bool dense, int kv_format, const mla::sm90::KernelClass& k, int page_size);

// The cuTensorMapEncodeTiled arguments for a bf16 cache [num_blocks, page_size, 1, 576] at `kv`
// with byte strides `stride_block` and `stride_slot`: rank 3, innermost first {576 dims,
// page_size slots, num_blocks blocks}, strides {stride_slot, stride_block}, box {64, 64, 1},
// element strides 1, 128-byte swizzle (one box = one 64 x 128 B chunk of the tile: rows.cuh),
// zeros outside the tensor. `ok` is false when the driver would refuse the map (the address not
// 16-byte aligned, a stride not a multiple of 16 or at or above 2^40, no block, a page of fewer
// than 64 slots): the run then tells the kernel to take its register producers. Past the API's
// checks that leaves a cache of one block, whose block stride is never taken and so may be
// anything (MlaDenseGpu.TmaRowsWherePlansTakeThem runs it).
struct DenseRowsMap {
  bool ok = false;
  std::uint64_t dims[3] = {0, 0, 0};
  std::uint64_t strides[2] = {0, 0};  // bytes, of dims 1 and 2
  std::uint32_t box[3] = {0, 0, 0};
  std::uint32_t element_strides[3] = {1, 1, 1};
};
DenseRowsMap dense_rows_map(const void* kv, long long stride_block, long long stride_slot, int page_size,
                            int num_blocks);

// Fills `map` (the TMA rows kernel's second parameter) and kp.dense.use_map for a run from kp.p
// (the cache's address, byte strides, page size and block count): the map when dense_rows_map is
// ok, else use_map 0 (`map` untouched). Throws a deca::Error naming `fn` when the driver refuses a
// map it should accept.
void encode_dense_rows_map(mla::DecodeKernelParams& kp, mla::TensorMapBytes& map, const char* fn);

}  // namespace deca::cuda
