// Ahead-of-time compilation of the GQA kernel a config needs, with or without a GPU.
#include <algorithm>
#include <string>
#include <vector>

#include "api/check.hpp"
#include "api/gqa_config.hpp"
#include "cuda/backend.hpp"
#include "deca/gqa.hpp"
#include "jit/nvrtc_compile.hpp"

namespace deca {

namespace {

constexpr const char* kFn = "precompile_gqa_decode";

std::string list_string(const std::vector<int>& values) {
  std::string s;
  for (int v : values) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s;
}

// The kernels need mma.sync and cp.async (8.0+); beyond that, whatever this NVRTC can target.
void check_capability(int cc) {
  std::vector<int> archs = jit::nvrtc_supported_archs();
  archs.erase(std::remove_if(archs.begin(), archs.end(), [](int a) { return a < 80; }),
              archs.end());
  const bool known = archs.empty() || std::find(archs.begin(), archs.end(), cc) != archs.end();
  if (cc < 80 || !known) {
    api::fail(kFn, "compute_capability",
              archs.empty() ? std::string("0 (the device's) or >= 80")
                            : "0 (the device's) or one this NVRTC targets: " + list_string(archs),
              std::to_string(cc));
  }
}

}  // namespace

std::string precompile_gqa_decode(const GqaConfig& config, int compute_capability) {
  if (compute_capability != 0) {
    // The device plays no part: validate everything else as a plan would.
    GqaConfig c = config;
    c.device = Device::cpu();
    api::validate_gqa_config(kFn, "config", c);
    check_capability(compute_capability);
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
