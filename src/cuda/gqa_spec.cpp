#include "cuda/gqa_spec.hpp"

#include <string>
#include <utility>

namespace deca::cuda {

namespace {
const char* short_dtype(int dtype) { return dtype_name(static_cast<DType>(dtype)); }
}  // namespace

// Names and sources are built with std::to_string and string appends, never iostreams: a module
// that links libstdc++ statically (manylinux-style builds, some default toolchains) can run with
// an uninitialised iostream locale, where `stream << int` drops the digits or crashes.
std::string GqaKernelKey::name() const {
  using std::to_string;
  std::string s = "gqa_sm" + to_string(arch) + "_d" + to_string(head_dim) + "_g" +
                  to_string(group) + "_r" + to_string(rows) + "_p" + to_string(page_size) + "_q" +
                  short_dtype(q_dtype) + "_kv" + short_dtype(kv_dtype) + "_o" +
                  short_dtype(out_dtype);
  if (window) s += "_win";
  if (tree) s += "_tree";
  if (softcap) s += "_cap";
  if (beam_width > 1) s += "_beam" + to_string(beam_width);
  if (two_term()) s += "_2term";
  if (fp8_path() == kv::kTwoTermQk) s += "_2tqk";
  if (fp8_path() == kv::kWidenLdsm) s += "_ldsm";
  if (wgmma()) s += "_wgmma";
  if (wgmma() && stages > 0) s += "_st" + to_string(stages);
  if (wgmma() && rows_on_m) s += "_rm";
  if (checked) s += "_chk";
  if (skip) s += "_skip";
  if (rope_style != 0) s += (rope_style == 1 ? "_neox" : "_gptj") + to_string(rotary_dim);
  if (stamps) s += "_stamp";
  return s;
}

jit::JitSpec GqaKernelKey::spec() const {
  using std::to_string;
  const auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  const auto constant = [](const char* type, const char* field, const std::string& value) {
    return std::string("  static constexpr ") + type + " " + field + " = " + value + ";\n";
  };
  std::string src = "// " + name() + "\n";
  // A macro, before every include (kernels/gqa/stamps.cuh says why); absent otherwise.
  if (stamps) src += "#define DECA_GQA_STAMPS 1\n";
  src += "struct Cfg {\n";
  src += constant("int", "kHeadDim", to_string(head_dim));
  src += constant("int", "kGroup", to_string(group));
  src += constant("int", "kRows", to_string(rows));
  src += constant("int", "kPageSize", to_string(page_size));
  src += constant("int", "kQDtype", to_string(q_dtype));
  src += constant("int", "kKvDtype", to_string(kv_dtype));
  src += constant("int", "kOutDtype", to_string(out_dtype));
  src += constant("bool", "kWindow", b(window));
  src += constant("bool", "kTree", b(tree));
  src += constant("bool", "kSoftcap", b(softcap));
  src += constant("int", "kBeamWidth", to_string(beam_width));
  src += constant("int", "kFp8Mma", to_string(fp8_path()));
  // Only when set: an unchecked kernel's source (so its cache key and code) stays what it was.
  if (checked) src += constant("bool", "kChecked", "true");
  if (skip) src += constant("bool", "kSkip", "true");
  // Likewise only for a fused plan: a plain kernel's source stays what it was.
  if (rope_style != 0) {
    src += constant("int", "kRopeStyle", to_string(rope_style));
    src += constant("int", "kRotaryDim", to_string(rotary_dim));
  }
  if (wgmma()) {  // the Hopper kernel's own fields (kernels/gqa/sm90/traits.cuh)
    src += constant("int", "kStages", to_string(stages));
    src += constant("bool", "kRowsOnM", b(rows_on_m));
  }
  src += wgmma() ? "};\n#include \"kernels/gqa/sm90/entry.cuh\"\n" : "};\n#include \"kernels/gqa/sm80/entry.cuh\"\n";
  jit::JitSpec spec;
  spec.name = name();
  spec.source = std::move(src);
  spec.entry = "deca_gqa_decode";
  spec.arch = arch;
  return spec;
}

GqaKernelKey make_gqa_key(const GqaConfig& config, int arch, int sm_count, int path_arch, bool hopper_16bit) {
  GqaKernelKey key;
  key.arch = arch;
  key.head_dim = config.head_dim;
  key.group = config.num_q_heads / config.num_kv_heads;
  key.beam_width = config.beam_width;
  key.page_size = config.page_size;
  key.q_dtype = static_cast<int>(config.q_dtype);
  key.kv_dtype = static_cast<int>(config.kv_dtype);
  key.out_dtype = static_cast<int>(config.out_dtype);
  key.window = config.window > 0;
  key.tree = config.tree_mask;
  key.softcap = config.softcap > 0.f;
  key.checked = config.checked;
  key.skip = config.skip_softmax_factor > 0.f;
  if (config.rope_style != RopeStyle::kNone) {
    key.rope_style = static_cast<int>(config.rope_style);
    key.rotary_dim = config.rotary_dim == 0 ? config.head_dim : config.rotary_dim;
  }
  const int paths = path_arch != 0 ? path_arch : arch;
  // fp8: mma.sync m16n8k32 .e4m3 exists from sm_89 on, but only sm_89 (Ada) runs it on the tensor
  // cores (QMMA.16832.F32.E4M3). ptxas for sm_90a lowers it to an e4m3 -> fp16 unpack of both
  // operands and two HMMA.16816 into zeroed accumulators plus FADDs (Hopper's fp8 tensor cores
  // are reached through wgmma only): the widening path's conversions with twice its mma work,
  // measured 11-32 % slower than the widening on the H200. So sm_89 takes the two-term path,
  // sm_90a the Hopper kernel on wgmma where it applies (head_dim 128, no beams; it beats the
  // portable kernel at every rows value, 8 to 64), and the rest the ldmatrix-fed widening.
  // int8: mma.sync m16n8k32 .s8 (IMMA.16832.S8.S8) is native on sm_80 and every later arch. On
  // the H200 QK on IMMA with PV widened (two_term_qk) was the fastest int8 path (ahead of both
  // products on IMMA and of the widening), so it is sm_90's; the other arches keep the widening,
  // measured nowhere else. docs/perf-notes.md has the figures.
  const int kind = kv::kind_of(key.kv_dtype);
  const int rows_needed = config.beam_width * config.max_q_len * key.group;
  // Skip-softmax runs on the Hopper kernel at every rows value, fp8 and 16-bit alike: up to 16
  // rows on wgmma's N (sm90/skip.cuh, "_wgmma_st3_skip"), 32 and 64 on its M (sm90/skip_rows.cuh,
  // "_wgmma_rm_skip"). 16-bit caches take the Hopper kernel where the plan asks for it
  // (hopper_16bit: the default, DECA_GQA_SM90_16BIT=0 not).
  const bool fp8_ok = gqa::sm90::supports(key.head_dim, key.kv_dtype, key.beam_width);
  const bool b16_ok = hopper_16bit && gqa::sm90::supports_16bit(key.head_dim, key.kv_dtype, key.beam_width);
  const bool wgmma_ok = arch == 90 && paths == 90 && (fp8_ok || b16_ok);
  key.fp8_mma = wgmma_ok                                      ? kv::kWgmma
                : kind == kv::kKvFp8 && paths == 89 && arch >= 89 ? kv::kTwoTerm
                : kind == kv::kKvInt8 && paths == 90           ? kv::kTwoTermQk
                                                               : kv::kWidenLdsm;
  key.rows = key.wgmma() ? gqa::sm90::rows_per_cta(rows_needed) : gqa::rows_per_cta(rows_needed);
  if (key.wgmma()) {
    const int row_blocks = (rows_needed + key.rows - 1) / key.rows;
    const long long units = static_cast<long long>(config.max_batch) * config.num_kv_heads * row_blocks;
    // The rows-on-N skip kernel's ring takes a three-stage plan's six slots (sm90/skip.cuh); the
    // rows-on-M one the default two-stage plan's four (sm90/skip_rows.cuh: stages 0, as its exact
    // kernel, so the two differ in the name by "_skip" alone).
    key.stages = key.skip && key.rows <= 16 ? 3
                           : gqa::sm90::stages_for_grid(key.rows, units, sm_count, gqa::sm90::kv_bytes_of(key.kv_dtype),
                                                        key.head_dim);
    // 32 or 64 rows: the rows on wgmma's M (decode_rows.cuh); up to 16 on N (decode.cuh).
    key.rows_on_m = key.rows >= 32;
  }
  return key;
}

jit::LaunchOptions gqa_launch_options(int arch) {
  jit::LaunchOptions o;
  o.pdl = arch >= 90;
  return o;
}

}  // namespace deca::cuda
