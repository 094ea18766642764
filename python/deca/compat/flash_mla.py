"""FlashMLA's get_mla_metadata / flash_mla_with_kvcache on deca's MLA decode.

The sparse FP8 call (indices given, is_fp8_kvcache=True) runs deca.mla_decode_sparse; the
dense call (no indices: a bf16 cache, or the 656-byte FP8 cache with is_fp8_kvcache=True) runs
deca.mla_decode_dense. Shapes are FlashMLA's: q [batch, s_q, h_q, 576], k_cache [num_blocks,
page_block_size, 1, 656] (FP8, bytes) or [.., 576] (bf16), out [batch, s_q, h_q, 512],
softmax_lse [batch, h_q, s_q] fp32 (natural log; with an attention sink the sink is left out of
it, as deca's is). get_mla_metadata returns (metadata, None) as FlashMLA's current interface
does: the metadata object is scheduled by the first call made with it (on CUDA, sparse or dense)
and that schedule serves the later calls of the step, as FlashMLA's lazily initialised metadata
does; the num_splits slot stays None.
"""

from __future__ import annotations

import sys

from .. import _cached_ops
from .._tensors import Error
from . import _common

DIM_V = 512


class MlaMetadata:
    """What get_mla_metadata promises about the calls it serves (heads, FP8, topk), checked
    against each call, and, as FlashMLA's metadata, the decode step's schedule: the first CUDA
    call made with it schedules into a workspace the object owns, the later calls (the other
    layers of the step: same batch, s_q, topk and topk_length or cache_seqlens contents) reuse
    it. Make one per decode step, as FlashMLA asks. (Traced by torch.compile, each call is one
    deca op that schedules for itself: engines call attention from an opaque op anyway.)"""

    def __init__(self, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache,
                 topk):
        self.num_q_tokens_per_head_k = num_q_tokens_per_head_k
        self.num_heads_k = num_heads_k
        self.num_heads_q = num_heads_q
        self.is_fp8_kvcache = is_fp8_kvcache
        self.topk = topk
        self._schedule = _cached_ops.StepSchedule()

    def __repr__(self):
        return (f"deca.compat.MlaMetadata(num_heads_q={self.num_heads_q}, "
                f"is_fp8_kvcache={self.is_fp8_kvcache}, topk={self.topk})")


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=1,
                     num_heads_q=None, is_fp8_kvcache=False, topk=None):
    """(metadata, None) for flash_mla_with_kvcache's tile_scheduler_metadata / num_splits."""
    fn = "get_mla_metadata"
    if num_heads_k != 1:
        raise Error(f"{fn}: num_heads_k: expected 1 (MLA's one latent KV head), got "
                    f"{num_heads_k!r}")
    if topk is not None and (topk <= 0 or topk % 64):
        raise Error(f"{fn}: topk: expected a positive multiple of 64, got {topk!r}")
    return MlaMetadata(num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache,
                       topk), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None,
                           topk_length=None, extra_topk_length=None):
    """Returns (out [batch, s_q, h_q, 512] bf16, softmax_lse [batch, h_q, s_q] fp32).

    Sparse (indices [batch, s_q, topk] int32 global token ids, -1 = skip; is_fp8_kvcache=True;
    block_table and cache_seqlens unused): optional topk_length [batch] int32 and attn_sink
    [h_q] fp32. Dense (indices None): the bf16 cache, or with is_fp8_kvcache=True the 656-byte
    FP8 cache read densely, through block_table [batch, max_blocks] and cache_seqlens [batch]
    (the s_q new tokens included; causal among them); a row without keys gets out 0 and LSE
    +inf, as FlashMLA's. deca has no second ("extra") cache: extra_* arguments raise
    deca.Error naming them.
    """
    fn = "flash_mla_with_kvcache"
    _common.refuse(fn, extra_k_cache=extra_k_cache,
                   extra_indices_in_kvcache=extra_indices_in_kvcache,
                   extra_topk_length=extra_topk_length)
    if head_dim_v != DIM_V:
        raise Error(f"{fn}: head_dim_v: expected {DIM_V}, got {head_dim_v!r}")
    if tile_scheduler_metadata is not None and not isinstance(tile_scheduler_metadata,
                                                              MlaMetadata):
        raise Error(f"{fn}: tile_scheduler_metadata: expected what "
                    f"deca.compat.get_mla_metadata returned, got "
                    f"{type(tile_scheduler_metadata).__name__}")
    meta = tile_scheduler_metadata
    batch, s_q, h_q, _ = _common.rank(fn, "q", q, 4, "[batch, s_q, h_q, 576]")
    if meta is not None and meta.num_heads_q is not None and meta.num_heads_q != h_q:
        raise Error(f"{fn}: q: expected {meta.num_heads_q} heads (get_mla_metadata's "
                    f"num_heads_q), got {h_q}")
    out = _common.alloc(q, (batch, s_q, h_q, DIM_V), "bf16", f"{fn}: out")
    lse = _common.alloc(q, (batch, s_q, h_q), "fp32", f"{fn}: softmax_lse")
    ops = _common.torch_ops(q)
    if indices is not None:
        if not is_fp8_kvcache:
            raise Error(f"{fn}: is_fp8_kvcache: expected True with indices (deca's sparse "
                        f"decode reads the 656-byte FP8 cache), got False")
        if causal:
            raise Error(f"{fn}: causal: expected False with indices (the indices choose the "
                        f"keys), got True")
        if meta is not None and meta.topk is not None:
            shape = tuple(getattr(indices, "shape", ()))
            if len(shape) == 3 and shape[2] != meta.topk:
                raise Error(f"{fn}: indices: expected topk {meta.topk} (get_mla_metadata's "
                            f"topk), got {shape[2]}")
        cache = _bytes(k_cache)
        scale = float(softmax_scale or 0.0)
        if ops is not None:
            # Traced by torch.compile: one opaque op, which schedules for itself.
            ops.mla_decode_sparse(q, cache, indices, out, lse, topk_length, attn_sink, scale)
        else:
            # FlashMLA's metadata: the first call of a step schedules, the later layers reuse.
            _cached_ops.mla_sparse(q, cache, indices, out, lse, fn=fn, topk_length=topk_length,
                                   attn_sink=attn_sink, softmax_scale=scale,
                                   schedule=meta._schedule if meta is not None else None)
    else:
        # Dense: the bf16 cache, as FlashMLA's dense kernel reads it; with is_fp8_kvcache the
        # sparse path's 656-byte cache read densely (every token through block_table: what a
        # V3.2 engine runs for short contexts; FlashMLA's dense kernel reads bf16 only).
        _common.refuse(fn, topk_length=topk_length, attn_sink=attn_sink)
        if s_q > 1 and not causal:
            raise Error(f"{fn}: causal: expected True with s_q {s_q} > 1 (deca's new tokens "
                        f"see no later one), got False")
        if block_table is None or cache_seqlens is None:
            raise Error(f"{fn}: block_table: expected block_table and cache_seqlens for the "
                        f"dense cache, got None")
        cache, kv_format = ((_bytes(k_cache), "fp8_sparse") if is_fp8_kvcache
                            else (k_cache, "bf16"))
        scale = float(softmax_scale or 0.0)
        if ops is not None:
            ops.mla_decode_dense(q, cache, block_table, cache_seqlens, out, lse, scale, 1.0,
                                 kv_format)
        else:
            # FlashMLA's metadata: the first call of a step schedules, the later layers reuse.
            _cached_ops.mla_dense(q, cache, block_table, cache_seqlens, out, lse, fn=fn,
                                  softmax_scale=scale, kv_format=kv_format,
                                  schedule=meta._schedule if meta is not None else None)
        _lonely_rows(lse)
    return out, _swap(lse)


def _bytes(cache):
    """FlashMLA keeps the FP8 cache as float8_e4m3fn or uint8; deca reads its bytes."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(cache, torch.Tensor):
        return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    dtype = getattr(cache, "dtype", None)
    if dtype is not None and getattr(dtype, "itemsize", 0) == 1 and str(dtype) != "uint8":
        return cache.view("uint8")
    return cache


def _lonely_rows(lse):
    """FlashMLA's LSE for a query row that sees no key (an empty request; on a GPU also a
    cache_seqlens entry below s_q): +inf where deca writes -inf (out is 0 in both). torch's
    masked_fill_ keeps a torch.compile trace free of data-dependent shapes."""
    if hasattr(lse, "masked_fill_"):
        lse.masked_fill_(lse == float("-inf"), float("inf"))
    else:
        lse[lse == float("-inf")] = float("inf")


def _swap(lse):
    """[batch, s_q, h] -> FlashMLA's [batch, h, s_q], contiguous."""
    t = lse.swapaxes(1, 2)
    if hasattr(t, "contiguous"):
        return t.contiguous().view(-1).view(t.shape)
    return t.copy()
