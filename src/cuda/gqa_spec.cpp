#include "cuda/gqa_spec.hpp"

#include "kernels/gqa/sm90/balance.cuh"

#include <cstdlib>
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
  if (ctas_per_sm != 2) s += "_c" + to_string(ctas_per_sm);
  if (two_term()) s += "_2term";
  if (fp8_path() == kv::kTwoTermQk) s += "_2tqk";
  if (fp8_path() == kv::kWidenLdsm) s += "_ldsm";
  if (wgmma()) s += "_wgmma";
  if (wgmma() && stages > 0) s += "_st" + to_string(stages);
  if (wgmma() && warpgroups == 2) s += "_wg2";
  if (wgmma() && overlap) s += "_ov";
  if (wgmma() && balanced) s += "_bal";
  if (wgmma() && rows_on_m) s += "_rm";
  if (checked) s += "_chk";
  return s;
}

jit::JitSpec GqaKernelKey::spec() const {
  using std::to_string;
  const auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  const auto constant = [](const char* type, const char* field, const std::string& value) {
    return std::string("  static constexpr ") + type + " " + field + " = " + value + ";\n";
  };
  std::string src = "// " + name() + "\nstruct Cfg {\n";
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
  src += constant("int", "kCtasPerSm", to_string(ctas_per_sm));
  src += constant("int", "kBeamWidth", to_string(beam_width));
  src += constant("int", "kFp8Mma", to_string(fp8_path()));
  // Only when set: an unchecked kernel's source (so its cache key and code) stays what it was.
  if (checked) src += constant("bool", "kChecked", "true");
  if (wgmma()) {  // the Hopper kernel's own fields (kernels/gqa/sm90/traits.cuh)
    src += constant("int", "kStages", to_string(stages));
    src += constant("int", "kWarpgroups", to_string(warpgroups));
    src += constant("bool", "kOverlapQk", b(overlap));
    src += constant("bool", "kBalanced", b(balanced));
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

GqaKernelKey make_gqa_key(const GqaConfig& config, int arch, int sm_count) {
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
  key.ctas_per_sm = 2;
  if (const char* env = std::getenv("DECA_GQA_CTAS")) {
    const int v = std::atoi(env);
    if (v == 2 || v == 3) key.ctas_per_sm = v;
  }
  // mma.sync m16n8k32 .e4m3 exists from sm_89 on, but only sm_89 (Ada) runs it on the tensor
  // cores (QMMA.16832.F32.E4M3). ptxas for sm_90a lowers it to an e4m3 -> fp16 unpack of both
  // operands and two HMMA.16816 into zeroed accumulators plus FADDs (Hopper's fp8 tensor cores
  // are reached through wgmma only): the widening path's conversions with twice its mma work.
  // So the default is two-term on sm_89 and the ldmatrix-fed widening elsewhere
  // (docs/perf-notes.md, issue 8).
  // int8 mma.sync m16n8k32 (IMMA.16832.S8.S8) is native on sm_80 and every later arch, so the
  // int8 two-term paths may run anywhere. Measured on the H200 (356eea9, KV GB/s, copy 4295):
  // QK on IMMA with PV widened (two_term_qk) 3241 / 3096 / 2888 / 2961 on l70-b99-4k /
  // l70-b560-2k / l70-b128-2k / q235-b64-4k, both products on IMMA (two_term) 3210 / 3048 /
  // 2820 / 2895, the widening 2905 / 2825 / 2636 / 2643: two_term_qk is the sm_90 default; the
  // other arches keep the widening until measured there.
  const int kind = kv::kind_of(key.kv_dtype);
  const bool fp8 = kind == kv::kKvFp8;
  const bool two_term_ok = fp8 ? arch >= 89 : true;
  // The Hopper kernel: e4m3 wgmma (QGMMA), the fp8 tensor cores mma.sync cannot reach on sm_90a.
  const bool wgmma_ok = arch == 90 && gqa::sm90::supports(key.head_dim, key.kv_dtype, key.beam_width);
  const int rows_needed = config.beam_width * config.max_q_len * key.group;
  key.fp8_mma = wgmma_ok && gqa::sm90::default_for(rows_needed) ? kv::kWgmma
                : fp8 && arch == 89                  ? kv::kTwoTerm
                : kind == kv::kKvInt8 && arch == 90 ? kv::kTwoTermQk
                                                    : kv::kWidenLdsm;
  if (const char* env = std::getenv("DECA_GQA_FP8_MMA")) {
    const std::string v = env;
    if (v == "widen") key.fp8_mma = kv::kWiden;
    if (v == "widen_ldsm") key.fp8_mma = kv::kWidenLdsm;
    if (v == "two_term" && two_term_ok) key.fp8_mma = kv::kTwoTerm;
    if (v == "two_term_qk" && !fp8) key.fp8_mma = kv::kTwoTermQk;
    if (v == "wgmma" && wgmma_ok) key.fp8_mma = kv::kWgmma;
  }
  key.rows = key.wgmma() ? gqa::sm90::rows_per_cta(rows_needed) : gqa::rows_per_cta(rows_needed);
  if (key.wgmma()) {
    const int row_blocks = (rows_needed + key.rows - 1) / key.rows;
    const long long units = static_cast<long long>(config.max_batch) * config.num_kv_heads * row_blocks;
    key.stages = gqa::sm90::stages_for_grid(key.rows, units, sm_count);
  }
  if (const char* env = std::getenv("DECA_GQA_SM90_WG");
      env && key.wgmma() && key.rows <= 32 && std::atoi(env) == 2) {
    key.warpgroups = 2;
  }
  if (const char* env = std::getenv("DECA_GQA_SM90_OVERLAP");
      env && key.wgmma() && key.warpgroups == 1 && key.rows <= 16 && std::atoi(env) == 1) {
    key.overlap = true;
  }
  // 32 or 64 rows: the rows-on-M kernel (decode_rows.cuh), unless DECA_GQA_SM90_ROWS_M=0.
  if (key.wgmma() && key.warpgroups == 1 && !key.overlap && (key.rows == 32 || key.rows == 64)) {
    const char* env = std::getenv("DECA_GQA_SM90_ROWS_M");
    key.rows_on_m = !(env && std::atoi(env) == 0);
  }
  // The balanced schedule (DECA_GQA_SM90_BALANCED=1, a knob): a grid of as many CTAs as the SMs
  // hold (three per SM at two stages) shares the batch's tiles (kernels/gqa/sm90/balance.cuh).
  // Predicted to help where the grid of units does not fill whole waves of three CTAs per SM, it
  // measured slower on every fp8 row on the H200 (docs/perf-notes.md), so it stays off by
  // default. Never with the fixed split: its promise is a partition that depends on a request's
  // own length only.
  const long long max_tiles = (config.max_seq_len + gqa::sm90::kTile - 1) / gqa::sm90::kTile;
  if (key.wgmma() && key.warpgroups == 1 && !key.overlap && key.rows <= 16 &&
      config.split_mode != SplitMode::kFixed &&
      gqa::sm90::line_fits(config.max_batch, config.num_kv_heads, max_tiles)) {
    const char* env = std::getenv("DECA_GQA_SM90_BALANCED");
    key.balanced = env && std::atoi(env) == 1;
    if (key.balanced) key.stages = 2;
  }
  if (const char* env = std::getenv("DECA_GQA_SM90_STAGES"); env && key.wgmma()) {
    const int v = std::atoi(env);
    if (v >= 2 && v <= 8 &&
        gqa::sm90::smem_bytes(gqa::sm90::make_plan(key.rows, v, key.warpgroups, key.rows_on_m)) <= 227 * 1024) {
      key.stages = v;
    }
  }
  return key;
}

}  // namespace deca::cuda
