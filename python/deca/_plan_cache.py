"""Plans (and their workspaces) made once per call shape, for the entry points that take no plan.

The compat wrappers and the torch custom ops are called the way engines call FlashAttention or
FlashMLA: tensors in, no plan object. Each distinct shape, dtype, device and feature set gets one
deca plan and one zeroed workspace, made at its first call and reused after, so a steady-state
call plans nothing and allocates nothing (CUDA-graph capture replays the same workspace). Make the
first call of each shape before a capture, as torch's own graph recipe asks (warm-up on a side
stream). One workspace per plan: two streams running the same shape at once would share it, so
engines that do so pass their own workspace through deca's plan API instead.
"""

from __future__ import annotations

from . import _C
from ._tensors import tensor as _tensor
from ._tensors import zeros_bytes
from .gqa import GqaPlan
from .mla import MlaPlan

_GQA = {}
_MLA = {}


def device_text(t):
    """A _C.Tensor's device as GqaPlan / MlaPlan take it."""
    d = t.device
    return "cpu" if d.kind == _C.DeviceKind.CPU else f"cuda:{d.index}"


_GQA_KEYS = ("num_q_heads", "num_kv_heads", "head_dim", "page_size", "layout", "q_dtype",
             "kv_dtype", "out_dtype", "max_batch", "max_q_len", "max_seq_len", "lse", "sinks",
             "per_head_kv_scale", "window", "softcap", "split_mode", "split_tokens", "device")


def gqa(like, where, key):
    """(GqaPlan, workspace or None) for key, the values of _GQA_KEYS in that order (a plain
    tuple: the lookup is the per-call cost); the workspace a zeroed buffer beside `like`."""
    hit = _GQA.get(key)
    if hit is None:
        plan = GqaPlan(**dict(zip(_GQA_KEYS, key)))
        hit = (plan, zeros_bytes(like, _tensor(like, where), plan.workspace_bytes,
                                 f"{where}: workspace"))
        _GQA[key] = hit
    return hit


def mla(like, like_t, where, **config):
    """(MlaPlan, workspace or None) for `config` (MlaPlan's keywords)."""
    key = tuple(sorted(config.items()))
    hit = _MLA.get(key)
    if hit is None:
        plan = MlaPlan(**config)
        hit = (plan, zeros_bytes(like, like_t, plan.workspace_bytes, f"{where}: workspace"))
        _MLA[key] = hit
    return hit


def clear():
    """Drops every cached plan and workspace (e.g. before freeing GPU memory)."""
    _GQA.clear()
    _MLA.clear()
    from . import _cached_ops
    _cached_ops._TORCH_GQA.clear()
    _cached_ops._TORCH_MLA.clear()
