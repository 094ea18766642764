"""FlashAttention-3's q_descale / k_descale / v_descale as deca's scales.

FlashAttention-3 takes each as a (batch, nheads_k) fp32 tensor (real = stored * descale) and
folds q_descale * k_descale into the softmax scale of each (request, kv head) in fp32. deca
scales logits by k_scale (one value) or k_scales[kv_head] and values by v_scale / v_scales, so:
* every descale one value: k_scale = q_descale * k_descale, v_scale = v_descale;
* a descale per kv head (a [nheads_k] tensor, or a (batch, nheads_k) one with one row: batch
  stride 0, batch 1, or equal rows read on the host): k_scales = q_row * k_row, v_scales = v_row,
  computed on the tensors' device (no synchronisation);
* rows that differ per request: one decode per request, each with its row as per-head scales.
Each is exact up to the fp32 rounding of the scale products.
"""

from __future__ import annotations

import math

import numpy as np

from .._tensors import Error, torch_of
from . import _common


class Scales:
    """deca's (k_scale, v_scale, k_scales, v_scales) for a call, or one Scales per request
    (per_request)."""

    def __init__(self, k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None, rows=None):
        self.k_scale, self.v_scale = k_scale, v_scale
        self.k_scales, self.v_scales = k_scales, v_scales
        self.rows = rows
        self.per_request = rows is not None

    def values(self):
        return self.k_scale, self.v_scale, self.k_scales, self.v_scales

    def request(self, b):
        return self.rows[b]


def descale_plan(fn, like, batch, hkv, q_descale, k_descale, v_descale, read_host=True):
    """The Scales of a call's descales (None where one does not apply). like: a tensor on the
    decode's device (q); read_host: whether values of host tensors may be read (not while
    torch.compile traces)."""
    forms = [_form(fn, name, x, batch, hkv, read_host)
             for name, x in (("q_descale", q_descale), ("k_descale", k_descale),
                             ("v_descale", v_descale))]
    if any(kind == "rows" for kind, _ in forms):
        return Scales(rows=[_combine(like, hkv, [_row(f, b) for f in forms])
                            for b in range(batch)])
    return _combine(like, hkv, forms)


def _form(fn, name, x, batch, hkv, read_host):
    """("one", float) | ("head", [hkv] tensor) | ("rows", [batch, hkv] tensor)."""
    if x is None:
        return ("one", 1.0)
    if isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool):
        return ("one", float(x))
    shape = getattr(x, "shape", None)
    if shape is None:
        raise Error(f"{fn}: {name}: expected a float or a float32 tensor (batch, nheads_k), got "
                    f"{_common.describe(x)}")
    shape = tuple(shape)
    _common.expect_dtype(fn, name, x, ("fp32",))
    on_host = type(x) is np.ndarray or str(getattr(x, "device", "cpu")) == "cpu"
    if math.prod(shape) == 1:
        if on_host and read_host:
            return ("one", float(x.reshape(-1)[0]))
        return ("head", x.reshape(1).expand(hkv))
    if len(shape) == 1 and shape[0] == hkv:
        return ("head", x)
    if len(shape) == 2 and shape[1] == hkv and shape[0] in (batch, 1):
        if shape[0] == 1 or _batch_stride(x) == 0:
            return ("head", x[0])  # vLLM's expand() of one scale: every row is row 0
        if on_host and read_host:
            rows = _host_array(x)
            if (rows == rows[0]).all():
                return ("head", x[0])
        return ("rows", x)
    raise Error(f"{fn}: {name}: expected float32 (batch, nheads_k) = ({batch}, {hkv}) "
                f"(FlashAttention-3's shape), per-head [{hkv}], or a float, got "
                f"{_common.describe(x)}")


def _row(form, b):
    kind, value = form
    return ("head", value[b]) if kind == "rows" else form


def _combine(like, hkv, forms):
    (qk, qv), (kk, kv), (vk, vv) = forms
    if qk == kk == vk == "one":
        return Scales(qv * kv, vv)
    return Scales(k_scales=_per_head(like, hkv, (qk, qv), (kk, kv)),
                  v_scales=_per_head(like, hkv, (vk, vv), ("one", 1.0)))


def _per_head(like, hkv, a, b):
    """The product of two forms ("one" or "head") as a contiguous fp32 [hkv] tensor on like's
    device."""
    tensors, factor = [], 1.0
    for kind, v in (a, b):  # a plain loop: torch.compile traces it
        if kind == "head":
            tensors.append(v)
        else:
            factor *= v
    if not tensors:
        return _filled(like, hkv, factor)
    value = tensors[0] if len(tensors) == 1 else tensors[0] * tensors[1]
    if factor != 1.0:
        value = value * factor
    return _contiguous(value)


def _filled(like, hkv, value):
    torch = torch_of(like)
    if torch is not None:
        return torch.full((hkv,), value, dtype=torch.float32, device=like.device)
    return np.full((hkv,), value, np.float32)


def _contiguous(x):
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x, dtype=np.float32)
    return x.contiguous()


def _batch_stride(x):
    if isinstance(x, np.ndarray):
        return x.strides[0]
    return x.stride(0)


def _host_array(x):
    return x if isinstance(x, np.ndarray) else x.numpy()
