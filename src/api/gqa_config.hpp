// GqaConfig validation, shared by plan_gqa_decode (which checks the caller's config) and
// gqa_decode (which re-checks the config inside the plan it is given: a plan is a plain struct
// that a caller may have built or edited by hand).
#pragma once

#include <string_view>

#include "deca/gqa.hpp"

namespace deca::api {

// `prefix` names the config in messages: "config" or "plan.config".
void validate_gqa_config(std::string_view fn, std::string_view prefix, const GqaConfig& config);

}  // namespace deca::api
