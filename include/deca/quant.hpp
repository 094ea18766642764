// Quantisers that produce deca's quantized caches from bf16 data, and scalar conversions.
// All host-side (CPU tensors).
#pragma once

#include <cstdint>

#include "deca/mla.hpp"
#include "deca/tensor.hpp"

namespace deca {

// Scalar conversions (round to nearest even; fp8 saturates to +-448, NaN stays NaN).
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float value);
float fp16_to_float(std::uint16_t bits);
std::uint16_t float_to_fp16(float value);
float fp8e4m3_to_float(std::uint8_t bits);
std::uint8_t float_to_fp8e4m3(float value);

// Per-tensor scale that maps max |x| onto the format's largest finite value (448 for e4m3,
// 127 for int8); 1 when x is all zeros.
float choose_fp8_scale(const TensorView& src);
float choose_int8_scale(const TensorView& src);

// out = round(src / scale) in the target format; src bf16|fp16|fp32, out fp8_e4m3|int8 of the
// same shape (any non-negative strides, sharing no byte with src). real value = stored * scale.
void quantize_fp8(const TensorView& src, const TensorView& out, float scale);
void quantize_int8(const TensorView& src, const TensorView& out, float scale);

// MLA sparse FP8 token packer, in the cache format `format` (MlaCacheFormat, deca/mla.hpp):
// - kFP8Sparse (or kDefault): src [..., 576] bf16 -> out [..., 656] uint8 (last dim
//   contiguous). Per token: bytes 0..511 e4m3 NoPE values, 512..527 four fp32 scales (one per
//   128 values, powers of two: 2^ceil(log2(max|x| / 448))), 528..655 the 64 bf16 RoPE values.
// - kModel1: src [num_blocks, page_size, 1, 512] bf16 -> out [num_blocks, page_size, 1, 584]
//   uint8 over the MODEL1 page layout (out's dim 1 stride 584 bytes, dim 3 contiguous, dim 0
//   stride >= mla_model1_page_bytes(page_size), e.g. a view of a [num_blocks,
//   mla_model1_page_bytes(page_size)] buffer). Per token: 448 e4m3 values, tiles of 64 scaled by
//   2^max(ceil(log2(max|x| / 448)), -13) (FlashMLA's choice: the same bytes as its packer),
//   stored as ue8m0 (127 + the exponent); the pad byte after the 7 scales is written 0; the
//   page's padding past page_size * 584 bytes (outside the view) is not written.
// Any other format: deca::Error naming `format`. src's values must be finite.
void pack_mla_fp8(const TensorView& src, const TensorView& out,
                  MlaCacheFormat format = MlaCacheFormat::kFP8Sparse);
// The inverse (for tests and the reference): out [..., 576] (kModel1: [num_blocks, page_size, 1,
// 512]) fp32 | bf16, each value stored e4m3 * its scale (in fp32; rounded to bf16 for a bf16
// out), the RoPE values unchanged.
void unpack_mla_fp8(const TensorView& src, const TensorView& out,
                    MlaCacheFormat format = MlaCacheFormat::kFP8Sparse);

// MLA dense e4m3 cache (MlaCacheFormat::kFP8E4M3) from a bf16 one: src [..., 576] bf16 (e.g. the
// whole [num_blocks, page_size, 1, 576] cache, or the tokens being appended to it), out of src's
// shape, fp8_e4m3 (sharing no byte with src). Returns the one scale, the power of two
// 2^ceil(log2(max|src| / 448)) (the smallest with max|src| / scale <= 448; 1 when src is all
// zeros), and writes out = round(src / scale) to nearest even: pass it as MlaDenseArgs::kv_scale
// (real = stored * scale). A power of two keeps the division exact and makes the decode kernels'
// scaled products equal the reference's dequantized values. Throws for a NaN or infinity in src.
// To append to a cache quantized earlier, keep its scale: quantize_fp8(new_tokens, out, scale)
// (values beyond 448 * scale saturate).
float quantize_mla_fp8_e4m3(const TensorView& src, const TensorView& out);

}  // namespace deca
