"""deca: decode-attention kernels (paged GQA and MLA) with a CPU reference backend.

Every function takes DLPack tensors (numpy, torch, cupy, jax) and runs on the backend of the
tensors' device: the CPU reference for CPU memory, the CUDA kernels for CUDA memory. numpy has no
bf16 / fp8 dtypes: use ml_dtypes arrays, or raw bits (uint16 / uint8) with the dtype keyword of
the argument (q_dtype=, kv_dtype=, out_dtype=, src_dtype=). See docs/python.md.

Errors in arguments raise deca.Error (a ValueError) whose message names the function and the
argument, what was expected and what came.
"""

from . import _C
from ._tensors import Error
from ._tensors import dtype_keyword as _dtype_keyword
from ._tensors import tensor as _tensor
from .gqa import GqaPlan, gqa_decode, precompile_gqa_decode
from .gqa_fused import gqa_decode_fused
from .mla import MlaPlan, combine, mla_decode_dense, mla_decode_sparse
from .quant import (choose_fp8_scale, choose_int8_scale, mla_model1_page_bytes, pack_mla_fp8,
                    quantize_fp8, quantize_int8, quantize_mla_fp8_e4m3, unpack_mla_fp8)

Tensor = _C.Tensor


def as_tensor(x, dtype=None, name="tensor"):
    """x as deca reads it (dtype, shape, element strides, device), following the same rules
    as every op: e.g. deca.as_tensor(np_array_of_ml_dtypes_bf16).dtype == "bf16"."""
    if dtype is not None:
        dtype = _dtype_keyword("as_tensor", "dtype", dtype)
    return _tensor(x, name, dtype)


def version():
    """The deca library version, e.g. '0.1.0'."""
    return _C.version()


def checked_by_default():
    """The default of GqaPlan / MlaPlan / gqa_decode / mla_decode_sparse's checked keyword:
    DECA_CHECKED=1 or 0 in the environment when set, else whether the library is a debug build."""
    return _C.checked_by_default()


__version__ = _C.version()

__all__ = [
    "Error", "Tensor", "as_tensor", "version", "checked_by_default", "GqaPlan", "gqa_decode", "gqa_decode_fused", "precompile_gqa_decode",
    "MlaPlan", "mla_decode_dense", "mla_decode_sparse", "combine", "choose_fp8_scale", "choose_int8_scale", "quantize_fp8",
    "quantize_int8", "pack_mla_fp8", "unpack_mla_fp8", "quantize_mla_fp8_e4m3", "mla_model1_page_bytes",
]
