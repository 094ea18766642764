"""What the compat wrappers share: refusing what deca does not do, by name, and one call path
that becomes a torch custom op for torch tensors and a direct cached-plan call otherwise."""

from __future__ import annotations

import math
import sys

from .. import _cached_ops
from .._tensors import Error, empty, tensor

LOG2_E = 1.0 / math.log(2.0)


def refuse(fn, **arguments):
    """Raises deca.Error for the first argument that is given (not None) and that deca cannot
    honour; the keyword names it as the caller spelled it."""
    for name, value in arguments.items():
        if value is not None:
            raise Error(f"{fn}: {name}: expected None (deca does not support it), got "
                        f"{_describe(value)}")


def _describe(value):
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return repr(value)


def torch_ops(x):
    """torch.ops.deca while torch.compile traces a call on torch tensors (the custom ops are
    registered on first use), else None: in eager mode the wrappers call deca directly, which
    skips torch's dispatcher (tens of microseconds a call in eager mode) and is what a CUDA-graph
    capture records either way. deca never imports torch itself."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if torch.compiler.is_compiling():
        # Registering inside a trace would change what the trace guards on.
        if "deca.torch_ops" not in sys.modules:
            raise Error("deca.compat: torch.compile: expected the deca custom ops registered "
                        "before tracing (import torch before deca.compat, or import "
                        "deca.torch_ops), got a first call inside a trace")
        return torch.ops.deca
    if "deca.torch_ops" not in sys.modules:
        from .. import torch_ops  # noqa: F401  (registers the ops for later traces)
    return None


def gqa(q, k_cache, v_cache, page_table, seq_lens, out, lse, *, fn, layout="NHD",
        max_seq_len=0, kv_dtype=None, k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None,
        softmax_scale=0.0, softcap=0.0, window=0, sinks=None, split_mode="auto",
        split_tokens=0):
    """One paged GQA decode into out / lse: torch.ops.deca.gqa_decode under torch.compile, the
    cached-plan call otherwise."""
    ops = torch_ops(q)
    if ops is not None:
        ops.gqa_decode(q, k_cache, v_cache, page_table, seq_lens, out, lse, sinks, k_scales,
                       v_scales, layout, int(max_seq_len), kv_dtype or "", float(k_scale),
                       float(v_scale), float(softmax_scale or 0.0), float(softcap), int(window),
                       1.0, split_mode, int(split_tokens))
        return
    _cached_ops.gqa(q, k_cache, v_cache, page_table, seq_lens, out, lse, fn=fn, layout=layout,
                    max_seq_len=max_seq_len, kv_dtype=kv_dtype, k_scale=k_scale,
                    v_scale=v_scale, k_scales=k_scales, v_scales=v_scales,
                    softmax_scale=softmax_scale, softcap=softcap, window=window, sinks=sinks,
                    split_mode=split_mode, split_tokens=split_tokens)


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
                f"tensor would synchronise), got {_describe(value)}")


def is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def alloc(like, shape, dtype, where):
    """A new tensor beside `like`: dtype "same" (like's), "fp32" or "bf16". torch tensors are
    made with torch alone, so that torch.compile traces the wrappers without calling into
    deca outside its custom ops."""
    if is_torch(like):
        torch = sys.modules["torch"]
        dt = like.dtype if dtype == "same" else {"fp32": torch.float32,
                                                 "bf16": torch.bfloat16}[dtype]
        return torch.empty(tuple(shape), dtype=dt, device=like.device)
    t = tensor(like, where)
    return empty(like, t, shape, t.dtype if dtype == "same" else dtype, where)


def rank(fn, name, x, n, layout):
    """x's shape (any array library's .shape), checked to have n dimensions."""
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != n:
        raise Error(f"{fn}: {name}: expected rank {n} {layout}, got {list(shape)} "
                    f"({type(x).__name__})")
    return shape
