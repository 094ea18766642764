"""`flash_attn_interface` (FlashAttention-3's Python module) for its own kv-cache test, run
against deca (tools/peer_suites.py): flash_attn_with_kvcache with FlashAttention-3's signature
(its positional order: k, v, qv, rotary_cos, ...) forwarding every argument by keyword to
deca.compat.flash_attn_with_kvcache. The module's other functions exist (the test imports them)
and raise when called: deca has no prefill or backward."""

import deca
from deca import compat


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    return compat.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k, v=v, qv=qv, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new, max_seqlen_q=max_seqlen_q,
        rotary_seqlens=rotary_seqlens, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, softmax_scale=softmax_scale, causal=causal,
        window_size=tuple(int(w) for w in window_size), attention_chunk=attention_chunk,
        softcap=softcap, rotary_interleaved=rotary_interleaved,
        scheduler_metadata=scheduler_metadata, num_splits=num_splits, pack_gqa=pack_gqa,
        sm_margin=sm_margin, return_softmax_lse=return_softmax_lse)


def get_scheduler_metadata(*args, **kwargs):
    """FlashAttention-3's precomputed schedule: deca plans for itself, and flash_attn_with_kvcache
    ignores scheduler_metadata (a hint that cannot change the result)."""
    return None


def _absent(name):
    def call(*args, **kwargs):
        raise deca.Error(f"flash_attn_interface.{name}: deca.compat provides "
                         f"flash_attn_with_kvcache only (decode), got a call")
    call.__name__ = name
    return call


flash_attn_func = _absent("flash_attn_func")
flash_attn_varlen_func = _absent("flash_attn_varlen_func")
flash_attn_qkvpacked_func = _absent("flash_attn_qkvpacked_func")
flash_attn_combine = _absent("flash_attn_combine")
