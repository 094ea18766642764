// A GQA kernel specialization: the small value type that the JIT compiles, caches and names.
// Its name() is the cache key prefix, the test parameter name and what deca-bench prints.
#pragma once

#include <string>

#include "deca/gqa.hpp"
#include "jit/spec.hpp"
#include "kernels/gqa/sm90/traits.cuh"
#include "kernels/gqa/sm80/traits.cuh"

namespace deca::cuda {

struct GqaKernelKey {
  int arch = 90;        // compute capability, 90 = sm_90a
  int head_dim = 128;
  int group = 8;        // q heads per kv head
  int rows = 16;        // rows per CTA (rows_per_cta of kernels/gqa/sm80/traits.cuh or sm90/traits.cuh)
  int page_size = 16;
  int q_dtype = 0;      // deca::DType values
  int kv_dtype = 0;
  int out_dtype = 0;
  bool window = false;
  bool tree = false;
  bool softcap = false;
  int ctas_per_sm = 2;  // occupancy the kernel is built for (kernels/gqa/sm80/traits.cuh make_shape)
  int beam_width = 1;   // beams of a request sharing one CTA (their common pages read once)
  // 8-bit caches: kv::kWiden / kv::kWidenLdsm (fp16 mma, sm_80+) or kv::kTwoTerm (fp8: e4m3
  // mma, sm_89+; int8: int8 mma, sm_80+); int8 also kv::kTwoTermQk (QK on int8 mma, PV widened);
  // ignored (and not named) for 16-bit caches.
  int fp8_mma = kv::kWiden;
  // The Hopper kernel's pipeline stages (0: its default, kernels/gqa/sm90/traits.cuh); "_st<n>".
  // Set by DECA_GQA_SM90_STAGES, a tuning knob.
  int stages = 0;
  // The Hopper kernel's warpgroups per CTA (1, or 2 sharing each tile); "_wg2". Set by
  // DECA_GQA_SM90_WG, a tuning knob.
  int warpgroups = 1;
  // The Hopper kernel with the next tile's QK issued under this tile's softmax and PV; "_ov". Set
  // by DECA_GQA_SM90_OVERLAP=1 (one warpgroup, up to 16 rows), a tuning knob.
  bool overlap = false;
  // The Hopper kernel's balanced schedule (kernels/gqa/sm90/balance.cuh): a grid of as many CTAs
  // as the SMs hold shares the batch's tiles evenly; "_bal". Set by DECA_GQA_SM90_BALANCED=1 (one
  // warpgroup, up to 16 rows, split_mode kAuto), a tuning knob: measured slower.
  bool balanced = false;
  // The Hopper kernel with the query rows on wgmma's M (kernels/gqa/sm90/decode_rows.cuh): 32 or
  // 64 rows, one warpgroup; "_rm". Whenever the Hopper kernel runs 32 or 64 rows, unless
  // DECA_GQA_SM90_ROWS_M=0 (the tokens-on-M kernel's 32 / 64-row variants, a knob).
  bool rows_on_m = false;
  // Checked mode (GqaConfig::checked): page ids and lengths range-tested in the kernel; "_chk".
  bool checked = false;

  // The path the kernel takes: fp8_mma for an 8-bit cache; 16-bit caches have one path.
  int fp8_path() const {
    switch (kv::kind_of(kv_dtype)) {
      case kv::kKvFp8: return fp8_mma == kv::kTwoTermQk ? kv::kWidenLdsm : fp8_mma;  // int8 only
      case kv::kKvInt8: return fp8_mma == kv::kWgmma ? kv::kWidenLdsm : fp8_mma;     // fp8 only
      default: return kv::kWiden;
    }
  }
  bool two_term() const { return fp8_path() == kv::kTwoTerm; }
  // The Hopper kernel (kernels/gqa/sm90/): fp8, head_dim 128, no beams, sm_90a.
  bool wgmma() const { return fp8_path() == kv::kWgmma; }

  // e.g. "gqa_sm90_d128_g8_r16_p32_qbf16_kvfp8_obf16_win_tree_cap"
  std::string name() const;
  // The generated prologue + #include "kernels/gqa/sm80/entry.cuh".
  jit::JitSpec spec() const;
  gqa::Shape shape() const {
    return wgmma() ? gqa::sm90::make_shape(rows, stages, warpgroups, rows_on_m)
                   : gqa::make_shape(head_dim, rows, kv_dtype, ctas_per_sm);
  }
};

// The key a plan needs on a device of compute capability `arch`. DECA_GQA_CTAS=2|3 in the
// environment overrides the occupancy choice (a tuning knob; it is part of the kernel name).
// fp8 caches take the two-term e4m3 path on sm_89 (native e4m3 mma.sync) and the ldmatrix-fed
// widening elsewhere (sm_90a emulates e4m3 mma.sync with fp16 HMMA; gqa_spec.cpp says why);
// int8 caches take the ldmatrix-fed widening everywhere (the int8 two-term path is not measured
// yet). On sm_90a fp8 caches with head_dim 128 and no beams take the Hopper kernel (kWgmma, "_wgmma",
// rows per CTA 8 / 16 / 32 / 64 instead of 16 / 32 / 64). DECA_GQA_FP8_MMA=widen|widen_ldsm|two_term|wgmma overrides the choice for both (two_term: fp8
// on sm_89+ only, int8 on every arch; wgmma: where the Hopper kernel applies; elsewhere the default
// stays), and two_term_qk for int8 (QK
// on IMMA, PV widened). The name carries "_2term", "_2tqk" or "_ldsm" for those paths,
// nothing for the lds32-fed widening.
// `sm_count`: the device's SMs (the Hopper kernel's stage count depends on how full the grid is;
// 132 is the H100 / H200 SXM's, for compiling ahead of time without a device).
GqaKernelKey make_gqa_key(const GqaConfig& config, int arch, int sm_count = 132);

}  // namespace deca::cuda
