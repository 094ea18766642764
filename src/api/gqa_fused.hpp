// The fused decode step's part of gqa_decode's validation and params (GqaConfig::rope_style,
// GqaDecodeArgs::k_new .. positions): kept apart from the plain decode's checks, which call in.
#pragma once

#include <string_view>

#include "deca/gqa.hpp"
#include "kernels/gqa/params.cuh"

namespace deca::api {

inline bool is_fused(const GqaConfig& c) { return c.rope_style != RopeStyle::kNone; }
// The rotary dims a fused config rotates (rotary_dim 0 = head_dim).
inline int rotary_dims(const GqaConfig& c) { return c.rotary_dim == 0 ? c.head_dim : c.rotary_dim; }

// rope_style and rotary_dim of a config (`prefix`.rope_style, `prefix`.rotary_dim in messages).
void validate_rope_config(std::string_view fn, std::string_view prefix, const GqaConfig& c);

// The fused arguments against the plan (absent for a plain plan), the caches as outputs against
// every input, out, lse and `workspace` (the bytes the kernels write) against the fused inputs.
void check_fused_args(const GqaPlan& plan, const GqaDecodeArgs& a, const TensorView& workspace);

// A fused call's host data (the CPU only): every rotary position a row of cos_sin_cache. Called
// after the lengths are checked, so that a length below q_len is reported as seq_lens[b] (as the
// checked GPU run reports it), not as the negative position it implies.
void check_fused_host_data(const GqaConfig& c, const GqaDecodeArgs& a);

// The params' fused fields (left zero for a plain plan).
void fill_fused_params(GqaParams& p, const GqaConfig& c, const GqaDecodeArgs& a);

}  // namespace deca::api
