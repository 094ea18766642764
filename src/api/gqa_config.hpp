// GqaConfig validation, shared by plan_gqa_decode (which checks the caller's config) and
// gqa_decode (which checks the config of a plan plan_gqa_decode did not make or that was edited
// since: a plan is a plain struct that a caller may have built by hand).
#pragma once

#include <string_view>

#include "deca/gqa.hpp"

namespace deca::api {

// `prefix` names the config in messages: "config" or "plan.config".
void validate_gqa_config(std::string_view fn, std::string_view prefix, const GqaConfig& config);

// The config the one-shot gqa_decode(config, args) plans with: the caller's (dtypes, features,
// scalars), with the maxima and the sizes taken from the tensors (num_q_heads from q; head_dim,
// page_size and num_kv_heads from k_cache, the model's truth, so that a q that differs is
// blamed on q). A field taken from a tensor is checked on that tensor first, so
// that a message names the caller's argument ("gqa_decode: q: ...") and never a config field
// the caller did not write. max_seq_len stays the caller's when > 0 (a promise every request
// must keep), else it is what page_table can address.
GqaConfig oneshot_gqa_config(const GqaConfig& config, const GqaDecodeArgs& args);

// plan_gqa_decode without the validation, for a config already validated (the one-shot call's):
// the plan, marked validated (GqaPlan::validated).
GqaPlan plan_validated_gqa(const GqaConfig& config);

}  // namespace deca::api
