"""Quantisers that produce deca's quantized caches (host / CPU tensors only)."""

from __future__ import annotations

import numpy as np

from . import _C
from ._tensors import Error, allocator, check_dtype_keywords, check_scalars, choice, tensor

_FP8_TOKEN_BYTES = _C.MLA_FP8_TOKEN_BYTES
_DIM_QK = _C.MLA_DIM_QK
_MODEL1_TOKEN_BYTES = _C.MLA_MODEL1_TOKEN_BYTES
_MODEL1_DIM_QK = _C.MLA_MODEL1_DIM_QK
_TOKEN_FORMATS = ("fp8_sparse", "model1")


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
        out = allocator(src, f"{fn}: out", st)(tuple(st.shape), dst_dtype)
    op(st, tensor(out, f"{fn}: out", dst_dtype, writable=True), float(scale))
    return out


def pack_mla_fp8(src, out=None, *, src_dtype=None, format="fp8_sparse"):
    """MLA sparse cache tokens; returns out.

    format "fp8_sparse" (DeepSeek V3.2): src [..., 576] bf16 -> out [..., 656] uint8. Per token:
    512 e4m3 NoPE values, four fp32 scales (one per 128 values, powers of two), then the 64 bf16
    RoPE values unchanged.
    format "model1" (DeepSeek V4): src [num_blocks, page_size, 1, 512] bf16 -> out [num_blocks,
    page_size, 1, 584] uint8, a view over pages of mla_model1_page_bytes(page_size) bytes (what
    FlashMLA's cache is): per page every token's 576-byte row (448 e4m3, then the 64 bf16 RoPE
    values) and after them 8 bytes a token (7 ue8m0 scales, one per 64 values, and a pad byte).
    Allocated when None; a given out must have that layout (slot stride 584 bytes, block stride
    at least the padded page size).
    """
    fn = "pack_mla_fp8"
    (src_dtype,) = check_dtype_keywords(fn, src_dtype=src_dtype)
    choice(fn, "format", format, _TOKEN_FORMATS)
    st = tensor(src, f"{fn}: src", src_dtype)
    if out is None:
        if format == "model1":
            out = _model1_pages(fn, src, st)
        else:
            out = allocator(src, f"{fn}: out", st)(
                tuple(st.shape[:-1]) + (_FP8_TOKEN_BYTES,), "uint8")
    _C.pack_mla_fp8(st, tensor(out, f"{fn}: out", writable=True), format)
    return out


def mla_model1_page_bytes(page_size):
    """Bytes of one packed MODEL1 page: page_size * 584 rounded up to a multiple of 576."""
    check_scalars("mla_model1_page_bytes", ints=dict(page_size=page_size))
    return _C.mla_model1_page_bytes(page_size)


def _model1_pages(fn, src, st):
    """[num_blocks, page_size, 1, 584] uint8 over num_blocks pages of the padded page size,
    allocated beside src (numpy or torch)."""
    if len(st.shape) != 4 or st.shape[2] != 1 or st.shape[3] != _MODEL1_DIM_QK:
        raise Error(f"{fn}: src: expected shape [num_blocks, page_size, 1, 512] (format "
                    f"\"model1\"), got {list(st.shape)}")
    blocks, page = st.shape[0], st.shape[1]
    padded = _C.mla_model1_page_bytes(page) if page else 0
    flat = allocator(src, f"{fn}: out", st)((blocks, padded), "uint8")
    shape, strides = (blocks, page, 1, _MODEL1_TOKEN_BYTES), (padded, _MODEL1_TOKEN_BYTES,
                                                              _MODEL1_TOKEN_BYTES, 1)
    if isinstance(flat, np.ndarray):
        return np.lib.stride_tricks.as_strided(flat, shape, strides, writeable=True)
    return flat.as_strided(shape, strides)


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
        out = allocator(src, f"{fn}: out", st)(tuple(st.shape), "fp8_e4m3")
    scale = _C.quantize_mla_fp8_e4m3(st, tensor(out, f"{fn}: out", "fp8_e4m3", writable=True))
    return out, scale


def unpack_mla_fp8(src, out=None, *, out_dtype=None, format="fp8_sparse"):
    """The inverse of pack_mla_fp8: src [..., 656] uint8 -> out [..., 576] fp32 | bf16; format
    "model1": src [num_blocks, page_size, 1, 584] (the page view) -> out [.., 512].

    out_dtype: the dtype of the allocated out (default fp32); with out given it must match."""
    fn = "unpack_mla_fp8"
    (out_dtype,) = check_dtype_keywords(fn, out_dtype=out_dtype)
    choice(fn, "format", format, _TOKEN_FORMATS)
    st = tensor(src, f"{fn}: src")
    if out is None:
        dim = _MODEL1_DIM_QK if format == "model1" else _DIM_QK
        out = allocator(src, f"{fn}: out", st)(tuple(st.shape[:-1]) + (dim,),
                                               out_dtype or "fp32")
    _C.unpack_mla_fp8(st, tensor(out, f"{fn}: out", out_dtype, writable=True), format)
    return out
