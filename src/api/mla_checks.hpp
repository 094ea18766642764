// The MLA argument checks that dense and sparse decode share (src/api/mla_api.cpp defines them;
// mla_sparse_api.cpp runs sparse decode with them). Every check throws the deca::Error of
// check.hpp ("<fn>: <argument>: expected ..., got ...") before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "deca/mla.hpp"

namespace deca::api::mla {

inline constexpr const char* kPlanDevice = "plan.config.device";
inline constexpr const char* kRowWhy =
    "row starts 16-byte aligned: GPU kernels load rows as 16-byte vectors";

std::string s(std::int64_t v);

// kDefault resolved: bf16 for dense decode, the 656-byte token for sparse.
MlaCacheFormat stored_format(const MlaConfig& c);
inline bool is_model1(const MlaConfig& c) { return c.kv_format == MlaCacheFormat::kModel1; }
// q's last dim and the default softmax scale's: 512 for kModel1, 576 otherwise.
inline int dim_qk(const MlaConfig& c) { return is_model1(c) ? kMlaModel1DimQK : kMlaDimQK; }
// The params' MlaKvFormat of a plan's cache.
int kernel_format(const MlaConfig& c);

// The plan (its config, and that it was made for this mode), q / out / lse, and the cache (in
// the plan's kv_format), in this order.
void check_plan_and_common(const char* fn, const MlaPlan& plan, bool sparse, const TensorView& q,
                           const TensorView& out, const TensorView& lse, const TensorView& kv);

// A kModel1 cache: [num_blocks, page_size, 1, 584] uint8 on `device`, dim 1 = page_size (`why`
// names where the caller's page size comes from), slot stride 584, block stride >=
// mla_model1_page_bytes(page_size) and a multiple of 16, data 16-byte aligned.
void check_model1_cache(const char* fn, std::string_view arg, const TensorView& kv, Device device,
                        int page_size, std::string_view why);

void check_softmax_scale(const char* fn, const MlaConfig& c, float v);
// A CUDA run's scratch: plan.workspace_bytes on the plan's device, 16-byte aligned.
void check_workspace(const char* fn, const MlaPlan& plan, const void* ws, std::size_t bytes);

}  // namespace deca::api::mla
