#include "cuda/gqa_spec.hpp"

#include <cstdlib>
#include <sstream>

namespace deca::cuda {

namespace {
const char* short_dtype(int dtype) { return dtype_name(static_cast<DType>(dtype)); }
}  // namespace

std::string GqaKernelKey::name() const {
  std::ostringstream s;
  s << "gqa_sm" << arch << "_d" << head_dim << "_g" << group << "_r" << rows << "_p" << page_size
    << "_q" << short_dtype(q_dtype) << "_kv" << short_dtype(kv_dtype) << "_o"
    << short_dtype(out_dtype);
  if (window) s << "_win";
  if (tree) s << "_tree";
  if (softcap) s << "_cap";
  if (beam_width > 1) s << "_beam" << beam_width;
  if (ctas_per_sm != 2) s << "_c" << ctas_per_sm;
  return s.str();
}

jit::JitSpec GqaKernelKey::spec() const {
  std::ostringstream src;
  const auto b = [](bool v) { return v ? "true" : "false"; };
  src << "// " << name() << "\n"
      << "struct Cfg {\n"
      << "  static constexpr int kHeadDim = " << head_dim << ";\n"
      << "  static constexpr int kGroup = " << group << ";\n"
      << "  static constexpr int kRows = " << rows << ";\n"
      << "  static constexpr int kPageSize = " << page_size << ";\n"
      << "  static constexpr int kQDtype = " << q_dtype << ";\n"
      << "  static constexpr int kKvDtype = " << kv_dtype << ";\n"
      << "  static constexpr int kOutDtype = " << out_dtype << ";\n"
      << "  static constexpr bool kWindow = " << b(window) << ";\n"
      << "  static constexpr bool kTree = " << b(tree) << ";\n"
      << "  static constexpr bool kSoftcap = " << b(softcap) << ";\n"
      << "  static constexpr int kCtasPerSm = " << ctas_per_sm << ";\n"
      << "  static constexpr int kBeamWidth = " << beam_width << ";\n"
      << "};\n"
      << "#include \"kernels/gqa/entry.cuh\"\n";
  jit::JitSpec spec;
  spec.name = name();
  spec.source = src.str();
  spec.entry = "deca_gqa_decode";
  spec.arch = arch;
  return spec;
}

GqaKernelKey make_gqa_key(const GqaConfig& config, int arch) {
  GqaKernelKey key;
  key.arch = arch;
  key.head_dim = config.head_dim;
  key.group = config.num_q_heads / config.num_kv_heads;
  key.beam_width = config.beam_width;
  key.rows = gqa::rows_per_cta(config.beam_width * config.max_q_len * key.group);
  key.page_size = config.page_size;
  key.q_dtype = static_cast<int>(config.q_dtype);
  key.kv_dtype = static_cast<int>(config.kv_dtype);
  key.out_dtype = static_cast<int>(config.out_dtype);
  key.window = config.window > 0;
  key.tree = config.tree_mask;
  key.softcap = config.softcap > 0.f;
  key.ctas_per_sm = 2;
  if (const char* env = std::getenv("DECA_GQA_CTAS")) {
    const int v = std::atoi(env);
    if (v == 2 || v == 3) key.ctas_per_sm = v;
  }
  return key;
}

}  // namespace deca::cuda
