"""FlashMLA's get_mla_metadata / flash_mla_with_kvcache on deca's MLA decode.

The sparse FP8 call (indices given, is_fp8_kvcache=True) runs deca.mla_decode_sparse; the
dense call (no indices: a bf16 cache, or the 656-byte FP8 cache with is_fp8_kvcache=True) runs
deca.mla_decode_dense. Shapes are FlashMLA's: q [batch, s_q, h_q, 576], k_cache [num_blocks,
page_block_size, 1, 656] (FP8, bytes) or [.., 576] (bf16), any page_block_size; or, as FlashMLA
tells them apart by q's head dim, DeepSeek V4's MODEL1 sparse call: q [.., 512], k_cache
[num_blocks, page_block_size, 1, 584] (the 584-byte token over padded pages, as FlashMLA's tests
pack it; deca.pack_mla_fp8(format="model1") packs the same bytes), with the optional second cache
extra_k_cache / extra_indices_in_kvcache / extra_topk_length (deca's extra_kv_cache,
extra_indices, extra_topk_length: one softmax over both selections); out [batch, s_q,
h_q, 512], softmax_lse [batch, h_q, s_q] fp32: the natural log of each row's sum over its valid
keys (an attention sink is left out of it, as deca's), and, FlashMLA's convention, +inf for a
row without a valid key, sparse and dense alike (deca's -inf mapped; its out is zeros, as
deca's). get_mla_metadata returns (metadata, None) as FlashMLA's current interface does: the
metadata object is scheduled by the first call made with it (on CUDA, sparse or dense) and that
schedule serves the later calls of the step, as FlashMLA's lazily initialised metadata does;
the num_splits slot stays None.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _cached_ops, _plan_cache
from .._tensors import (FALLBACKS, Error, allocator, bits_views, call_key, maker,
                        numpy_dtype, py_key, stream_getter, torch_of)
from . import _common

FN = "flash_mla_with_kvcache"
DIM_QK = 576
DIM_V = 512
FP8_TOKEN_BYTES = 656
MAX_HEADS = 128  # deca's MLA kernels take 1..128 heads
MODEL1_DIM_QK = 512
MODEL1_TOKEN_BYTES = 584
# FlashMLA's LSE of a row without a valid key (its tests' reference): the plans ask deca's
# kernels to write it (MlaPlan's lse_of_empty_row), so no kernel maps -inf afterwards.
EMPTY_ROW_LSE = "+inf"
# deca's argument names -> FlashMLA's, for messages deca raises past the checks here.
_NAMES = {"q": "q", "kv_cache": "k_cache", "indices": "indices", "topk_length": "topk_length",
          "attn_sink": "attn_sink", "block_table": "block_table",
          "cache_seqlens": "cache_seqlens", "softmax_scale": "softmax_scale",
          "extra_kv_cache": "extra_k_cache", "extra_indices": "extra_indices_in_kvcache",
          "extra_topk_length": "extra_topk_length"}
_PREPARED = _plan_cache.memo()
_NUMPY_BF16 = numpy_dtype("bf16")


class MlaMetadata:
    """What get_mla_metadata promises about the calls it serves (heads, FP8, topk), checked
    against each call, and, as FlashMLA's metadata, the decode step's schedule: the first CUDA
    call made with it schedules into a workspace the object owns, the later calls (the other
    layers of the step: same batch, s_q, topk and topk_length or cache_seqlens contents) reuse
    it. Make one per decode step, as FlashMLA asks. (Traced by torch.compile, each call is one deca op that
    schedules for itself: engines call attention from an opaque op anyway.)"""

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

    Sparse (indices [batch, s_q, topk] int32 token ids block * page_block_size + slot, -1 =
    skip; is_fp8_kvcache=True; block_table and cache_seqlens unused): optional topk_length
    [batch] int32 and attn_sink [h_q] fp32; MODEL1 (q [.., 512], k_cache [.., 584]) also the
    second cache: extra_k_cache [blocks, extra_page_block_size, 1, 584] with
    extra_indices_in_kvcache [batch, s_q, extra_topk] (ids into it, -1 = skip) and optional
    extra_topk_length [batch] int32. Dense (indices None): the bf16 cache, or with
    is_fp8_kvcache=True the 656-byte FP8 cache read densely, through block_table [batch,
    max_blocks] and cache_seqlens [batch] (the s_q new tokens included; with causal, causal
    among them, else every query sees every key); a row without keys gets out 0 and LSE +inf,
    as FlashMLA's.
    """
    meta = tile_scheduler_metadata
    extra = (extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
    if head_dim_v != DIM_V or (meta is not None and type(meta) is not MlaMetadata):
        _refuse(head_dim_v, meta)
    if indices is None:
        _common.refuse(FN, extra_k_cache=extra_k_cache,
                       extra_indices_in_kvcache=extra_indices_in_kvcache,
                       extra_topk_length=extra_topk_length)
        return _dense(q, k_cache, block_table, cache_seqlens, meta, softmax_scale, causal,
                      is_fp8_kvcache, topk_length, attn_sink)
    if _common.compiling(q):
        return _sparse_traced(q, k_cache, indices, meta, softmax_scale, causal, is_fp8_kvcache,
                              topk_length, attn_sink, extra)
    # What identifies the call's shape, as in flash_attn_with_kvcache.
    tensors = (q, k_cache, indices, topk_length, attn_sink, extra_k_cache,
               extra_indices_in_kvcache, extra_topk_length)
    values = (softmax_scale, is_fp8_kvcache, causal)
    key = call_key(tensors, values) or py_key(tensors, values)
    if key is not None:
        prepared = _PREPARED.get(key)
        if prepared is not None and (meta is None or prepared.fits(meta)):
            try:
                return prepared.run(q, k_cache, indices, topk_length, attn_sink, extra, meta,
                                    False)
            except (Error, TypeError):
                FALLBACKS[FN] += 1  # the checked run below names what the fast one refused
    prepared = _Sparse(q, k_cache, indices, topk_length, attn_sink, extra, meta, softmax_scale,
                       causal, is_fp8_kvcache)
    if key is not None:
        _PREPARED[key] = prepared
    return prepared.run(q, k_cache, indices, topk_length, attn_sink, extra, meta, True)


def _refuse(head_dim_v, meta):
    if head_dim_v != DIM_V:
        raise Error(f"{FN}: head_dim_v: expected {DIM_V}, got {head_dim_v!r}")
    raise Error(f"{FN}: tile_scheduler_metadata: expected what deca.compat.get_mla_metadata "
                f"returned, got {type(meta).__name__}")


class _Sparse:
    """One sparse call shape, checked and planned at its first call."""

    def __init__(self, q, k_cache, indices, topk_length, attn_sink, extra, meta, softmax_scale,
                 causal, is_fp8_kvcache):
        _common.torch_ops(q)  # a shape's first eager call registers the ops for later traces
        batch, s_q, h_q, _ = _check_sparse_call(q, meta, causal, is_fp8_kvcache, k_cache, extra)
        shape = _common.rank(FN, "indices", indices, 3, "[batch, s_q, topk]")
        if shape[:2] != (batch, s_q):
            raise Error(f"{FN}: indices: expected [batch, s_q, topk] with q's batch and s_q "
                        f"({batch}, {s_q}), got {list(shape)}")
        if meta is not None and meta.topk is not None and shape[2] != meta.topk:
            raise Error(f"{FN}: indices: expected topk {meta.topk} (get_mla_metadata's topk), "
                        f"got {shape[2]}")
        _common.expect_dtype(FN, "indices", indices, ("int32",))
        self.shape = (batch, s_q, h_q)
        self.heads, self.topk = h_q, shape[2]
        self.scale = float(softmax_scale or 0.0)
        self.numpy = type(q) is np.ndarray
        self.new_out = maker(q, (batch, s_q, h_q, DIM_V), "bf16", f"{FN}: out")
        # One query token: FlashMLA's [batch, h_q, 1] itself, which deca writes as its [batch,
        # 1, h_q] (the fast call is told the layout, the checked run gets a transposed view);
        # else deca's rows of heads, transposed per call.
        self.one_token = s_q == 1
        self.new_lse = maker(q, (batch, h_q, 1) if s_q == 1 else (batch, s_q, h_q), "fp32",
                             f"{FN}: softmax_lse")
        self.cache_is_bytes = _common.dtype_of(k_cache) == "uint8"
        self.extra_is_bytes = extra[0] is None or _common.dtype_of(extra[0]) == "uint8"
        self.plan, self.ws = _cached_ops.mla_sparse_plan(
            q, _bytes(k_cache), indices, fn=FN, lse=True, attn_sink=attn_sink is not None,
            topk_length=topk_length is not None, extra=_deca_extra(extra),
            lse_of_empty_row=EMPTY_ROW_LSE)
        self.stream = stream_getter(self.plan._cuda_index, q)
        self._c_plan = self.plan._plan

    def fits(self, meta):
        return ((meta.num_heads_q is None or meta.num_heads_q == self.heads) and
                (meta.topk is None or meta.topk == self.topk))

    def run(self, q, k_cache, indices, topk_length, attn_sink, extra, meta, checked):
        """The decode of one call of this shape into new outputs, on the step's schedule when
        meta is given. checked=False (a repeated call): one C++ call, which raises before any
        launch what the checked run would name (the caller then retries checked); checked=True:
        each argument checked in FlashMLA's names first, deca's messages translated into them."""
        out = self.new_out()
        lse = self.new_lse()
        cache = k_cache if self.cache_is_bytes else _bytes(k_cache)
        ekv, eidx, elen = extra if self.extra_is_bytes else _deca_extra(extra)
        ws, reuse, schedule = self.ws, False, None
        if meta is not None and ws is not None:  # no workspace: the CPU, no schedule
            schedule = meta._schedule
            ws, reuse = schedule.workspace_for(self.plan, q, None, FN)
        if checked:
            self._run_checked(q, cache, indices, topk_length, attn_sink, out, lse, ws, reuse,
                              ekv, eidx, elen)
        else:
            o = out
            if self.numpy:  # numpy's DLPack has no bf16: its raw bits, as the plan declares q
                q, o = bits_views(_NUMPY_BF16, q, out)
            _C.mla_decode_sparse_planned_fast(self._c_plan, q, cache, indices, topk_length,
                                              attn_sink, o, lse, self.scale, ws, self.stream(),
                                              reuse, ekv, eidx, elen, self.one_token)
        if schedule is not None and not reuse:
            # This run scheduled: the step's later calls of this plan reuse it without a look
            # at their lengths (FlashMLA's metadata is the step's: its layers share batch, s_q,
            # topk and the lengths, which live in device memory). A reused run leaves the
            # holder as it found it: workspace_for answered reuse only because this plan's
            # schedule was marked already, so marking it again would change nothing. A run that
            # raised (before any launch) never gets here: the holder stays unmarked and the
            # next call schedules.
            schedule.scheduled(self.plan)
        return out, lse if self.one_token else _swap(lse)

    def _run_checked(self, q, cache, indices, topk_length, attn_sink, out, lse, ws, reuse, ekv,
                     eidx, elen):
        _check_sparse_run(self, q, cache, indices, topk_length, attn_sink)
        _check_extra_run(self, eidx, elen)
        try:
            self.plan.run_sparse(q, cache, indices, out, topk_length=topk_length,
                                 attn_sink=attn_sink,
                                 lse=lse.swapaxes(1, 2) if self.one_token else lse,
                                 softmax_scale=self.scale or None, workspace=ws,
                                 reuse_schedule=reuse, extra_kv_cache=ekv, extra_indices=eidx,
                                 extra_topk_length=elen)
        except Error as e:
            raise _common.translate(e, FN, "mla_decode_sparse", _NAMES) from None


def _check_q(q, meta, sparse=False):
    """(batch, s_q, h_q); q's head dim 576, or for a sparse call also MODEL1's 512."""
    batch, s_q, h_q, d = _common.rank(FN, "q", q, 4, "[batch, s_q, h_q, 576]")
    _common.expect_dtype(FN, "q", q, ("bf16",))
    if d != DIM_QK and not (sparse and d == MODEL1_DIM_QK):
        want = (f"{DIM_QK} (V3.2: 512 NoPE + 64 RoPE) or {MODEL1_DIM_QK} (MODEL1: 448 NoPE + 64 "
                f"RoPE)" if sparse else f"{DIM_QK} (512 NoPE + 64 RoPE)")
        raise Error(f"{FN}: q: dim 3 (head_dim): expected {want}, got {d}")
    if meta is not None and meta.num_heads_q is not None and meta.num_heads_q != h_q:
        raise Error(f"{FN}: q: expected {meta.num_heads_q} heads (get_mla_metadata's "
                    f"num_heads_q), got {h_q}")
    return batch, s_q, h_q


def _check_sparse_cache(k_cache, model1=False, name="k_cache"):
    """The 656-byte FP8 cache (sparse, or dense under is_fp8_kvcache), or MODEL1's 584-byte
    one."""
    row = MODEL1_TOKEN_BYTES if model1 else FP8_TOKEN_BYTES
    dims = f"[num_blocks, page_block_size, 1, {row}]"
    shape = _common.rank(FN, name, k_cache, 4, dims)
    dtype = _common.dtype_of(k_cache)
    if model1:
        packing = ("MODEL1 (q's head dim 512) reads 584-byte tokens (448 e4m3, 64 bf16 RoPE "
                   "values, 7 ue8m0 scales and a pad byte, laid out per page): pack a bf16 "
                   "[.., 512] cache with deca.pack_mla_fp8(format=\"model1\")")
    else:
        packing = ("the sparse cache holds 656-byte FP8 tokens (512 e4m3, 4 fp32 scales, 64 "
                   "bf16 RoPE values): pack a bf16 [.., 576] cache with deca.pack_mla_fp8")
    if dtype not in ("uint8", "fp8_e4m3"):
        raise Error(f"{FN}: {name}: expected {_common.spell(k_cache, 'uint8')} or "
                    f"{_common.spell(k_cache, 'fp8_e4m3')} {dims}, got "
                    f"{_common.spell(k_cache, dtype)} {list(shape)} ({packing})")
    if shape[2] != 1 or shape[3] != row:
        raise Error(f"{FN}: {name}: expected {dims}, got {list(shape)} ({packing})")


def _check_sparse_call(q, meta, causal, is_fp8_kvcache, k_cache, extra):
    """(batch, s_q, h_q, model1) of a sparse call: q, the flags, the cache in the format q's
    head dim names, and the second cache (MODEL1 only; its cache and indices together)."""
    batch, s_q, h_q = _check_q(q, meta, sparse=True)
    model1 = tuple(q.shape)[3] == MODEL1_DIM_QK
    if not is_fp8_kvcache:
        raise Error(f"{FN}: is_fp8_kvcache: expected True with indices (deca's sparse "
                    f"decode reads FP8 caches), got False")
    if causal:
        raise Error(f"{FN}: causal: expected False with indices (the indices choose the "
                    f"keys), got True")
    _check_sparse_cache(k_cache, model1)
    extra_k_cache, extra_indices, extra_topk_length = extra
    if not model1:
        for name, value in (("extra_k_cache", extra_k_cache),
                            ("extra_indices_in_kvcache", extra_indices),
                            ("extra_topk_length", extra_topk_length)):
            if value is not None:
                raise Error(f"{FN}: {name}: expected None with a V3.2 call (q's head dim 576: "
                            f"deca reads a second cache for MODEL1's, head dim 512, only), got "
                            f"{_common.describe(value)}")
    elif extra_k_cache is not None or extra_indices is not None or extra_topk_length is not None:
        if extra_k_cache is None or extra_indices is None:
            given, missing = (("extra_k_cache", "extra_indices_in_kvcache")
                              if extra_indices is None else
                              ("extra_indices_in_kvcache", "extra_k_cache"))
            raise Error(f"{FN}: {missing}: expected a tensor with {given} (the second cache "
                        f"and its indices come together), got None")
        _check_sparse_cache(extra_k_cache, True, "extra_k_cache")
        shape = _common.rank(FN, "extra_indices_in_kvcache", extra_indices, 3,
                             "[batch, s_q, extra_topk]")
        if shape[:2] != (batch, s_q):
            raise Error(f"{FN}: extra_indices_in_kvcache: expected [batch, s_q, extra_topk] "
                        f"with q's batch and s_q ({batch}, {s_q}), got {list(shape)}")
        _common.expect_dtype(FN, "extra_indices_in_kvcache", extra_indices, ("int32",))
    return batch, s_q, h_q, model1


def _deca_extra(extra):
    """FlashMLA's (extra_k_cache, extra_indices_in_kvcache, extra_topk_length) as deca reads
    them: the cache's bytes."""
    cache, indices, length = extra
    return (None if cache is None else _bytes(cache)), indices, length


def _check_extra_run(p, extra_indices, extra_topk_length):
    """extra_topk_length of a prepared call, as _check_sparse_run checks topk_length."""
    if extra_topk_length is None:
        return
    batch = p.shape[0]
    shape = _common.rank(FN, "extra_topk_length", extra_topk_length, 1, "[batch]")
    _common.expect_dtype(FN, "extra_topk_length", extra_topk_length, ("int32",))
    if shape[0] != batch:
        raise Error(f"{FN}: extra_topk_length: expected [batch] = [{batch}], got {list(shape)}")


def _check_sparse_run(p, q, cache, indices, topk_length, attn_sink):
    """What a call of a prepared sparse shape may still get wrong, in the caller's names."""
    _common.expect_dtype(FN, "indices", indices, ("int32",))
    batch, _, h_q = p.shape
    if topk_length is not None:
        shape = _common.rank(FN, "topk_length", topk_length, 1, "[batch]")
        _common.expect_dtype(FN, "topk_length", topk_length, ("int32",))
        if shape[0] != batch:
            raise Error(f"{FN}: topk_length: expected [batch] = [{batch}], got {list(shape)}")
    if attn_sink is not None:
        shape = _common.rank(FN, "attn_sink", attn_sink, 1, "[h_q]")
        _common.expect_dtype(FN, "attn_sink", attn_sink, ("fp32",))
        if shape[0] != h_q:
            raise Error(f"{FN}: attn_sink: expected [h_q] = [{h_q}], got {list(shape)}")


def _dense(q, k_cache, block_table, cache_seqlens, meta, softmax_scale, causal, is_fp8_kvcache,
           topk_length, attn_sink):
    batch, s_q, h_q = _check_q(q, meta)
    _common.refuse(FN, topk_length=topk_length, attn_sink=attn_sink)
    if block_table is None or cache_seqlens is None:
        raise Error(f"{FN}: block_table: expected block_table and cache_seqlens for the "
                    f"dense cache, got None")
    # The bf16 cache, as FlashMLA's dense kernel reads it; with is_fp8_kvcache the sparse path's
    # 656-byte cache read densely (every token through block_table: what a V3.2 engine runs for
    # short contexts; FlashMLA's dense kernel reads bf16 only).
    if is_fp8_kvcache:
        _check_sparse_cache(k_cache)
        cache, kv_format = _bytes(k_cache), "fp8_sparse"
    else:
        _common.rank(FN, "k_cache", k_cache, 4, "[num_blocks, page_block_size, 1, 576]")
        _common.expect_dtype(FN, "k_cache", k_cache, ("bf16",))
        cache, kv_format = k_cache, "bf16"
    _common.rank(FN, "block_table", block_table, 2, "[batch, max_blocks]")
    _common.expect_dtype(FN, "block_table", block_table, ("int32",))
    _common.expect_dtype(FN, "cache_seqlens", cache_seqlens, ("int32",))
    new = allocator(q, f"{FN}: out")
    out, lse = new((batch, s_q, h_q, DIM_V), "bf16"), new((batch, s_q, h_q), "fp32")
    scale = float(softmax_scale or 0.0)
    schedule = meta._schedule if meta is not None else None
    if s_q == 1 or causal:
        _dense_call(q, cache, block_table, cache_seqlens, out, lse, scale, kv_format, schedule)
    elif s_q * h_q <= MAX_HEADS and _heads_fold(q):
        # Non-causal: every query token sees every key, so the s_q tokens are s_q * h_q heads
        # of one token (MLA's one latent head serves them all alike).
        fold = (batch, 1, s_q * h_q)
        _dense_call(q.reshape(fold + (DIM_QK,)), cache, block_table, cache_seqlens,
                    out.reshape(fold + (DIM_V,)), lse.reshape(fold), scale, kv_format, None)
    else:  # one token at a time, each a one-token call that sees every key
        for i in range(s_q):
            _dense_call(q[:, i:i + 1], cache, block_table, cache_seqlens, out[:, i:i + 1],
                        lse[:, i:i + 1], scale, kv_format, None)
    return out, _swap(lse)


def _heads_fold(q):
    """Whether q's [s_q, h_q] rows are one run of rows (q.reshape is then a view)."""
    if callable(getattr(q, "stride", None)):  # torch: strides in elements
        strides, unit = tuple(q.stride()), 1
    else:  # numpy, cupy: in bytes
        strides, unit = q.strides, q.itemsize
    return strides[1] == q.shape[2] * strides[2] and strides[3] == unit


def _dense_call(q, cache, block_table, cache_seqlens, out, lse, scale, kv_format, schedule):
    """One dense decode (causal among q's tokens) through the torch op or deca's own call."""
    ops = _common.torch_ops(q)
    if ops is not None:
        ops.mla_decode_dense(q, cache, block_table, cache_seqlens, out, lse, scale, 1.0,
                             kv_format, EMPTY_ROW_LSE)
        return
    try:
        # FlashMLA's metadata: the first call of a step schedules, the later layers reuse.
        _cached_ops.mla_dense(q, cache, block_table, cache_seqlens, out, lse, fn=FN,
                              softmax_scale=scale, kv_format=kv_format, schedule=schedule,
                              lse_of_empty_row=EMPTY_ROW_LSE)
    except Error as e:
        raise _common.translate(e, FN, "mla_decode_dense", _NAMES) from None


def _sparse_traced(q, k_cache, indices, meta, softmax_scale, causal, is_fp8_kvcache,
                   topk_length, attn_sink, extra):
    """The sparse call as torch.compile traces it: one deca op, which schedules for itself."""
    batch, s_q, h_q, _ = _check_sparse_call(q, meta, causal, is_fp8_kvcache, k_cache, extra)
    new = allocator(q, f"{FN}: out")
    out, lse = new((batch, s_q, h_q, DIM_V), "bf16"), new((batch, s_q, h_q), "fp32")
    ekv, eidx, elen = _deca_extra(extra)
    _common.torch_ops(q).mla_decode_sparse(q, _bytes(k_cache), indices, out, lse, topk_length,
                                           attn_sink, float(softmax_scale or 0.0), ekv, eidx,
                                           elen, EMPTY_ROW_LSE)
    return out, _swap(lse)


def _bytes(cache):
    """FlashMLA keeps the FP8 cache as float8_e4m3fn or uint8; deca reads its bytes."""
    torch = torch_of(cache)
    if torch is not None:
        return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    dtype = getattr(cache, "dtype", None)
    if dtype is not None and getattr(dtype, "itemsize", 0) == 1 and str(dtype) != "uint8":
        return cache.view("uint8")
    return cache


def _swap(lse):
    """[batch, s_q, h] -> FlashMLA's [batch, h, s_q], contiguous. With s_q 1 both are the same
    memory: one reshape (a view), no transposed view and copy per call."""
    batch, s_q, h = lse.shape
    if s_q == 1:
        return lse.reshape(batch, h, 1)
    t = lse.swapaxes(1, 2)
    if hasattr(t, "contiguous"):
        return t.contiguous().view(-1).view(t.shape)
    return t.copy()
