// The JitSpec of the sm90a MLA sparse decode kernel a plan of `num_heads` runs at `page_size`, as
// the tests build it: the backend's own (MlaKernelKey::spec, src/cuda/mla_spec.cpp), plus for the
// timing-only builds Cfg::kAblate (kernels/mla/sm90/config.cuh Ablate), which only tests set
// (with_ablation, for any key's spec).
#pragma once

#include <string>

#include "cuda/mla_spec.hpp"
#include "jit/spec.hpp"
#include "kernels/mla/params.cuh"

namespace deca::test {

// `spec` with Cfg::kAblate = `ablate` in its prologue and "_ablate<n>" in its name (0: unchanged).
inline jit::JitSpec with_ablation(jit::JitSpec spec, int ablate) {
  if (ablate == 0) return spec;
  const std::string field = "  static constexpr int kAblate = " + std::to_string(ablate) + ";\n";
  spec.source.insert(spec.source.find("};\n"), field);
  spec.name += "_ablate" + std::to_string(ablate);
  spec.source.replace(0, spec.source.find('\n'), "// " + spec.name);
  return spec;
}

// `dense_format` >= 0: the dense decode kernel of that cache format (MlaKvFormat), as
// mla_decode_key makes it.
inline jit::JitSpec mla_sm90_spec(int page_size, int num_heads, int ablate = 0, int dense_format = -1) {
  cuda::MlaKernelKey key;
  key.arch = 90;
  key.role = cuda::MlaKernelRole::kDecode;
  key.variant = "sm90";
  key.page_size = page_size;
  key.dense = dense_format >= 0;
  if (key.dense) key.kv_format = dense_format;
  key.sm90 = mla::sm90::kernel_class(num_heads, key.dense && dense_format != kMlaKvFP8Sparse);
  return with_ablation(key.spec(), ablate);
}

}  // namespace deca::test
