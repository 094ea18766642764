"""deca's decode calls as torch custom ops: torch.ops.deca.gqa_decode, .gqa_decode_fused,
.mla_decode_sparse and .mla_decode_dense, so that torch.compile'd models keep them as single graph nodes (no graph
break) and CUDA-graph captures of compiled models hold them.

Registered by `import deca.torch_ops`, or by deca.compat the first time torch.compile traces one
of its calls (deca itself never imports torch).
Each op writes the caller's out (and lse when given) in place and returns nothing: torch's rule
for ops that mutate their arguments, declared through mutates_args. The fake (meta)
implementations only check nothing and return None, which is all torch.compile needs from an op
whose outputs are its mutated inputs. The bodies run deca._cached_ops: one plan and workspace
per shape, made at the first call (make it before a capture).

No `from __future__ import annotations` here: torch reads these annotations to build the op
schemas.
"""

from typing import Optional

import torch

from . import _cached_ops

_LIB = "deca"


@torch.library.custom_op(f"{_LIB}::gqa_decode", mutates_args=("out", "lse"))
def gqa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               page_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
               lse: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
               k_scales: Optional[torch.Tensor], v_scales: Optional[torch.Tensor], layout: str,
               max_seq_len: int, kv_dtype: str, k_scale: float, v_scale: float,
               softmax_scale: float, softcap: float, window: int, out_scale: float,
               split_mode: str, split_tokens: int, skip_softmax_factor: float = 0.0) -> None:
    """Paged GQA decode (deca.gqa_decode's semantics) into out [batch, q_len, hq, d] and lse
    [batch, q_len, hq]; max_seq_len 0 = the page table's capacity; kv_dtype "" = the cache's own
    dtype (pass "fp8_e4m3" for fp8 bits in uint8); skip_softmax_factor > 0: skip-softmax
    (approximate, deca.gqa_decode's keyword)."""
    _cached_ops.gqa(q, k_cache, v_cache, page_table, seq_lens, out, lse, layout=layout,
                    max_seq_len=max_seq_len, kv_dtype=kv_dtype or None, k_scale=k_scale,
                    v_scale=v_scale, k_scales=k_scales, v_scales=v_scales,
                    softmax_scale=softmax_scale, softcap=softcap, window=window, sinks=sinks,
                    out_scale=out_scale, split_mode=split_mode, split_tokens=split_tokens,
                    skip_softmax_factor=skip_softmax_factor)


@gqa_decode.register_fake
def _gqa_decode_fake(q, k_cache, v_cache, page_table, seq_lens, out, lse, sinks, k_scales,
                     v_scales, layout, max_seq_len, kv_dtype, k_scale, v_scale, softmax_scale,
                     softcap, window, out_scale, split_mode, split_tokens, skip_softmax_factor=0.0):
    return None


@torch.library.custom_op(f"{_LIB}::gqa_decode_fused",
                         mutates_args=("k_cache", "v_cache", "out", "lse"))
def gqa_decode_fused(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                     cos_sin_cache: torch.Tensor, positions: Optional[torch.Tensor],
                     k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                     seq_lens: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
                     sinks: Optional[torch.Tensor], k_scales: Optional[torch.Tensor],
                     v_scales: Optional[torch.Tensor], rope_style: str, layout: str,
                     max_seq_len: int, kv_dtype: str, k_scale: float, v_scale: float,
                     softmax_scale: float, softcap: float, window: int, out_scale: float) -> None:
    """The fused decode step (GqaPlan.run_fused's semantics): q, k_new, v_new before rotary
    embedding, rotated with cos_sin_cache [max_position, rotary_dim] (rope_style "neox" or
    "gptj") at positions [batch, q_len] int32 (None: their cache positions); k_new / v_new
    written into k_cache / v_cache, then out [batch, q_len, hq, d] (and lse) computed."""
    _cached_ops.gqa_fused(q, k_new, v_new, cos_sin_cache, k_cache, v_cache, page_table,
                          seq_lens, out, lse, positions=positions, rope_style=rope_style,
                          layout=layout, max_seq_len=max_seq_len, kv_dtype=kv_dtype or None,
                          k_scale=k_scale, v_scale=v_scale, k_scales=k_scales,
                          v_scales=v_scales, softmax_scale=softmax_scale, softcap=softcap,
                          window=window, sinks=sinks, out_scale=out_scale)


@gqa_decode_fused.register_fake
def _gqa_decode_fused_fake(q, k_new, v_new, cos_sin_cache, positions, k_cache, v_cache,
                           page_table, seq_lens, out, lse, sinks, k_scales, v_scales, rope_style,
                           layout, max_seq_len, kv_dtype, k_scale, v_scale, softmax_scale,
                           softcap, window, out_scale):
    return None


@torch.library.custom_op(f"{_LIB}::mla_decode_sparse", mutates_args=("out", "lse"))
def mla_decode_sparse(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
                      out: torch.Tensor, lse: Optional[torch.Tensor],
                      topk_length: Optional[torch.Tensor], attn_sink: Optional[torch.Tensor],
                      softmax_scale: float, extra_kv_cache: Optional[torch.Tensor] = None,
                      extra_indices: Optional[torch.Tensor] = None,
                      extra_topk_length: Optional[torch.Tensor] = None,
                      lse_of_empty_row: str = "-inf") -> None:
    """Sparse FP8 MLA decode (deca.mla_decode_sparse's semantics) into out [batch, q_len,
    heads, 512] and lse [batch, q_len, heads]; a [.., 584] cache is MODEL1's (q [.., 512]), with
    the optional second cache (extra_kv_cache, extra_indices, extra_topk_length).
    lse_of_empty_row: the LSE of a row without a valid key, "-inf" or "+inf" (MlaPlan's)."""
    _cached_ops.mla_sparse(q, kv_cache, indices, out, lse, topk_length=topk_length,
                           attn_sink=attn_sink, softmax_scale=softmax_scale,
                           extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
                           extra_topk_length=extra_topk_length,
                           lse_of_empty_row=lse_of_empty_row)


@mla_decode_sparse.register_fake
def _mla_decode_sparse_fake(q, kv_cache, indices, out, lse, topk_length, attn_sink,
                            softmax_scale, extra_kv_cache=None, extra_indices=None,
                            extra_topk_length=None, lse_of_empty_row="-inf"):
    return None


@torch.library.custom_op(f"{_LIB}::mla_decode_dense", mutates_args=("out", "lse"))
def mla_decode_dense(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     cache_seqlens: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
                     softmax_scale: float, kv_scale: float, kv_format: str,
                     lse_of_empty_row: str = "-inf") -> None:
    """Dense MLA decode (deca.mla_decode_dense's semantics) into out [batch, q_len, heads, 512]
    and lse [batch, q_len, heads]: a bf16, fp8 e4m3 (kv_scale: real = stored * kv_scale) or
    656-byte token cache; kv_format "" = from the cache's dtype (pass "fp8_e4m3" for e4m3 bits
    in uint8). lse_of_empty_row as mla_decode_sparse's."""
    _cached_ops.mla_dense(q, kv_cache, block_table, cache_seqlens, out, lse,
                          softmax_scale=softmax_scale, kv_scale=kv_scale,
                          kv_format=kv_format or None, lse_of_empty_row=lse_of_empty_row)


@mla_decode_dense.register_fake
def _mla_decode_dense_fake(q, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale,
                           kv_scale, kv_format, lse_of_empty_row="-inf"):
    return None


_cached_ops.TORCH_OPS_REGISTERED = True
