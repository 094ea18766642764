"""What the compat wrappers share: refusing what deca does not do, by name; checking the caller's
arguments in the caller's names before deca sees them; reading the dtype spellings engines pass;
and translating the argument names of a message deca raises into the caller's."""

from __future__ import annotations

import math
import re

import numpy as np

from .. import _cached_ops, _tensors
from .._tensors import DTYPE_ALIASES, Error, torch_of

LOG2_E = 1.0 / math.log(2.0)


def refuse(fn, **arguments):
    """Raises deca.Error for the first argument that is given (not None) and that deca cannot
    honour; the keyword names it as the caller spelled it."""
    for name, value in arguments.items():
        if value is not None:
            raise Error(f"{fn}: {name}: expected None (deca does not support it), got "
                        f"{describe(value)}")


def describe(value):
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return repr(value)


def torch_ops(x):
    """torch.ops.deca while torch.compile traces a call on torch tensors (the custom ops are
    registered on first use), else None: in eager mode the wrappers call deca directly, which
    skips torch's dispatcher (tens of microseconds a call in eager mode) and is what a CUDA-graph
    capture records either way. deca never imports torch itself."""
    torch = torch_of(x)
    if torch is None:
        return None
    if torch.compiler.is_compiling():
        # Registering inside a trace would change what the trace guards on.
        if not _cached_ops.TORCH_OPS_REGISTERED:
            raise Error("deca.compat: torch.compile: expected the deca custom ops registered "
                        "before tracing (import torch before deca.compat, or import "
                        "deca.torch_ops), got a first call inside a trace")
        return torch.ops.deca
    if not _cached_ops.TORCH_OPS_REGISTERED:
        from .. import torch_ops  # noqa: F401  (registers the ops for later traces)
    return None


def compiling(x):
    """Whether torch.compile is tracing this call (x a torch tensor there); cheap otherwise.
    Once torch is known (_tensors.IS_COMPILING), torch's flag alone answers, whatever x is: it
    is set only while a trace runs, and a trace hands the wrappers torch tensors."""
    if type(x) is np.ndarray:
        return False
    is_compiling = _tensors.IS_COMPILING
    if is_compiling is not None:
        return is_compiling()
    torch = torch_of(x)
    return torch is not None and torch.compiler.is_compiling()


def scale_float(fn, name, value):
    """A per-tensor scale given as a float, an int or a one-element tensor on the host."""
    if value is None:
        return 1.0
    if isinstance(value, (int, float)):
        return float(value)
    shape = tuple(getattr(value, "shape", ()))
    device = str(getattr(value, "device", "cpu"))
    if math.prod(shape) == 1 and device == "cpu":
        return float(value.reshape(-1)[0])
    raise Error(f"{fn}: {name}: expected a float (or a one-element CPU tensor: reading a GPU "
                f"tensor would synchronise), got {describe(value)}")


def is_torch(x):
    return torch_of(x) is not None


def rank(fn, name, x, n, layout):
    """x's shape (any array library's .shape), checked to have n dimensions."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise Error(f"{fn}: {name}: expected a tensor {layout}, got {describe(x)}")
    shape = tuple(shape)
    if len(shape) != n:
        raise Error(f"{fn}: {name}: expected rank {n} {layout}, got {list(shape)} "
                    f"({type(x).__name__})")
    return shape


# --- dtypes ------------------------------------------------------------------------------------

_TORCH_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                "float8_e4m3fn": "fp8_e4m3", "int8": "int8", "uint8": "uint8", "int32": "int32",
                "uint32": "uint32", "int64": "int64", "float64": "fp64", "float8_e5m2": "e5m2"}
_NUMPY_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                "float8_e4m3fn": "fp8_e4m3", "int8": "int8", "uint8": "uint8", "int32": "int32",
                "uint32": "uint32", "int64": "int64", "float64": "fp64", "uint16": "uint16",
                "float8_e5m2": "e5m2"}


def dtype_of(x):
    """The dtype of a caller's tensor as deca names it ("bf16", "int32", ...; "int64", "fp64"
    and the like for what deca has no use for), read from the tensor's own attributes."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return type(x).__name__
    text = str(dt)
    if text.startswith("torch."):
        return _TORCH_NAMES.get(text[6:], text[6:])
    return _NUMPY_NAMES.get(text, text)


def spell(x, name):
    """deca dtype `name` as the caller's library spells it, for hints ("torch.int32")."""
    torch_names = {v: k for k, v in _TORCH_NAMES.items()}
    if is_torch(x):
        return "torch." + torch_names.get(name, name)
    return {"bf16": "ml_dtypes.bfloat16", "fp8_e4m3": "ml_dtypes.float8_e4m3fn"}.get(
        name, "numpy." + torch_names.get(name, name))


def convert_hint(x, name):
    """How the caller turns x into dtype `name` in its own library."""
    if is_torch(x):
        return f".to({spell(x, name)})"
    return f".astype({spell(x, name)})"


def expect_dtype(fn, arg, x, allowed, hint=""):
    """x's dtype (deca's name), checked to be one of `allowed`; the message names the caller's
    argument, the one expected value (or the few), what came, and a hint."""
    got = dtype_of(x)
    if got in allowed:
        return got
    want = " or ".join(spell(x, a) for a in allowed)
    if not hint and len(allowed) == 1 and got in ("int64", "uint32", "int16", "uint8") and \
            allowed[0] == "int32":
        hint = f"convert with {arg}{convert_hint(x, 'int32')}"
    raise Error(f"{fn}: {arg}: expected {want}, got {spell(x, got)}" +
                (f" ({hint})" if hint else ""))


def dtype_spelling(fn, name, value):
    """Any dtype spelling engines pass -- a torch dtype, a numpy dtype or scalar type, an ml_dtypes
    type (ml_dtypes.bfloat16 itself), a string ("bfloat16", "bf16", "float16", "fp8", "e4m3",
    "float8_e4m3fn", "torch.bfloat16") -- as deca's dtype name."""
    text = None
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("torch."):
            text = text[6:]
    elif type(value).__module__ == "torch":
        text = str(value)[6:]
    else:
        try:
            text = np.dtype(value).name  # numpy dtypes and scalar types, ml_dtypes types
        except TypeError:
            text = None
    if text is not None:
        text = text.lower()
        text = DTYPE_ALIASES.get(text, text)
        if text in ("bf16", "fp16", "fp8_e4m3", "int8", "fp32", "uint8"):
            return text
    hint = ""
    if text is not None and "e5m2" in text:
        hint = " (deca reads fp8 as e4m3 only: did you mean fp8_e4m3?)"
    raise Error(f"{fn}: {name}: expected a dtype deca reads -- torch.bfloat16, torch.float16, "
                f"torch.float8_e4m3fn, torch.int8, their numpy / ml_dtypes types, or a name "
                f"(\"bfloat16\", \"bf16\", \"float16\", \"fp8\", \"fp8_e4m3\", \"int8\") -- got "
                f"{value!r}{hint}")


# --- messages ------------------------------------------------------------------------------------

def translate(err, fn, op, names):
    """err (a deca.Error raised by deca's op `op`, e.g. "gqa_decode: page_table[1][0]: ...")
    with the op replaced by the caller's function and deca's argument name by the caller's
    (`names`: deca's -> the caller's); other messages as they are."""
    text = str(err)
    prefix = f"{op}: "
    if not text.startswith(prefix):
        return err
    rest = text[len(prefix):]
    m = re.match(r"([A-Za-z_]+)", rest)
    if m and m.group(1) in names:
        rest = names[m.group(1)] + rest[m.end():]
    return Error(f"{fn}: {rest}")
