// What the MLA kernels write as the final LSE of a row without a valid key. deca's convention is
// -inf (the log of an empty sum: docs/semantics.md); FlashMLA's compat layer wants +inf
// (MlaConfig::lse_of_empty_row, kMlaLseEmptyPosInf in params.cuh). The choice is compiled in:
// a kernel of a +inf plan is generated with `#define DECA_MLA_LSE_EMPTY_POS_INF 1` before its
// entry header (src/cuda/mla_spec.cpp, "_lsepinf" in its name), every other kernel's source and
// machine code stay as they were. A macro rather than a Cfg member (kernels/common/cfg_field.cuh)
// because the portable sparse entries and the combine have no Cfg. Only final LSEs go through
// final_lse: a split piece's partial LSE keeps -inf, which the combine reads as "no key".
#pragma once

#ifndef DECA_MLA_LSE_EMPTY_POS_INF
#define DECA_MLA_LSE_EMPTY_POS_INF 0
#endif

namespace deca::mla {

inline constexpr bool kLseEmptyPosInf = DECA_MLA_LSE_EMPTY_POS_INF != 0;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ float final_lse(float lse) {
  if constexpr (kLseEmptyPosInf) {
    return lse == -__int_as_float(0x7f800000) ? __int_as_float(0x7f800000) : lse;
  } else {
    return lse;
  }
}
#endif

}  // namespace deca::mla
