// How a KV cache dtype reaches the tensor cores: kept 16-bit, or 8-bit widened in registers.
// Host code includes this too (the plan needs the tile shapes), so it holds no device code.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DECA_HD __host__ __device__
#else
#define DECA_HD
#endif

namespace deca::kv {

enum Kind : int { kKv16 = 0, kKvFp8 = 1, kKvInt8 = 2 };

// DType values (deca::DType in include/deca/tensor.hpp).
enum DTypeCode : int { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP8 = 3, kINT8 = 4 };

DECA_HD constexpr int kind_of(int kv_dtype) {
  return kv_dtype == kFP8 ? kKvFp8 : (kv_dtype == kINT8 ? kKvInt8 : kKv16);
}

// The mma operand type. A 16-bit cache keeps its own type (q is converted once per CTA). An
// 8-bit cache is widened to fp16: e4m3 -> f16x2 is one cvt per pair on sm_89+ (there is none to
// bf16 on sm_90), int8 -> fp16 is exact with a magic number, and fp16 keeps more of q's mantissa
// than bf16. q is brought into fp16 range by a power-of-two scale per row (folded back into that
// row's logits), so bf16 activations of any magnitude cannot overflow.
DECA_HD constexpr bool compute_fp16(int /*q_dtype*/, int kv_dtype) {
  return kind_of(kv_dtype) == kKv16 ? kv_dtype == kFP16 : true;
}

// How an 8-bit cache meets the tensor cores (which arch's plan takes which: src/cuda/gqa_spec.hpp).
// kWidenLdsm: widened to fp16 in registers (sm_80+), fed by ldmatrix on the 8-bit rows (K as is,
// V with .trans and one prmt per register). kTwoTerm (fp8, sm_89+): kept 8-bit and multiplied on
// the e4m3 mma (m16n8k32) against q and P each split into two e4m3 terms
// (kernels/common/kv_convert.cuh split_e4m3_*). kTwoTermQk (int8): QK on the int8 mma (IMMA
// m16n8k32, sm_80+) against q split into two int8 terms (split_s8_f32), PV as kWidenLdsm (P in
// fp16): an IMMA PV would need three conversions per output element and 32-token step to leave
// int32, about what widening V costs, while the QK side saves the widening of K outright.
// kWgmma (fp8, sm_90a): the Hopper kernel (kernels/gqa/sm90/), e4m3 wgmma with two-term q and P,
// V transposed in shared memory; head_dim 128 without beams. k16Bit: a 16-bit cache, none of
// these. Despite the enum's name, kWidenLdsm and kTwoTermQk serve int8 caches.
enum Fp8Mma : int { k16Bit = 0, kTwoTerm = 1, kWidenLdsm = 2, kTwoTermQk = 3, kWgmma = 4 };

}  // namespace deca::kv
