// A GQA kernel specialization: the small value type that the JIT compiles, caches and names.
// Its name() is the cache key prefix, the test parameter name and what deca-bench prints.
#pragma once

#include <string>

#include "deca/gqa.hpp"
#include "jit/kernel_cache.hpp"
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
  int beam_width = 1;   // beams of a request sharing one CTA (their common pages read once)
  // How an 8-bit cache meets the tensor cores (kernels/common/kv_kind.cuh Fp8Mma): fp8 takes
  // kv::kWgmma (the Hopper kernel), kv::kTwoTerm (e4m3 mma.sync, sm_89+) or kv::kWidenLdsm; int8
  // takes kv::kTwoTermQk (QK on int8 mma, PV widened) or kv::kWidenLdsm. Another value reads as
  // kv::kWidenLdsm (fp8_path); 16-bit caches ignore it and do not name it.
  int fp8_mma = kv::kWidenLdsm;
  // The Hopper kernel's pipeline stages: 0 = its default (kernels/gqa/sm90/traits.cuh stages_for),
  // else that many ("_st<n>"; the plan asks for 2 where the grid fills three CTAs per SM).
  int stages = 0;
  // The Hopper kernel with the query rows on wgmma's M (kernels/gqa/sm90/decode_rows.cuh,
  // "_rm"): every Hopper plan of 32 or 64 rows per CTA.
  bool rows_on_m = false;
  // Checked mode (GqaConfig::checked): page ids and lengths range-tested in the kernel; "_chk".
  bool checked = false;
  // Skip-softmax (GqaConfig::skip_softmax_factor > 0): the tile-skipping kernel variant, "_skip";
  // the factor itself is a run-time argument (GqaParams::skip_softmax_factor).
  bool skip = false;
  // Fused decode step (GqaConfig::rope_style, kernels/gqa/fused.cuh): 1 GPT-NeoX, 2 GPT-J, 0 a
  // plain decode; rotary_dim the rotated dims. "_neox<rd>" / "_gptj<rd>".
  int rope_style = 0;
  int rotary_dim = 0;
  // The phase stamps' build (kernels/gqa/stamps.cuh, "_stamp"): a timing aid for the Hopper
  // kernels, made only by src/cuda/gqa_stamps.cpp (deca-bench --stamps, the GPU test), never by a
  // plan.
  bool stamps = false;

  // The path the kernel takes: fp8_mma for an 8-bit cache; 16-bit caches have one path.
  int fp8_path() const {
    switch (kv::kind_of(kv_dtype)) {
      case kv::kKvFp8: return fp8_mma == kv::kWgmma || fp8_mma == kv::kTwoTerm ? fp8_mma : kv::kWidenLdsm;
      case kv::kKvInt8: return fp8_mma == kv::kTwoTermQk ? fp8_mma : kv::kWidenLdsm;
      default: return fp8_mma == kv::kWgmma ? kv::kWgmma : kv::k16Bit;  // the Hopper kernel or the portable one
    }
  }
  bool two_term() const { return fp8_path() == kv::kTwoTerm; }
  // The Hopper kernel (kernels/gqa/sm90/), sm_90a, no beams: fp8 at head_dim 128, bf16 / fp16
  // at 64 / 128 / 256 (unless DECA_GQA_SM90_16BIT=0).
  bool wgmma() const { return fp8_path() == kv::kWgmma; }

  // e.g. "gqa_sm90_d128_g8_r8_p32_qbf16_kvfp8_e4m3_obf16_win_tree_cap_wgmma"
  std::string name() const;
  // The generated prologue + #include "kernels/gqa/sm80/entry.cuh" (or sm90/entry.cuh).
  jit::JitSpec spec() const;
  gqa::Shape shape() const {
    return wgmma() ? gqa::sm90::make_shape(rows, stages, rows_on_m, gqa::sm90::kv_bytes_of(kv_dtype), head_dim)
                   : gqa::make_shape(head_dim, rows, kv_dtype);
  }
};

// The key a plan needs on a device of compute capability `arch` with `sm_count` SMs (the Hopper
// kernel's stage count depends on how full the grid is; 132 is the H100 / H200 SXM's, for
// compiling ahead of time without a device). The 8-bit path, per arch (gqa_spec.cpp says why):
//   fp8:  sm_90a the Hopper kernel (kWgmma, "_wgmma") at head_dim 128 without beams; sm_89 the
//         two-term e4m3 mma.sync (kTwoTerm, "_2term"); everywhere else the ldmatrix-fed widening
//         (kWidenLdsm, "_ldsm").
//   int8: sm_90 QK on the int8 mma, PV widened (kTwoTermQk, "_2tqk"); elsewhere kWidenLdsm.
// `path_arch` (tests only; 0 = `arch`): choose the path a plan takes on that arch, compiled for
// `arch`, so that one GPU runs the code other arches' plans select. The Hopper kernel needs both
// to be 90, the e4m3 mma.sync an `arch` of 89 or more.
// `hopper_16bit`: bf16 / fp16 caches at head_dim 64, 128 or 256 without beams take the Hopper
// kernel too ("_kvbf16..._wgmma"; with skip-softmax "_wgmma_st3_skip" up to 16 rows and "_wgmma_rm_skip"
// at 32 / 64, as fp8);
// else they take the portable kernel. Plans pass true unless DECA_GQA_SM90_16BIT=0 (the backend reads it);
// the parameter's default, false, is for the tests that compile the portable kernel's 16-bit
// specializations on sm_90.
GqaKernelKey make_gqa_key(const GqaConfig& config, int arch, int sm_count = 132, int path_arch = 0,
                          bool hopper_16bit = false);

// How every GQA launch (decode, fused step, rotate / append) is made on a device of compute
// capability `arch`: with programmatic dependent launch from sm_90 on, so that the grid is placed
// while the previous kernel in the stream finishes. The kernels wait on griddepcontrol before
// their first global access and let the next grid launch once their main loop is done
// (kernels/gqa/sm80/entry.cuh, epilogue.cuh finish_cta); below sm_90 there is no such attribute.
// A captured graph keeps it as a programmatic edge (CUDA 12.3 and later).
jit::LaunchOptions gqa_launch_options(int arch);

// The fused step's rotate / append kernel alone for a fused config (kernels/gqa/rope_append.cuh;
// src/cuda/gqa_rope_append.cpp launches it).
jit::JitSpec gqa_rope_append_spec(const GqaConfig& config, int arch);

}  // namespace deca::cuda
