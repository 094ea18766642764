// Ahead-of-time compilation of the GQA kernel a config needs, with or without a GPU.
#include <string>

#include "api/check.hpp"
#include "api/gqa_config.hpp"
#include "cuda/backend.hpp"
#include "deca/gqa.hpp"

namespace deca {

namespace {
constexpr const char* kFn = "precompile_gqa_decode";
}  // namespace

std::string precompile_gqa_decode(const GqaConfig& config, int compute_capability) {
  if (compute_capability != 0) {
    // The device plays no part: validate everything else as a plan would.
    GqaConfig c = config;
    c.device = Device::cpu();
    api::validate_gqa_config(kFn, "config", c);
    api::expect_compile_capability(kFn, compute_capability);
    return cuda::precompile_gqa(config, compute_capability);
  }
  api::validate_gqa_config(kFn, "config", config);
  if (config.device.kind != DeviceKind::kCUDA) {
    api::fail(kFn, "config.device",
              "a CUDA device (or a compute_capability to compile for without one)",
              to_string(config.device));
  }
  const int cc = cuda::gqa_arch(config, kFn);
  return cuda::precompile_gqa(config, cc);
}

}  // namespace deca
