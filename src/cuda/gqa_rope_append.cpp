// The fused decode step's rotate and append as two launches of their own (kernels/gqa/
// rope_append.cuh): deca-bench --fused's "rotate + append + decode" baseline, and the GPU tests'
// separate path. Takes a fused plan's params (the plain decode then reads q_out and the cache).
#include <string>

#include "cuda/backend.hpp"
#include "cuda/gqa_spec.hpp"
#include "jit/driver.hpp"
#include "jit/kernel_cache.hpp"

namespace deca::cuda {

jit::JitSpec gqa_rope_append_spec(const GqaConfig& c, int arch) {
  using std::to_string;
  const int style = static_cast<int>(c.rope_style);
  const int rotary = c.rotary_dim == 0 ? c.head_dim : c.rotary_dim;
  jit::JitSpec spec;
  spec.name = "gqa_rope_append_d" + to_string(c.head_dim) + "_p" + to_string(c.page_size) + "_q" +
              dtype_name(c.q_dtype) + "_kv" + dtype_name(c.kv_dtype) + (style == 1 ? "_neox" : "_gptj") +
              to_string(rotary);
  spec.source = "// " + spec.name + "\nstruct Cfg {\n  static constexpr int kHeadDim = " + to_string(c.head_dim) +
                ";\n  static constexpr int kQDtype = " + to_string(static_cast<int>(c.q_dtype)) +
                ";\n  static constexpr int kKvDtype = " + to_string(static_cast<int>(c.kv_dtype)) +
                ";\n  static constexpr int kPageSize = " + to_string(c.page_size) +
                ";\n  static constexpr int kRopeStyle = " + to_string(style) +
                ";\n  static constexpr int kRotaryDim = " + to_string(rotary) +
                ";\n};\n#include \"kernels/gqa/rope_append.cuh\"\n";
  spec.entry = "deca_gqa_rope_append";
  spec.arch = arch;
  return spec;
}

void gqa_rope_append(const GqaPlan& plan, const GqaParams& params, void* q_out, int mode, void* stream) {
  if (params.batch == 0) return;
  const int device = plan.config.device.index;
  jit::ScopedDevice scope(device);
  const int arch = compute_capability(device);
  const jit::LoadedKernel& kernel = jit::get_kernel(gqa_rope_append_spec(plan.config, arch), device);
  const int heads = mode == 0 ? params.num_q_heads : params.num_kv_heads;
  jit::Dim3 grid;
  grid.x = static_cast<unsigned>(params.batch * params.q_len);
  grid.y = static_cast<unsigned>((heads * (params.head_dim / 2) + 127) / 128);
  jit::Dim3 block;
  block.x = 128;
  void* args[] = {const_cast<GqaParams*>(&params), &q_out, &mode};
  jit::launch(kernel, grid, block, 0, stream, args, gqa_launch_options(arch));
}

}  // namespace deca::cuda
