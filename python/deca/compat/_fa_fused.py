"""flash_attn_with_kvcache's append and rotary arguments (k, v, rotary_cos, rotary_sin,
rotary_interleaved, rotary_seqlens) as deca's fused decode step (docs/python.md, "Fused decode
step"): one launch that rotates q and k, writes k / v into the cache and attends.

FlashAttention's semantics: k, v [batch, seqlen_new, nheads_k, headdim] go to cache positions
cache_seqlens[b] + i (cache_seqlens counts the keys before the append, and FlashAttention does
not update it); rotary_cos / rotary_sin [seqlen_ro, rotary_dim / 2] rotate k at positions
base + i and q at base + i when causal or local (base = rotary_seqlens, else cache_seqlens),
a non-causal, non-local q at base for every token; rotary_interleaved True pairs dims (2j, 2j+1)
(GPT-J), False dims (j, j + rotary_dim / 2) (GPT-NeoX). deca's fused op takes one position per
token for q and k alike, seq_lens counting the new keys (cache_seqlens + seqlen_new), and the
cos / sin table as one [seqlen_ro, rotary_dim] tensor (vLLM's layout), which is built once per
distinct (rotary_cos, rotary_sin) pair: an engine passes the same two tensors every layer, and
they are read at the first call that brings them (rewriting them in place afterwards is not
seen). An append without rotary is the rotation by angle 0 (cos 1, sin 0: x * 1 - y * 0 = x
exactly), at position 0 of a one-row table.
"""

from __future__ import annotations

import numpy as np

from .. import _cached_ops
from .._tensors import Error, torch_of
from . import _common

FN = "flash_attn_with_kvcache"
_NEW_LAYOUT = "[batch, seqlen_new, nheads_k, headdim]"
# deca's argument names -> the caller's, for messages the fused op raises.
NAMES = {"q": "q", "k_new": "k", "v_new": "v", "cos_sin_cache": "rotary_cos",
         "positions": "rotary_seqlens", "k_cache": "k_cache", "v_cache": "v_cache",
         "seq_lens": "cache_seqlens", "out": "out", "lse": "softmax_lse", "k_scales": "k_descale",
         "v_scales": "v_descale", "k_scale": "k_descale", "v_scale": "v_descale",
         "softmax_scale": "softmax_scale"}
# (id(rotary_cos), id(rotary_sin)) -> (rotary_cos, rotary_sin, their facts, the joined table).
_TABLES = {}
_TABLES_MAX = 64
# (library, device, batch, seqlen_q) -> (one-row identity table, zero positions).
_IDENTITY = {}


def check_new(q, k, v, rotary_cos, rotary_sin, lookahead, traced):
    """k / v / rotary against q in the caller's names: what deca's fused op can express."""
    batch, seqlen_q, _, d = q.shape
    if k is None or v is None:
        if k is None and v is None:
            raise Error(f"{FN}: k: expected {_NEW_LAYOUT} new keys with rotary_cos / rotary_sin "
                        f"(deca rotates q only together with an append), got None")
        missing = "v" if v is None else "k"
        raise Error(f"{FN}: {missing}: expected {_NEW_LAYOUT} new "
                    f"{'values' if missing == 'v' else 'keys'} with "
                    f"{'k' if missing == 'v' else 'v'} (they are appended together), got None")
    shape = _common.rank(FN, "k", k, 4, _NEW_LAYOUT)
    if shape[1] != seqlen_q:
        raise Error(f"{FN}: k: dim 1 (seqlen_new): expected seqlen_q ({seqlen_q}) (deca's new "
                    f"tokens are the queries), got {shape[1]}")
    if shape[0] != batch or shape[3] != d:
        raise Error(f"{FN}: k: expected [{batch}, {seqlen_q}, nheads_k, {d}] (q's batch and "
                    f"headdim), got {list(shape)}")
    if tuple(_common.rank(FN, "v", v, 4, _NEW_LAYOUT)) != tuple(shape):
        raise Error(f"{FN}: v: expected k's shape {list(shape)}, got {list(v.shape)}")
    if (rotary_cos is None) != (rotary_sin is None):
        missing = "rotary_sin" if rotary_sin is None else "rotary_cos"
        raise Error(f"{FN}: {missing}: expected [seqlen_ro, rotary_dim / 2] beside "
                    f"{'rotary_cos' if missing == 'rotary_sin' else 'rotary_sin'}, got None")
    if rotary_cos is not None:
        rc = _common.rank(FN, "rotary_cos", rotary_cos, 2, "[seqlen_ro, rotary_dim / 2]")
        if tuple(_common.rank(FN, "rotary_sin", rotary_sin, 2, "[seqlen_ro, rotary_dim / 2]")) \
                != tuple(rc):
            raise Error(f"{FN}: rotary_sin: expected rotary_cos's shape {list(rc)}, got "
                        f"{list(rotary_sin.shape)}")
        if rc[1] < 8 or (2 * rc[1]) % 16 or 2 * rc[1] > d:
            raise Error(f"{FN}: rotary_cos: dim 1: expected rotary_dim / 2 with rotary_dim a "
                        f"multiple of 16 in 16..headdim ({d}), got {rc[1]}")
    if lookahead is not None and rotary_cos is not None:
        raise Error(f"{FN}: causal: expected True (or window_size[1] == 0) with rotary and "
                    f"seqlen_q {seqlen_q} > 1 (FlashAttention rotates such queries all at one "
                    f"position, deca's fused step each at its own), got a query that sees keys "
                    f"past its position")
    if lookahead is not None and traced:
        raise Error(f"{FN}: causal: expected True (or window_size[1] == 0) with k / v appended "
                    f"and seqlen_q {seqlen_q} > 1 under torch.compile (deca's custom op takes "
                    f"no tree mask; eager calls run non-causal queries), got a query that sees "
                    f"keys past its position")


def cos_sin_cache(rotary_cos, rotary_sin, traced=False):
    """deca's [seqlen_ro, rotary_dim] table (cos, then sin) for this pair, built at its first
    call and kept while the pair is in use (traced: torch.compile is tracing, the join is an
    operation of the graph)."""
    if traced:
        return torch_of(rotary_cos).cat([_table_dtype(rotary_cos), _table_dtype(rotary_sin)],
                                        dim=1)
    key = (id(rotary_cos), id(rotary_sin))
    facts = (_address(rotary_cos), _address(rotary_sin), tuple(rotary_cos.shape),
             _common.dtype_of(rotary_cos))
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is rotary_cos and hit[1] is rotary_sin and hit[2] == facts:
        return hit[3]
    cos, sin = _table_dtype(rotary_cos), _table_dtype(rotary_sin)
    torch = torch_of(cos)
    if torch is not None:
        table = torch.cat([cos, sin], dim=1).contiguous()
    else:
        table = np.ascontiguousarray(np.concatenate([cos, sin], axis=1))
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[key] = (rotary_cos, rotary_sin, facts, table)
    return table


def identity(like, batch, seqlen_q, traced=False):
    """(table, positions) of the rotation by angle 0: a [1, 16] table of cos 1, sin 0 and
    [batch, seqlen_q] zero positions, in like's library and device (made in the graph when
    torch.compile is tracing, else once)."""
    device = getattr(like, "device", None)
    if traced:
        torch = torch_of(like)
        table = torch.cat([torch.ones((1, 8), device=device), torch.zeros((1, 8), device=device)],
                          dim=1)
        return table, torch.zeros((batch, seqlen_q), dtype=torch.int32, device=device)
    key = (type(like), device, batch, seqlen_q)
    hit = _IDENTITY.get(key)
    if hit is None:
        table = np.concatenate([np.ones((1, 8), np.float32), np.zeros((1, 8), np.float32)], 1)
        pos = np.zeros((batch, seqlen_q), np.int32)
        torch = torch_of(like)
        if torch is not None:
            table, pos = torch.from_numpy(table).to(device), torch.from_numpy(pos).to(device)
        hit = _IDENTITY[key] = (table, pos)
    return hit


def positions(rotary_seqlens, seqlen_q):
    """[batch, seqlen_q] int32 rotary_seqlens[b] + i (FlashAttention's rotary base override)."""
    _common.rank(FN, "rotary_seqlens", rotary_seqlens, 1, "[batch]")
    torch = torch_of(rotary_seqlens)
    if torch is not None:
        steps = torch.arange(seqlen_q, dtype=torch.int32, device=rotary_seqlens.device)
        return (rotary_seqlens.to(torch.int32)[:, None] + steps[None, :]).contiguous()
    base = np.asarray(rotary_seqlens).astype(np.int32)
    return np.ascontiguousarray(base[:, None] + np.arange(seqlen_q, dtype=np.int32)[None, :])


def new_tokens(x, compute_dtype, scale, scales, name):
    """k or v in q's (widened) dtype: as given, or an fp8 k / v widened (exact) and multiplied by
    its descale (its real value, which deca quantizes with the same scale on append)."""
    dtype = _common.dtype_of(x)
    if dtype == compute_dtype:
        return x
    if dtype != "fp8_e4m3":
        raise Error(f"{FN}: {name}: expected q's dtype ({compute_dtype}) or float8_e4m3fn, got "
                    f"{_common.spell(x, dtype)}")
    torch = torch_of(x)
    if torch is not None:
        if scales is None and scale == 1.0:
            return x.to(torch.bfloat16)
        factor = scales[:, None] if scales is not None else scale
        return (x.float() * factor).to(torch.bfloat16)  # one rounding, as numpy's below
    import ml_dtypes
    wide = x.astype(ml_dtypes.bfloat16)
    if scales is not None:
        return (wide.astype(np.float32) * scales[:, None]).astype(ml_dtypes.bfloat16)
    return wide if scale == 1.0 else (wide.astype(np.float32) * scale).astype(ml_dtypes.bfloat16)


def run(q, k_new, v_new, table, positions_, k_cache, v_cache, page_table, seq_lens, out, lse,
        style, scales, softmax_scale, softcap, window, mask):
    """One fused call: the torch custom op for torch tensors (traceable), else (and with a tree
    mask, which the op does not take) the cached plan."""
    k_scale, v_scale, k_scales, v_scales = scales
    ops = _common.torch_ops(q)
    try:
        if ops is not None and mask is None:
            ops.gqa_decode_fused(q, k_new, v_new, table, positions_, k_cache, v_cache,
                                 page_table, seq_lens, out, lse, None, k_scales, v_scales, style,
                                 "NHD", 0, "", float(k_scale), float(v_scale),
                                 float(softmax_scale), float(softcap), int(window), 1.0)
        else:
            _cached_ops.gqa_fused(q, k_new, v_new, table, k_cache, v_cache, page_table,
                                  seq_lens, out, lse, positions=positions_, rope_style=style,
                                  fn=FN, k_scale=k_scale, v_scale=v_scale, k_scales=k_scales,
                                  v_scales=v_scales, softmax_scale=softmax_scale,
                                  softcap=softcap, window=window, tree_mask=mask)
    except Error as e:
        raise _common.translate(e, FN, "gqa_decode", NAMES) from None
    return out


def _address(x):
    if _common.is_torch(x):
        return x.data_ptr()
    return np.asarray(x).__array_interface__["data"][0]


def _table_dtype(x):
    """cos / sin in a dtype deca's table takes: fp32, bf16, fp16 as they are; fp8 (as
    FlashAttention-3's fp8 tests pass them) widened to bf16, exactly."""
    if _common.dtype_of(x) in ("fp32", "bf16", "fp16"):
        return x
    if _common.dtype_of(x) != "fp8_e4m3":
        raise Error(f"{FN}: rotary_cos: expected float32, bfloat16, float16 or float8_e4m3fn, "
                    f"got {_common.spell(x, _common.dtype_of(x))}")
    torch = torch_of(x)
    if torch is not None:
        return x.to(torch.bfloat16)
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16)
