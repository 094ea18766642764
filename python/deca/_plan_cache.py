"""Plans (and their workspaces) made once per call shape, for the entry points that take no plan.

The compat wrappers, the torch custom ops and the one-off calls (deca.gqa_decode,
deca.mla_decode_sparse / _dense) are called the way engines call FlashAttention or FlashMLA:
tensors in, no plan object. Each distinct shape, dtype, device and feature set gets one deca plan
and one zeroed workspace, made at its first call and reused after, so a steady-state call plans
nothing and allocates nothing (CUDA-graph capture replays the same workspace). Make the first call
of each shape before a capture, as torch's own graph recipe asks (warm-up on a side stream). One
workspace per plan: two streams running the same shape at once would share it, so engines that do
so pass their own workspace through deca's plan API instead.

Two levels of memo live here and nowhere else (clear() drops both):
* the plans by their configuration (plan());
* per entry point, the prepared call by the caller's own argument metadata (memo()): what a
  steady-state call looks up first, so that it derives nothing from its tensors.
This module imports no other deca module that calls into it: _cached_ops, the compat wrappers
and the one-off calls depend on it, never the other way.
"""

from __future__ import annotations

from . import _C
from ._tensors import cupy_of as _cupy_of
from ._tensors import tensor as _tensor
from ._tensors import torch_of as _torch_of
from ._tensors import zeros_bytes

_PLANS = {}
_MEMOS = []


def memo():
    """A dict an entry point keeps its prepared calls in, emptied by clear()."""
    d = {}
    _MEMOS.append(d)
    return d


def device_text(t):
    """A _C.Tensor's device as GqaPlan / MlaPlan take it."""
    d = t.device
    return "cpu" if d.kind == _C.DeviceKind.CPU else f"cuda:{d.index}"


def plan(cls, names, values, like, like_t, where):
    """(plan, workspace or None) of cls(**dict(zip(names, values))) (GqaPlan, MlaPlan: the caller
    names the class, so that this module imports neither), made at the first call with these
    values; the workspace a zeroed buffer of plan.workspace_bytes beside `like` (like_t: like
    imported, or None to import it here). `values` is a plain tuple: its lookup is the per-call
    cost."""
    key = (cls, values)
    hit = _PLANS.get(key)
    if hit is None:
        made = cls(**dict(zip(names, values)))
        if like_t is None:
            like_t = _tensor(like, f"{where}: q")
        hit = (made, zeros_bytes(like, like_t, made.workspace_bytes, f"{where}: workspace"))
        _PLANS[key] = hit
    return hit


class StreamWorkspaces:
    """A plan's zeroed workspaces for the one-off calls, one per CUDA stream their runs go to:
    runs on one stream are ordered, and two streams running the same shape at once never share
    one (a one-off call owned its workspace before it was cached). None for a plan that needs
    none (the CPU)."""

    def __init__(self, nbytes, where):
        self.nbytes, self.where = nbytes, where
        self.by_stream = {}

    def get(self, stream, like, current):
        """The workspace for runs on `stream` (an int handle), made at its first use beside
        `like`; `current`: the handle of like's library's current stream, where the zero fill
        is queued (a first use on another stream waits for it)."""
        if not self.nbytes:
            return None
        ws = self.by_stream.get(stream)
        if ws is None:
            ws = zeros_bytes(like, _tensor(like, f"{self.where}: q"), self.nbytes,
                             f"{self.where}: workspace")
            if stream != current:
                sync = getattr(ws, "device", None)
                torch = _torch_of(ws)
                if torch is not None:
                    torch.cuda.synchronize(sync)
                else:
                    _cupy_of(ws).cuda.get_current_stream().synchronize()
            self.by_stream[stream] = ws
        return ws


def clear():
    """Drops every cached plan, workspace and prepared call (e.g. before freeing GPU memory)."""
    _PLANS.clear()
    for d in _MEMOS:
        d.clear()
