"""The fused decode step as a one-off call (docs/python.md, "Fused decode step"): the plan and
workspace come from the tensors' shapes at the first call of a shape (deca._cached_ops)."""

from __future__ import annotations

from . import _cached_ops


def gqa_decode_fused(q, k_new, v_new, cos_sin_cache, k_cache, v_cache, page_table, seq_lens, out,
                     *, positions=None, rope_style="neox", layout="NHD", lse=None,
                     max_seq_len=0, kv_dtype=None, k_scale=1.0, v_scale=1.0, k_scales=None,
                     v_scales=None, softmax_scale=0.0, softcap=0.0, window=0, sinks=None,
                     out_scale=1.0, split_mode="auto", split_tokens=0):
    """Rotates q and k_new ([batch, q_len, heads, head_dim], q's dtype, before rotary embedding)
    with cos_sin_cache [max_position, rotary_dim] (vLLM's layout: cos of rotary_dim / 2
    frequencies, then sin; rotary_dim from its shape) in rope_style "neox" (GPT-NeoX halves) or
    "gptj" (interleaved pairs) at positions [batch, q_len] int32 (None: seq_lens[b] - q_len + i),
    writes k_new / v_new into k_cache / v_cache at cache position seq_lens[b] - q_len + i
    (seq_lens count the new tokens; fp8 / int8 caches store round(x / scale)), then attends as
    deca.gqa_decode, in one launch. Writes out (and lse) and the new slots; returns out."""
    return _cached_ops.gqa_fused(q, k_new, v_new, cos_sin_cache, k_cache, v_cache, page_table,
                                 seq_lens, out, lse, positions=positions, rope_style=rope_style,
                                 fn="gqa_decode_fused", layout=layout, max_seq_len=max_seq_len,
                                 kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale,
                                 k_scales=k_scales, v_scales=v_scales,
                                 softmax_scale=softmax_scale, softcap=softcap, window=window,
                                 sinks=sinks, out_scale=out_scale, split_mode=split_mode,
                                 split_tokens=split_tokens)
