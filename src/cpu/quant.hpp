// The quantisers' element loops (deca/quant.hpp). Arguments arrive validated by
// src/api/quant_api.cpp: host tensors of matching shapes, outputs that overlap nothing.
#pragma once

#include "deca/tensor.hpp"

namespace deca::cpu {

// max |x| over a bf16|fp16|fp32 view; NaN or infinity when any value is not finite.
float max_abs(const TensorView& src);
void quantize_fp8(const TensorView& src, const TensorView& out, float scale);
// The smallest power of two s with amax / s <= 448 (e4m3's largest finite); 1 for amax 0. The
// MLA packers' scale: per 128 values in the 656-byte token, per cache in the dense e4m3 one.
float fp8_pow2_scale(float amax);
void quantize_int8(const TensorView& src, const TensorView& out, float scale);
// src [..., 576] bf16 -> out [..., 656] uint8 (out's last dim contiguous).
void pack_mla_fp8(const TensorView& src, const TensorView& out);
// src [..., 656] uint8 (last dim contiguous) -> out [..., 576] fp32 | bf16.
void unpack_mla_fp8(const TensorView& src, const TensorView& out);
// MODEL1: src [blocks, page, 1, 512] bf16 -> out [blocks, page, 1, 584] uint8 over the page
// layout (deca/mla.hpp, MlaCacheFormat::kModel1), and back to fp32 | bf16.
void pack_mla_model1(const TensorView& src, const TensorView& out);
void unpack_mla_model1(const TensorView& src, const TensorView& out);

}  // namespace deca::cpu
