"""FlashAttention's flash_attn_with_kvcache for the decode call (what vLLM's FlashAttention
backend makes), on deca's paged GQA decode.

FlashAttention's window_size = (left, right) lets query i of a request with seqlen_k keys see
key j iff  p - left <= j <= p + right,  p = i + seqlen_k - seqlen_q  (-1 = unbounded; causal
sets right = 0). deca's window W shows keys p - W < t <= p, so left maps to W = left + 1 and
right must be 0 once seqlen_q > 1 (for one query no key lies past p anyway). Its
softmax_lse is the natural log, [batch, nheads, seqlen_q] fp32, as deca's (transposed).
"""

from __future__ import annotations

from .._tensors import Error, tensor
from . import _common


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, page_table=None, qv=None,
                            q_descale=None, k_descale=None, v_descale=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            attention_chunk=0, scheduler_metadata=None, pack_gqa=None,
                            sm_margin=0, out=None):
    """Attention of q [batch, seqlen_q, nheads, d] against a paged cache k_cache / v_cache
    [num_blocks, page_block_size, nheads_k, d] through block_table [batch, max_blocks] int32
    (FlashAttention-3 spells it page_table), or a contiguous cache [batch, seqlen_cache,
    nheads_k, d] without one; cache_seqlens [batch] int32 (or an int) counts the keys of each
    request, the new tokens included. Returns out [batch, seqlen_q, nheads, d], or (out,
    softmax_lse [batch, nheads, seqlen_q] fp32) with return_softmax_lse.

    k_descale / v_descale: float scales of an fp8 cache (FlashAttention-3), or [nheads_k]
    per-head tensors. num_splits, pack_gqa and sm_margin are performance hints deca decides
    for itself (ignored); rotary_interleaved only matters with rotary (refused). Arguments
    that would change the result in ways deca cannot (k / v appends, rotary, alibi,
    cache_batch_idx, cache_leftpad, q_descale, varlen q, attention_chunk, a non-causal
    multi-token query) raise deca.Error naming them.
    """
    fn = "flash_attn_with_kvcache"
    _common.refuse(fn, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                   cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                   alibi_slopes=alibi_slopes, qv=qv, q_descale=q_descale,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
                   max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens,
                   scheduler_metadata=scheduler_metadata)
    if attention_chunk:
        raise Error(f"{fn}: attention_chunk: expected 0 (deca does not support chunked "
                    f"attention), got {attention_chunk!r}")
    if block_table is not None and page_table is not None:
        raise Error(f"{fn}: page_table: expected None when block_table is given (they are "
                    f"the same argument), got both")
    table = block_table if block_table is not None else page_table

    # Shapes through .shape only: with torch tensors this function is traced by
    # torch.compile, and deca is entered through its custom op alone.
    batch, seqlen_q, nheads, head_dim = _common.rank(fn, "q", q, 4,
                                                     "[batch, seqlen_q, nheads, headdim]")
    k_shape = _common.rank(fn, "k_cache", k_cache, 4,
                           "[num_blocks, page_block_size, nheads_k, headdim]")

    window = _window(fn, window_size, causal, seqlen_q)
    k_scale, k_scales = _descale(fn, "k_descale", k_descale)
    v_scale, v_scales = _descale(fn, "v_descale", v_descale)
    if (k_scales is None) != (v_scales is None):
        raise Error(f"{fn}: v_descale: expected per-head scales for both k and v or for "
                    f"neither, got k_descale {_common._describe(k_descale)} and v_descale "
                    f"{_common._describe(v_descale)}")

    if table is None:
        # A contiguous cache is one page per request: page b is request b's whole row.
        if k_shape[0] < batch:
            raise Error(f"{fn}: k_cache: expected at least batch ({batch}) rows without a "
                        f"block_table, got {k_shape[0]}")
        table = _arange_column(q, batch)
    if cache_seqlens is None:
        if block_table is not None or page_table is not None:
            raise Error(f"{fn}: cache_seqlens: expected [batch] int32 key counts with a "
                        f"paged cache, got None")
        cache_seqlens = k_shape[1]
    if isinstance(cache_seqlens, int):
        cache_seqlens = _full(q, batch, cache_seqlens)

    if out is None:
        out = _common.alloc(q, (batch, seqlen_q, nheads, head_dim), "same", f"{fn}: out")
    lse = None
    if return_softmax_lse:
        lse = _common.alloc(q, (batch, seqlen_q, nheads), "fp32", f"{fn}: softmax_lse")
    _common.gqa(q, k_cache, v_cache, table, cache_seqlens, out, lse, fn=fn, layout="NHD",
                k_scale=k_scale, v_scale=v_scale, k_scales=k_scales, v_scales=v_scales,
                softmax_scale=softmax_scale, softcap=softcap, window=window)
    if not return_softmax_lse:
        return out
    return out, _contiguous(lse.swapaxes(1, 2))


def _window(fn, window_size, causal, seqlen_q):
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise Error(f"{fn}: window_size: expected a pair (left, right) of ints, -1 = "
                    f"unbounded, got {window_size!r}") from None
    if causal:
        right = 0
    if seqlen_q > 1 and right != 0:
        raise Error(f"{fn}: causal: expected True (or window_size[1] == 0) with seqlen_q "
                    f"{seqlen_q} > 1: deca's queries see no later key, got causal={causal!r} "
                    f"and window_size={tuple(window_size)!r}")
    if left < -1:
        raise Error(f"{fn}: window_size: expected left >= -1, got {window_size!r}")
    return 0 if left < 0 else left + 1


def _descale(fn, name, value):
    """(per-tensor scale, per-head tensor or None) of k_descale / v_descale."""
    if value is None:
        return 1.0, None
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) == 1 and str(getattr(value, "device", "cpu")) != "cpu":
        return 1.0, value
    if shape is not None and len(shape) == 1 and shape[0] > 1:
        return 1.0, value
    if shape is not None and len(shape) == 2 and _batch_stride(value) == 0:
        # vLLM passes one scale expanded to [batch, nheads_k] (batch stride 0): every request
        # has the same row, so row 0 is the per-head scale exactly.
        return 1.0, value[0]
    if shape is not None and len(shape) > 1:
        raise Error(f"{fn}: {name}: expected a float or per-head scales [nheads_k] (deca's "
                    f"scales do not vary per request), got {_common._describe(value)}")
    return _common.scale_float(fn, name, value), None


def _batch_stride(x):
    if _common.is_torch(x):
        return x.stride(0)
    return tensor(x, "k_descale").strides[0]


def _arange_column(like, n):
    """[n, 1] int32 0..n-1 in like's library and device."""
    import numpy as np
    torch = _common.sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.arange(n, dtype=torch.int32, device=like.device).view(n, 1)
    cupy = _common.sys.modules.get("cupy")
    if cupy is not None and isinstance(like, cupy.ndarray):
        return cupy.arange(n, dtype=cupy.int32).reshape(n, 1)
    return np.arange(n, dtype=np.int32).reshape(n, 1)


def _full(like, n, value):
    import numpy as np
    torch = _common.sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.full((n,), value, dtype=torch.int32, device=like.device)
    cupy = _common.sys.modules.get("cupy")
    if cupy is not None and isinstance(like, cupy.ndarray):
        return cupy.full((n,), value, dtype=cupy.int32)
    return np.full((n,), value, dtype=np.int32)


def _contiguous(x):
    if hasattr(x, "contiguous"):
        # Through a flat view, so that size-1 dimensions get standard strides too.
        return x.contiguous().view(-1).view(x.shape)
    import numpy as np
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x.copy()
