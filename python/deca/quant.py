"""Quantisers that produce deca's quantized caches (host / CPU tensors only)."""

from __future__ import annotations

from . import _C
from ._tensors import check_dtype_keywords, check_scalars, empty, tensor

_FP8_TOKEN_BYTES = _C.MLA_FP8_TOKEN_BYTES
_DIM_QK = _C.MLA_DIM_QK


def choose_fp8_scale(src, *, src_dtype=None):
    """Per-tensor scale mapping max|src| onto 448 (e4m3's largest finite); 1 for all zeros."""
    return _C.choose_fp8_scale(tensor(src, "choose_fp8_scale: src", src_dtype))


def choose_int8_scale(src, *, src_dtype=None):
    """Per-tensor scale mapping max|src| onto 127; 1 for all zeros."""
    return _C.choose_int8_scale(tensor(src, "choose_int8_scale: src", src_dtype))


def quantize_fp8(src, scale, out=None, *, src_dtype=None):
    """out = round(src / scale) as fp8 e4m3 (real = stored * scale); returns out.

    src bf16|fp16|fp32; out of src's shape, fp8 e4m3 (ml_dtypes.float8_e4m3fn, torch
    float8_e4m3fn, or uint8 bits); allocated when None.
    """
    return _quantize("quantize_fp8", _C.quantize_fp8, "fp8_e4m3", src, scale, out, src_dtype)


def quantize_int8(src, scale, out=None, *, src_dtype=None):
    """out = round(src / scale) as int8, saturated to +-127 (real = stored * scale)."""
    return _quantize("quantize_int8", _C.quantize_int8, "int8", src, scale, out, src_dtype)


def _quantize(fn, op, dst_dtype, src, scale, out, src_dtype):
    (src_dtype,) = check_dtype_keywords(fn, src_dtype=src_dtype)
    check_scalars(fn, floats=dict(scale=scale))
    st = tensor(src, f"{fn}: src", src_dtype)
    if out is None:
        out = empty(src, st, st.shape, dst_dtype, f"{fn}: out")
    op(st, tensor(out, f"{fn}: out", dst_dtype, writable=True), float(scale))
    return out


def pack_mla_fp8(src, out=None, *, src_dtype=None):
    """MLA sparse cache tokens: src [..., 576] bf16 -> out [..., 656] uint8; returns out.

    Per token: 512 e4m3 NoPE values, four fp32 scales (one per 128 values, powers of two), then
    the 64 bf16 RoPE values unchanged.
    """
    fn = "pack_mla_fp8"
    (src_dtype,) = check_dtype_keywords(fn, src_dtype=src_dtype)
    st = tensor(src, f"{fn}: src", src_dtype)
    if out is None:
        out = empty(src, st, tuple(st.shape[:-1]) + (_FP8_TOKEN_BYTES,), "uint8", f"{fn}: out")
    _C.pack_mla_fp8(st, tensor(out, f"{fn}: out", writable=True))
    return out


def quantize_mla_fp8_e4m3(src, out=None, *, src_dtype=None):
    """MLA dense e4m3 cache from a bf16 one; returns (out, scale).

    src [..., 576] bf16 (e.g. the whole [num_blocks, page_size, 1, 576] cache); out of src's
    shape, fp8 e4m3 (ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn, or uint8 bits), allocated
    beside src when None. scale is the power of
    two 2 ** ceil(log2(max|src| / 448)) (1 for all zeros) and out = round(src / scale): pass it
    as kv_scale (real = stored * scale) with kv_format="fp8_e4m3". To append tokens to such a
    cache later, keep its scale: quantize_fp8(new_tokens, scale).
    """
    fn = "quantize_mla_fp8_e4m3"
    check_dtype_keywords(fn, src_dtype=src_dtype)
    st = tensor(src, f"{fn}: src", src_dtype)
    if out is None:
        out = empty(src, st, st.shape, "fp8_e4m3", f"{fn}: out")
    scale = _C.quantize_mla_fp8_e4m3(st, tensor(out, f"{fn}: out", "fp8_e4m3", writable=True))
    return out, scale


def unpack_mla_fp8(src, out=None, *, out_dtype=None):
    """The inverse of pack_mla_fp8: src [..., 656] uint8 -> out [..., 576] fp32 | bf16.

    out_dtype: the dtype of the allocated out (default fp32); with out given it must match."""
    fn = "unpack_mla_fp8"
    (out_dtype,) = check_dtype_keywords(fn, out_dtype=out_dtype)
    st = tensor(src, f"{fn}: src")
    if out is None:
        out = empty(src, st, tuple(st.shape[:-1]) + (_DIM_QK,), out_dtype or "fp32", f"{fn}: out")
    _C.unpack_mla_fp8(st, tensor(out, f"{fn}: out", out_dtype, writable=True))
    return out
