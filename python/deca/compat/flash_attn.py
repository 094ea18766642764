"""FlashAttention's flash_attn_with_kvcache for the decode call (what vLLM's FlashAttention
backend makes), on deca's paged GQA decode.

FlashAttention's window_size = (left, right) lets query i of a request with seqlen_k keys see
key j iff  p - left <= j <= p + right,  p = i + seqlen_k - seqlen_q  (-1 = unbounded; causal
sets right = 0). deca's window W shows keys p - W < t <= p, so left maps to W = left + 1 and
a query of a multi-token call (seqlen_q > 1) that may see keys past p (causal False, right -1
or > 0) runs as deca's tree mask: the last seqlen_q keys are the new tokens, and bit j of row i
(new key j visible to query i) is set iff j <= i + right (every j for right -1); keys before
the new ones are visible to every query, the window permitting, as in FlashAttention. Its
softmax_lse is the natural log, [batch, nheads, seqlen_q] fp32, -inf for a row without a key,
as deca's (deca writes it through a transposed view, so nothing is copied).

fp8 (FlashAttention-3, and vLLM with an fp8 KV cache): q may come as float8_e4m3fn with
q_descale of shape (batch, nheads_k) (real q = stored q * q_descale), beside an fp8 cache with
k_descale / v_descale of the same shape. deca widens q to bf16, which is exact (every e4m3 value
is a bf16 value), and folds the descales into the scales its kernels apply in fp32: q_descale
and k_descale both scale the logits q.k, so they multiply into deca's logit scale; v_descale is
deca's value scale. One value each (a float, a one-element CPU tensor, or a (batch, nheads_k)
tensor whose rows are one row: batch stride 0 as vLLM's expand() gives, or equal rows on the
host) becomes deca's per-tensor or per-head scale: exact up to the fp32 rounding of the scale
products, as FlashAttention-3's own kernels fold them. Rows that differ per request (a device
tensor with a batch stride, which deca cannot read without a sync) run one request at a time,
each with its own row as per-head scales: exact as well, at batch times the host cost. As in
FlashAttention-3, descales apply to fp8 inputs only: q_descale to an fp8 q, k/v_descale to an
8-bit cache; for bf16 / fp16 ones they are ignored.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _cached_ops, _plan_cache
from .._tensors import (FALLBACKS, Error, allocator, bits_views, call_key, cupy_of, maker,
                        py_key, stream_getter, torch_of)
from . import _common, _fa_fused
from ._descale import descale_plan

FN = "flash_attn_with_kvcache"
_CACHE_LAYOUT = "[num_blocks, page_block_size, nheads_k, headdim]"
# deca's argument names -> the caller's, for messages deca raises past the checks here.
_NAMES = {"q": "q", "k_cache": "k_cache", "v_cache": "v_cache", "seq_lens": "cache_seqlens",
          "out": "out", "lse": "softmax_lse", "k_scales": "k_descale", "v_scales": "v_descale",
          "k_scale": "k_descale", "v_scale": "v_descale", "softmax_scale": "softmax_scale"}
# The caller's call shape (metadata and options) -> _Prepared.
_PREPARED = _plan_cache.memo()


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
    request, the new tokens included (without k / v). Returns out [batch, seqlen_q, nheads, d]
    (bf16 for an fp8 q), or (out, softmax_lse [batch, nheads, seqlen_q] fp32) with
    return_softmax_lse.

    k, v [batch, seqlen_q, nheads_k, d] (q's dtype, or fp8 with its descale): appended at
    cache_seqlens[b] + i (which then counts the keys before them and is not updated), rotated
    with rotary_cos / rotary_sin [seqlen_ro, rotary_dim / 2] (rotary_interleaved: GPT-J pairs,
    else GPT-NeoX halves; rotary_seqlens: the positions' base) together with q, in deca's fused
    decode step (one launch; _fa_fused's notes). What it cannot express raises deca.Error naming
    the argument: seqlen_new != seqlen_q, k without v, rotary without k, rotary with a query
    that sees keys past its position (non-causal seqlen_q > 1), descales that differ per request.

    q: bf16, fp16, or float8_e4m3fn (with q_descale; see the module's notes). k_descale /
    v_descale: scales of an fp8 cache: floats, per-head [nheads_k] tensors, or FlashAttention-3's
    (batch, nheads_k). num_splits, pack_gqa, sm_margin and scheduler_metadata are performance
    hints deca decides for itself (ignored), and so are rotary_seqlens and rotary_interleaved
    without rotary_cos (FlashAttention-3 reads them only with rotary). Arguments that would
    change the result in ways deca cannot (alibi, cache_batch_idx,
    cache_leftpad, varlen q, attention_chunk) raise deca.Error naming them; so does a
    non-causal multi-token query under torch.compile, or one whose request holds fewer keys
    than seqlen_q.
    """
    table = block_table if block_table is not None else page_table
    if (cache_batch_idx is not None or cache_leftpad is not None or
            alibi_slopes is not None or qv is not None or cu_seqlens_q is not None or
            cu_seqlens_k_new is not None or max_seqlen_q is not None or attention_chunk or
            (block_table is not None and page_table is not None)):
        _refuse(cache_batch_idx, cache_leftpad, alibi_slopes, qv, cu_seqlens_q,
                cu_seqlens_k_new, max_seqlen_q, attention_chunk, block_table, page_table)
    if k is not None or v is not None or rotary_cos is not None or rotary_sin is not None:
        return _fused(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, table,
                      softmax_scale, causal, window_size, softcap, rotary_interleaved,
                      rotary_seqlens, return_softmax_lse, q_descale, k_descale, v_descale, out)
    if _common.compiling(q):
        return _traced(q, k_cache, v_cache, table, cache_seqlens, softmax_scale, causal,
                       window_size, softcap, return_softmax_lse, q_descale, k_descale,
                       v_descale, out)
    # What identifies the call's shape (the tensors' shapes, dtypes and devices; the options):
    # a repeated one finds what its first call checked and planned.
    tensors = (q, k_cache, table, cache_seqlens, out)
    values = (block_table is None, softmax_scale, causal, window_size, softcap,
              return_softmax_lse)
    key = call_key(tensors, values) or py_key(tensors, values)
    if key is not None:
        prepared = _PREPARED.get(key)
        if prepared is not None:
            try:
                return prepared.run(q, k_cache, v_cache, table, cache_seqlens, out, q_descale,
                                    k_descale, v_descale, False)
            except (Error, TypeError):
                FALLBACKS[FN] += 1  # the checked run below names what the fast one refused
    prepared = _Prepared(q, k_cache, v_cache, table, block_table is not None, cache_seqlens,
                         softmax_scale, causal, window_size, softcap, return_softmax_lse, out)
    if key is not None:
        _PREPARED[key] = prepared
    return prepared.run(q, k_cache, v_cache, table, cache_seqlens, out, q_descale, k_descale,
                        v_descale, True)


def _refuse(cache_batch_idx, cache_leftpad, alibi_slopes, qv, cu_seqlens_q, cu_seqlens_k_new,
            max_seqlen_q, attention_chunk, block_table, page_table):
    _common.refuse(FN, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                   alibi_slopes=alibi_slopes, qv=qv, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k_new=cu_seqlens_k_new, max_seqlen_q=max_seqlen_q)
    if attention_chunk:
        raise Error(f"{FN}: attention_chunk: expected 0 (deca does not support chunked "
                    f"attention), got {attention_chunk!r}")
    raise Error(f"{FN}: page_table: expected None when block_table is given (they are "
                f"the same argument), got both")


def _fused(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, table,
           softmax_scale, causal, window_size, softcap, rotary_interleaved, rotary_seqlens,
           return_lse, q_descale, k_descale, v_descale, out):
    """k / v appended (and rotated with q) in deca's fused decode step (_fa_fused's notes)."""
    batch, seqlen_q, nheads, d = _common.rank(FN, "q", q, 4, "[batch, seqlen_q, nheads, headdim]")
    q_dtype = _common.expect_dtype(FN, "q", q, ("bf16", "fp16", "fp8_e4m3"))
    kv_dtype = _check_cache(q, k_cache, v_cache, nheads, d)
    window = _window(window_size, causal, seqlen_q)
    traced = _common.compiling(q)
    _fa_fused.check_new(q, k, v, rotary_cos, rotary_sin,
                        _lookahead(window_size, causal, seqlen_q), traced)
    mask = _lookahead_mask(q, batch, seqlen_q, window_size, causal)
    if k.shape[2] != k_cache.shape[2]:
        raise Error(f"{FN}: k: dim 2 (nheads_k): expected k_cache's {k_cache.shape[2]}, got "
                    f"{k.shape[2]}")
    q_fp8 = q_dtype == "fp8_e4m3"
    wide = "bf16" if q_fp8 else q_dtype
    scale = float(softmax_scale or 0.0) or d ** -0.5
    if q_fp8 and q_descale is not None:
        qs = descale_plan(FN, q, batch, k_cache.shape[2], q_descale, None, None,
                          read_host=not traced)
        if qs.per_request or qs.k_scales is not None:
            raise Error(f"{FN}: q_descale: expected one value (every row alike) with k / v "
                        f"appended, got one per request or per head")
        scale *= float(qs.k_scale)
    if q_fp8:
        q = _widen(q)
    scales = (1.0, 1.0, None, None)
    if kv_dtype in ("fp8_e4m3", "int8") and (k_descale is not None or v_descale is not None):
        plan = descale_plan(FN, q, batch, k_cache.shape[2], None, k_descale, v_descale,
                            read_host=not traced)
        if plan.per_request:
            raise Error(f"{FN}: k_descale: expected one row for every request with k / v "
                        f"appended (deca quantizes the new keys with one scale per head), got "
                        f"rows that differ per request")
        scales = plan.values()
    k = _fa_fused.new_tokens(k, wide, scales[0], scales[2], "k")
    v = _fa_fused.new_tokens(v, wide, scales[1], scales[3], "v")
    if rotary_cos is not None:
        cs = _fa_fused.cos_sin_cache(rotary_cos, rotary_sin, traced)
        pos = None if rotary_seqlens is None else _fa_fused.positions(rotary_seqlens, seqlen_q)
        style = "gptj" if rotary_interleaved else "neox"
    else:
        (cs, pos), style = _fa_fused.identity(q, batch, seqlen_q, traced), "neox"
    if table is None:
        table = _contiguous_table(q, k_cache, batch)
    if cache_seqlens is None:
        raise Error(f"{FN}: cache_seqlens: expected [batch] int32 key counts before the append "
                    f"with k / v, got None")
    if isinstance(cache_seqlens, int):
        seq_lens = _full(q, batch, cache_seqlens + seqlen_q)
    else:
        _common.expect_dtype(FN, "cache_seqlens", cache_seqlens, ("int32",))
        seq_lens = cache_seqlens + seqlen_q
    if out is None:
        out = allocator(q, f"{FN}: out")(tuple(q.shape), wide)
    lse = None
    if return_lse:
        lse = allocator(q, f"{FN}: softmax_lse")((batch, seqlen_q, nheads), "fp32")
    _fa_fused.run(q, k, v, cs, pos, k_cache, v_cache, table, seq_lens, out, lse, style, scales,
                  scale, softcap, window, mask)
    return (out, _transposed(lse)) if return_lse else out


class _Prepared:
    """One call shape of flash_attn_with_kvcache, checked and planned at its first call: the
    plan and workspace (per-head and per-request variants fetched as descales need them), the
    window and scale, and the constant page table / lengths of a contiguous cache."""

    def __init__(self, q, k_cache, v_cache, table, table_is_block, cache_seqlens,
                 softmax_scale, causal, window_size, softcap, return_lse, out):
        _common.torch_ops(q)  # a shape's first eager call registers the ops for later traces
        batch, seqlen_q, nheads, d = _common.rank(FN, "q", q, 4,
                                                  "[batch, seqlen_q, nheads, headdim]")
        self.table_name = "block_table" if table_is_block else "page_table"
        q_dtype = _common.expect_dtype(FN, "q", q, ("bf16", "fp16", "fp8_e4m3"))
        kv_dtype = _check_cache(q, k_cache, v_cache, nheads, d)
        self.q_fp8 = q_dtype == "fp8_e4m3"
        self.kv8 = kv_dtype in ("fp8_e4m3", "int8")
        self.eight_bit = self.q_fp8 or self.kv8  # q to widen, descales to read
        self.window = _window(window_size, causal, seqlen_q)
        self.mask = _lookahead_mask(q, batch, seqlen_q, window_size, causal)
        self.softcap = softcap
        self.scale = float(softmax_scale or 0.0)
        self.shape = (batch, seqlen_q, nheads, d)
        self.lse = bool(return_lse)
        self.hkv = k_cache.shape[2]
        q_like = _widen(q) if self.q_fp8 else q
        self.numpy = type(q) is np.ndarray
        self.table = self.lens = None
        if table is None:
            self.table = table = _contiguous_table(q, k_cache, batch)
        else:
            _common.rank(FN, self.table_name, table, 2, "[batch, max_num_blocks_per_seq]")
        if cache_seqlens is None:
            if self.table is None:
                raise Error(f"{FN}: cache_seqlens: expected [batch] int32 key counts with a "
                            f"paged cache, got None")
            cache_seqlens = k_cache.shape[1]
        if isinstance(cache_seqlens, int):
            self.lens = _full(q, batch, cache_seqlens)
        if out is None:
            self.new_out = maker(q, self.shape, "bf16" if self.q_fp8 else q_dtype, f"{FN}: out")
        # The LSE as run() allocates it: FlashAttention's [batch, nheads, 1] itself for one
        # query token (deca writes it through a transposed view), else deca's rows of heads.
        self.new_lse = maker(q, (batch, nheads, 1) if seqlen_q == 1 else
                             (batch, seqlen_q, nheads), "fp32", f"{FN}: softmax_lse")
        # run() makes one C++ call itself for one query token in torch (no tree mask then, no
        # request with fewer keys than queries, no raw-bit views), descales aside.
        self.direct = seqlen_q == 1 and not self.numpy
        self.plan, self.ws = self.plan_for(q_like, k_cache, table, out, False)
        self._c_plan = self.plan._plan
        self.stream = stream_getter(self.plan._cuda_index, q)

    def plan_for(self, q, k_cache, table, out, per_head):
        """(GqaPlan, workspace) for q (bf16 / fp16) with per-head scales or without."""
        like_out = out if out is not None else q
        return _cached_ops.gqa_plan(q, k_cache, table, like_out, fn=FN, lse=self.lse,
                                    per_head=per_head, window=self.window, softcap=self.softcap,
                                    tree_mask=self.mask is not None)

    def run(self, q, k_cache, v_cache, table, lens, out, q_descale, k_descale, v_descale,
            checked):
        """The decode of one call of this shape into out (new when None). checked=False (a
        repeated call): nothing checked here, the C++ calls raise (before any launch) what the
        checked run would name, and the caller retries checked; checked=True: each argument
        checked in the caller's names first, deca's own messages translated into them."""
        if checked:
            _check_run(self, q, k_cache, v_cache, table, lens, out)
        if self.table is not None:
            table = self.table
        if self.lens is not None:
            lens = self.lens
        scales = None
        if self.eight_bit:
            q, scales = self._eight_bit(q, q_descale, k_descale, v_descale)
        if out is None:
            out = self.new_out()
        lse = self.new_lse() if self.lse else None
        if self.direct and scales is None and not checked:
            # The repeated one-token call: one C++ call, which takes FlashAttention's LSE
            # [batch, nheads, 1] as it is (the binding reads it as deca's [batch, 1, nheads]).
            _C.gqa_decode_planned_fast(self._c_plan, q, k_cache, v_cache, table, lens, out, lse,
                                       None, None, None, None, 1.0, 1.0, self.scale, 1.0,
                                       self.ws, self.stream(), True)
            return (out, lse) if self.lse else out
        per_request = scales is not None and scales.per_request
        # One query token: deca writes the [batch, nheads, 1] LSE as its [batch, 1, nheads],
        # heads first on the one-call fast path, else through a transposed view. More tokens:
        # deca's rows of heads, transposed on return.
        heads_first = lse is not None and self.shape[1] == 1 and not checked and not per_request
        view = lse if lse is None or heads_first or self.shape[1] > 1 else lse.swapaxes(1, 2)
        if per_request:
            for b in range(self.shape[0]):
                s = slice(b, b + 1)
                self._decode(q[s], k_cache, v_cache, table[s], lens[s], out[s],
                             None if view is None else view[s], scales.request(b), checked,
                             None if self.mask is None else self.mask[s])
        else:
            self._decode(q, k_cache, v_cache, table, lens, out, view, scales, checked,
                         self.mask, heads_first)
        if not self.lse:
            return out
        return out, (lse if self.shape[1] == 1 else _transposed(lse))

    def _eight_bit(self, q, q_descale, k_descale, v_descale):
        """(q widened to bf16 when fp8, the descales' plan or None) of an fp8 q or cache."""
        if self.q_fp8:
            q = _widen(q)
        if (self.q_fp8 and q_descale is not None) or (self.kv8 and (k_descale is not None or
                                                                    v_descale is not None)):
            return q, descale_plan(FN, q, self.shape[0], self.hkv,
                                   q_descale if self.q_fp8 else None,
                                   k_descale if self.kv8 else None,
                                   v_descale if self.kv8 else None)
        return q, None

    def _decode(self, q, k_cache, v_cache, table, lens, out, lse, scales, checked, mask,
                heads_first=False):
        """One decode of these requests. A request holding fewer keys than seqlen_q (lengths on
        the host) is FlashAttention's too: query i sees the keys up to i + seqlen_k - seqlen_q,
        so its first seqlen_q - seqlen_k queries see none (zeros, LSE -inf), which deca's own
        calls refuse (there the new tokens are in the cache): such a request decodes as empty
        with the others, then its last seqlen_k queries alone. heads_first: lse is
        FlashAttention's [batch, nheads, 1] itself (one query token, the fast path)."""
        seqlen_q = q.shape[1]
        host = _host_array(lens) if seqlen_q > 1 else None
        short = [] if host is None else np.nonzero((host > 0) & (host < seqlen_q))[0]
        if len(short) == 0:
            self._decode_once(q, k_cache, v_cache, table, lens, out, lse, scales, checked, mask,
                              heads_first)
            return
        if mask is not None:
            b = int(short[0])
            raise Error(f"{FN}: cache_seqlens: expected at least seqlen_q ({seqlen_q}) keys in "
                        f"every non-empty request of a non-causal call (deca's new tokens are "
                        f"the last seqlen_q keys), got {int(host[b])} at [{b}]")
        emptied = lens.copy() if isinstance(lens, np.ndarray) else lens.clone()
        emptied[short] = 0
        self._decode_once(q, k_cache, v_cache, table, emptied, out, lse, scales, checked, None)
        for b in short:
            rows = slice(seqlen_q - int(host[b]), seqlen_q)
            self._decode_once(q[b:b + 1, rows], k_cache, v_cache, table[b:b + 1],
                              lens[b:b + 1], out[b:b + 1, rows],
                              None if lse is None else lse[b:b + 1, rows], scales, checked, None)

    def _decode_once(self, q, k_cache, v_cache, table, lens, out, lse, scales, checked, mask,
                     heads_first=False):
        k_scale = v_scale = 1.0
        k_scales = v_scales = None
        plan, ws = self.plan, self.ws
        if scales is not None:
            k_scale, v_scale, k_scales, v_scales = scales.values()
        if k_scales is not None or tuple(q.shape[:2]) != self.shape[:2]:
            plan, ws = self.plan_for(q, k_cache, table, out, k_scales is not None)
        if not checked:
            if self.numpy:
                qd, kd, od = plan._numpy_dtypes
                (q,), (k_cache, v_cache) = bits_views(qd, q), bits_views(kd, k_cache, v_cache)
                out, = bits_views(od, out)
            _C.gqa_decode_planned_fast(plan._plan, q, k_cache, v_cache, table, lens, out, lse,
                                       mask, None, k_scales, v_scales, k_scale, v_scale,
                                       self.scale, 1.0, ws, self.stream(), heads_first)
            return
        try:
            plan.run(q, k_cache, v_cache, table, lens, out, workspace=ws, lse=lse, tree_mask=mask,
                     k_scale=k_scale, v_scale=v_scale, k_scales=k_scales, v_scales=v_scales,
                     softmax_scale=self.scale or None)
        except Error as e:
            names = dict(_NAMES, page_table=self.table_name)
            raise _common.translate(e, FN, "gqa_decode", names) from None


def _check_cache(q, k_cache, v_cache, nheads, d):
    """k_cache / v_cache against q, in the caller's names; returns the cache's dtype."""
    k_shape = _common.rank(FN, "k_cache", k_cache, 4, _CACHE_LAYOUT)
    v_shape = _common.rank(FN, "v_cache", v_cache, 4, _CACHE_LAYOUT)
    kv_dtype = _common.expect_dtype(FN, "k_cache", k_cache, ("bf16", "fp16", "fp8_e4m3", "int8"),
                                    "fp8 bytes in uint8: pass k_cache.view(float8_e4m3fn)"
                                    if _common.dtype_of(k_cache) == "uint8" else "")
    if _common.dtype_of(v_cache) != kv_dtype:
        raise Error(f"{FN}: v_cache: expected {_common.spell(v_cache, kv_dtype)} (k_cache's "
                    f"dtype), got {_common.spell(v_cache, _common.dtype_of(v_cache))}")
    if v_shape != k_shape:
        raise Error(f"{FN}: v_cache: expected k_cache's shape {list(k_shape)} (deca reads one "
                    f"headdim for K and V), got {list(v_shape)}")
    if k_shape[3] != d:
        raise Error(f"{FN}: q: dim 3 (headdim): expected k_cache's headdim {k_shape[3]}, got {d}")
    hkv = k_shape[2]
    if hkv < 1 or nheads % hkv:
        hint = ""
        if k_shape[1] >= 1 and nheads % k_shape[1] == 0:
            hint = (f"; k_cache looks like [num_blocks, nheads_k, page_block_size, headdim] "
                    f"(HND): FlashAttention reads NHD {_CACHE_LAYOUT}, e.g. "
                    f"k_cache.transpose(1, 2)")
        raise Error(f"{FN}: q: dim 2 (nheads): expected a multiple of k_cache's nheads_k "
                    f"(dim 2 of {_CACHE_LAYOUT}) = {hkv}, got {nheads}{hint}")
    return kv_dtype


def _check_run(p, q, k_cache, v_cache, table, lens, out):
    """What a call of a prepared shape may still get wrong, in the caller's names."""
    batch = p.shape[0]
    if table is not None and p.table is None:
        _common.rank(FN, p.table_name, table, 2, "[batch, max_num_blocks_per_seq]")
        _common.expect_dtype(FN, p.table_name, table, ("int32",))
        if table.shape[0] != batch:
            raise Error(f"{FN}: {p.table_name}: expected {batch} rows (q's batch), got "
                        f"{table.shape[0]}")
    if p.lens is None:
        shape = _common.rank(FN, "cache_seqlens", lens, 1, "[batch] (or an int)")
        _common.expect_dtype(FN, "cache_seqlens", lens, ("int32",))
        if shape[0] != batch:
            raise Error(f"{FN}: cache_seqlens: expected [batch] = [{batch}], got {list(shape)}")
    if _common.dtype_of(v_cache) != _common.dtype_of(k_cache) or \
            tuple(v_cache.shape) != tuple(k_cache.shape):
        _check_cache(q, k_cache, v_cache, p.shape[2], p.shape[3])
    if out is not None:
        want = "bf16" if p.q_fp8 else _common.dtype_of(q)
        _common.expect_dtype(FN, "out", out, (want,), "q's dtype (bf16 for an fp8 q)")
        if tuple(out.shape) != p.shape:
            raise Error(f"{FN}: out: expected q's shape {list(p.shape)}, got {list(out.shape)}")


def _window(window_size, causal, seqlen_q):
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise Error(f"{FN}: window_size: expected a pair (left, right) of ints, -1 = "
                    f"unbounded, got {window_size!r}") from None
    if left < -1:
        raise Error(f"{FN}: window_size: expected left >= -1, got {window_size!r}")
    return 0 if left < 0 else left + 1


def _lookahead(window_size, causal, seqlen_q):
    """How far past its own position a query of a multi-token call sees (FlashAttention's
    window_size[1]; -1 = every new key), or None where no key lies past it (causal, right 0, or
    one query)."""
    right = int(window_size[1])
    if causal or seqlen_q == 1 or right == 0:
        return None
    if right < -1:
        raise Error(f"{FN}: window_size: expected right >= -1, got {tuple(window_size)!r}")
    return right


def _lookahead_mask(like, batch, seqlen_q, window_size, causal):
    """deca's tree mask [batch, seqlen_q, ceil(seqlen_q / 32)] uint32 for a query that sees
    keys past its position (module notes), in like's library and device; None when none does."""
    right = _lookahead(window_size, causal, seqlen_q)
    if right is None:
        return None
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_q)[None, :]
    see = np.ones((seqlen_q, seqlen_q), bool) if right < 0 else j <= i + right
    words = (seqlen_q + 31) // 32
    bits = np.zeros((seqlen_q, words * 32), np.uint64)
    bits[:, :seqlen_q] = see
    row = (bits.reshape(seqlen_q, words, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    mask = np.ascontiguousarray(np.broadcast_to(row.astype(np.uint32), (batch, seqlen_q, words)))
    torch = torch_of(like)
    if torch is not None:
        return torch.from_numpy(mask).to(like.device)
    cupy = cupy_of(like)
    if cupy is not None:
        return cupy.asarray(mask)
    return mask


def _host_array(x):
    """x's values as a numpy array when x lives on the host (numpy, a CPU torch tensor), else
    None (reading device memory would synchronise)."""
    if isinstance(x, np.ndarray):
        return x
    if _common.is_torch(x) and x.device.type == "cpu":
        return x.numpy()
    return None


def _widen(q):
    """An fp8 (e4m3) q as bf16: exact, every e4m3 value being a bf16 value."""
    if type(q) is np.ndarray:
        import ml_dtypes
        return q.astype(ml_dtypes.bfloat16)
    return q.to(torch_of(q).bfloat16)


def _transposed(x):
    """[batch, a, b] -> a contiguous [batch, b, a]."""
    t = x.swapaxes(1, 2)
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t)
    return t.contiguous()


def _contiguous_table(q, k_cache, batch):
    """The page table of a contiguous cache [batch, seqlen_cache, ...]: one page per request,
    page b being request b's whole row."""
    if k_cache.shape[0] < batch:
        raise Error(f"{FN}: k_cache: expected at least batch ({batch}) rows without a "
                    f"block_table, got {k_cache.shape[0]}")
    return _arange_column(q, batch)


def _arange_column(like, n):
    """[n, 1] int32 0..n-1 in like's library and device."""
    torch = torch_of(like)
    if torch is not None:
        return torch.arange(n, dtype=torch.int32, device=like.device).view(n, 1)
    cupy = cupy_of(like)
    if cupy is not None:
        return cupy.arange(n, dtype=cupy.int32).reshape(n, 1)
    return np.arange(n, dtype=np.int32).reshape(n, 1)


def _full(like, n, value):
    torch = torch_of(like)
    if torch is not None:
        return torch.full((n,), value, dtype=torch.int32, device=like.device)
    cupy = cupy_of(like)
    if cupy is not None:
        return cupy.full((n,), value, dtype=cupy.int32)
    return np.full((n,), value, dtype=np.int32)


def _traced(q, k_cache, v_cache, table, cache_seqlens, softmax_scale, causal, window_size,
            softcap, return_lse, q_descale, k_descale, v_descale, out):
    """The call as torch.compile traces it: torch operations and the deca custom op, no memo."""
    torch = torch_of(q)
    ops = _common.torch_ops(q)
    batch, seqlen_q, nheads, d = _common.rank(FN, "q", q, 4, "[batch, seqlen_q, nheads, headdim]")
    q_fp8 = q.dtype == torch.float8_e4m3fn
    kv8 = k_cache.dtype in (torch.float8_e4m3fn, torch.int8)
    if q_fp8:
        q = q.to(torch.bfloat16)
    window = _window(window_size, causal, seqlen_q)
    if _lookahead(window_size, causal, seqlen_q) is not None:
        raise Error(f"{FN}: causal: expected True (or window_size[1] == 0) with seqlen_q "
                    f"{seqlen_q} > 1 under torch.compile (deca's custom op takes no tree mask; "
                    f"eager calls run non-causal queries), got causal={causal!r} and "
                    f"window_size={tuple(window_size)!r}")
    if table is None:
        table = torch.arange(batch, dtype=torch.int32, device=q.device).view(batch, 1)
    if cache_seqlens is None:
        cache_seqlens = k_cache.shape[1]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    scales = descale_plan(FN, q, batch, k_cache.shape[2], q_descale if q_fp8 else None,
                          k_descale if kv8 else None, v_descale if kv8 else None,
                          read_host=False)
    # One op per request where the descales differ per request, else one; each writes outputs
    # of its own (a custom op mutates whole tensors), which are then joined.
    rows = [slice(b, b + 1) for b in range(batch)] if scales.per_request else [slice(None)]
    outs, lses = [], []
    for i, s in enumerate(rows):
        k_scale, v_scale, k_scales, v_scales = (scales.request(i) if scales.per_request
                                                 else scales).values()
        qs = q[s]
        o = torch.empty(qs.shape, dtype=q.dtype, device=q.device)
        lse = None
        if return_lse:
            lse = torch.empty(qs.shape[:3], dtype=torch.float32, device=q.device)
        ops.gqa_decode(qs, k_cache, v_cache, table[s], cache_seqlens[s], o, lse, None, k_scales,
                       v_scales, "NHD", 0, "", float(k_scale), float(v_scale),
                       float(softmax_scale or 0.0), float(softcap), int(window), 1.0, "auto", 0)
        outs.append(o)
        lses.append(lse)
    result = outs[0] if len(outs) == 1 else torch.cat(outs)
    if out is not None:
        out.copy_(result)
        result = out
    if not return_lse:
        return result
    lse = lses[0] if len(lses) == 1 else torch.cat(lses)
    return result, lse.transpose(1, 2).contiguous()
