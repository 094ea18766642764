"""MLA decode (DeepSeek): dense (bf16, e4m3 with one scale, or the 656-byte FP8 token, through a
block table) and sparse FP8 (top-k indices) caches, DeepSeek V4's MODEL1 sparse cache (584-byte
tokens, an optional second cache), and the split-KV combine step."""

from __future__ import annotations

import numpy as np

from . import _C, _plan_cache
from ._tensors import (FALLBACKS, Error, allocator, bits_views, call_key, check_dtype_keywords,
                       check_scalars, choice, current_stream, expect_dim_range, expect_rank,
                       maker, numpy_dtype, parse_device, py_key, stream_getter, stream_handle,
                       stream_int, tensor)

_INT32_MAX = 2 ** 31 - 1

DIM_QK = _C.MLA_DIM_QK  # 576 = 512 latent ("NoPE") + 64 RoPE
DIM_V = _C.MLA_DIM_V  # 512
FP8_TOKEN_BYTES = _C.MLA_FP8_TOKEN_BYTES  # 656
MODEL1_DIM_QK = _C.MLA_MODEL1_DIM_QK  # 512 = 448 NoPE + 64 RoPE (V is the whole row)
MODEL1_TOKEN_BYTES = _C.MLA_MODEL1_TOKEN_BYTES  # 584
_BF16 = numpy_dtype("bf16")
# MlaPlan's kv_format: "default" (bf16 dense, the 656-byte token sparse), "bf16", "fp8_e4m3" (576
# e4m3 values a token, real = stored * kv_scale), "fp8_sparse" (the 656-byte token), "model1"
# (DeepSeek V4's 584-byte token, sparse only; see pack_mla_fp8(format="model1")).
KV_FORMATS = ("default", "bf16", "fp8_e4m3", "fp8_sparse", "model1")
# MlaPlan's lse_of_empty_row: what a row without a valid key gets as its LSE.
LSE_OF_EMPTY_ROW = ("-inf", "+inf")


class MlaPlan:
    """A plan for one MLA layer's decode shape (dense or sparse), made once and run per step.

    On a CUDA device allocate `workspace_bytes` bytes once (zeroed) and pass them to every run.
    """

    def __init__(self, num_heads, *, sparse=False, kv_format="default", page_size=64,
                 max_batch=1, max_q_len=1, max_seq_len=0, topk=0, lse=True, attn_sink=False,
                 topk_length=False, extra_topk=0, extra_page_size=64, extra_topk_length=False,
                 checked=None, device="cpu", lse_of_empty_row="-inf"):
        """kv_format (KV_FORMATS): the cache a dense plan reads; sparse plans read the 656-byte
        token ("default" or "fp8_sparse") or MODEL1's 584-byte one ("model1": q and K are 512
        dims, V the whole row). extra_topk (> 0: "model1" only): the second cache's indices per
        query token (run_sparse's extra_kv_cache / extra_indices), extra_page_size its page
        size, extra_topk_length whether runs pass extra_topk_length. max_seq_len (dense, >= 1):
        the longest cache_seqlens entry any run may pass. checked (None:
        deca.checked_by_default()): CUDA plans test every index, length and block id they read
        (see check()) and run their decode kernel's checked build. lse_of_empty_row: the LSE of a row
        without a valid key, "-inf" (deca's convention) or "+inf" (FlashMLA's; compiled into
        the CUDA kernels)."""
        check_scalars("MlaPlan", ints=dict(num_heads=num_heads, page_size=page_size,
                                           max_batch=max_batch, max_q_len=max_q_len,
                                           max_seq_len=max_seq_len, topk=topk,
                                           extra_topk=extra_topk,
                                           extra_page_size=extra_page_size),
                      bools=dict(sparse=sparse, lse=lse, attn_sink=attn_sink,
                                 topk_length=topk_length, extra_topk_length=extra_topk_length,
                                 checked=checked))
        choice("MlaPlan", "kv_format", kv_format, KV_FORMATS)
        choice("MlaPlan", "lse_of_empty_row", lse_of_empty_row, LSE_OF_EMPTY_ROW)
        c = _C.MlaConfig()
        c.num_heads, c.page_size, c.sparse, c.kv_format = num_heads, page_size, sparse, kv_format
        c.max_batch, c.max_q_len, c.max_seq_len, c.topk = max_batch, max_q_len, max_seq_len, topk
        c.lse, c.attn_sink, c.topk_length = lse, attn_sink, topk_length
        c.extra_topk, c.extra_page_size = extra_topk, extra_page_size
        c.extra_topk_length = extra_topk_length
        c.lse_of_empty_row = lse_of_empty_row
        if checked is not None:
            c.checked = checked
        c.device = parse_device(device, "MlaPlan")
        self._plan = _C.plan_mla_decode(c)
        d = self._plan.config.device
        self._cuda_index = d.index if d.kind == _C.DeviceKind.CUDA else -1
        # Whether check() has anything to read: a checked plan (sparse or dense) on a GPU.
        self._check_runs = checked_run(self._plan.config)

    config = property(lambda self: self._plan.config)
    kv_format = property(lambda self: self._plan.config.kv_format)
    workspace_bytes = property(lambda self: self._plan.workspace_bytes)
    num_splits = property(lambda self: self._plan.num_splits)
    sm_count = property(lambda self: self._plan.sm_count)
    kernel_name = property(lambda self: self._plan.kernel_name)
    checked = property(lambda self: self._plan.config.checked)

    def check(self, workspace, *, stream=None):
        """Checked mode: raises deca.Error for the first bad entry the runs on `workspace` met
        since the last check (a sparse index or topk_length entry: "mla_decode_sparse:
        indices[1][0][5]: expected -1 or a token id in [0, 8192) ..."; a dense block_table or
        cache_seqlens entry: "mla_decode_dense: block_table[0][3]: expected a block id in
        [0, 40) ..."), and clears the record. Synchronises `stream` (legacy default stream when
        None): outside CUDA-graph capture, once per step. Nothing happens for an unchecked or
        CPU plan."""
        if not self._check_runs:
            return
        wt = tensor(workspace, "check_mla_run: workspace", writable=True)
        _C.check_mla_run(self._plan, wt, stream_handle(stream, workspace, wt, "check_mla_run"))

    def run_dense(self, q, kv_cache, block_table, cache_seqlens, out, *, lse=None,
                  softmax_scale=None, kv_scale=None, workspace=None, stream=None,
                  reuse_schedule=False):
        """Dense MLA decode into out (and lse when given); returns out.

        kv_cache in the plan's kv_format: [num_blocks, page_size, 1, 576] bf16 or fp8 e4m3
        (ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn, or uint8 bits), or [.., 656] uint8.
        kv_scale (fp8_e4m3 only; None = 1): real = stored * kv_scale. reuse_schedule=True (CUDA)
        runs on the schedule an earlier run of this plan left in `workspace` (the other layers of
        a decode step: same batch, q_len and cache_seqlens contents), as run_sparse.
        """
        fn = "mla_decode_dense"
        if not (_plain_float(softmax_scale) and _plain_float(kv_scale) and
                type(reuse_schedule) is bool):
            check_scalars(fn, floats=dict(softmax_scale=softmax_scale, kv_scale=kv_scale),
                          bools=dict(reuse_schedule=reuse_schedule))
        scale = 1.0 if kv_scale is None else kv_scale
        handle = (current_stream(self._cuda_index, q) if stream is None
                  else stream_int(stream, fn))
        fq, fkv, fo = q, kv_cache, out
        if type(q) is np.ndarray:  # q and out are bf16: their raw bits go through
            fq, fo = bits_views(_BF16, q, out)
        if type(kv_cache) is np.ndarray:  # as the plan's bf16 / e4m3 cache (bytes: as they are)
            (fkv,) = bits_views(kv_cache.dtype, kv_cache)
        try:  # run_sparse's fast path and fallback
            _C.mla_decode_dense_planned_fast(self._plan, fq, fkv, block_table,
                                             cache_seqlens, fo, lse, softmax_scale or 0.0,
                                             scale, workspace, handle, bool(reuse_schedule))
            return out
        except (Error, TypeError):
            FALLBACKS["MlaPlan.run_dense"] += 1
        qt = tensor(q, f"{fn}: q")
        kv_dtype = "fp8_e4m3" if self._plan.config.kv_format == "fp8_e4m3" else None
        _C.mla_decode_dense_planned(
            self._plan, qt, tensor(kv_cache, f"{fn}: kv_cache", kv_dtype),
            tensor(block_table, f"{fn}: block_table", "int32"),
            tensor(cache_seqlens, f"{fn}: cache_seqlens", "int32"),
            tensor(out, f"{fn}: out", writable=True), tensor(lse, f"{fn}: lse", writable=True),
            softmax_scale or 0.0, scale, tensor(workspace, f"{fn}: workspace", writable=True),
            stream_handle(stream, q, qt, fn), reuse_schedule)
        return out

    def run_sparse(self, q, kv_cache, indices, out, *, topk_length=None, attn_sink=None,
                   lse=None, softmax_scale=None, workspace=None, stream=None,
                   reuse_schedule=False, extra_kv_cache=None, extra_indices=None,
                   extra_topk_length=None):
        """Sparse FP8 MLA decode into out (and lse when given); returns out.

        A "model1" plan with extra_topk > 0 also takes the second cache: extra_kv_cache
        [blocks, extra_page_size, 1, 584] uint8, extra_indices [batch, q_len, extra_topk] int32
        (-1 = skip) and, when planned, extra_topk_length [batch] int32; its selected tokens join
        the same softmax as kv_cache's.

        reuse_schedule=True (CUDA) skips the scheduler and runs on the schedule an earlier run
        of this plan left in `workspace`: the other layers of a decode step, whose batch, q_len,
        topk and topk_length contents are the first layer's. A schedule made for another call
        shape computes nothing (out and lse NaN; a checked plan's check() says so).
        """
        fn = "mla_decode_sparse"
        if not (_plain_float(softmax_scale) and type(reuse_schedule) is bool):
            check_scalars(fn, floats=dict(softmax_scale=softmax_scale),
                          bools=dict(reuse_schedule=reuse_schedule))
        # One C++ call with the caller's objects (torch tensors through DLPack's C exchange
        # table or their attributes); whatever it cannot take is retried below, where each
        # argument is imported by name and a wrong one raises the message the user sees. Errors
        # are raised before any launch, so nothing runs twice.
        handle = (current_stream(self._cuda_index, q) if stream is None
                  else stream_int(stream, fn))
        fq, fo = q, out
        if type(q) is np.ndarray:  # as in run_dense
            fq, fo = bits_views(_BF16, q, out)
        try:
            _C.mla_decode_sparse_planned_fast(
                self._plan, fq, kv_cache, indices, topk_length, attn_sink, fo, lse,
                softmax_scale or 0.0, workspace, handle, bool(reuse_schedule), extra_kv_cache,
                extra_indices, extra_topk_length)
            return out
        except (Error, TypeError):
            FALLBACKS["MlaPlan.run_sparse"] += 1
        qt = tensor(q, f"{fn}: q")
        _C.mla_decode_sparse_planned(
            self._plan, qt, tensor(kv_cache, f"{fn}: kv_cache"), tensor(indices, f"{fn}: indices", "int32"),
            tensor(topk_length, f"{fn}: topk_length", "int32"), tensor(attn_sink, f"{fn}: attn_sink"),
            tensor(out, f"{fn}: out", writable=True), tensor(lse, f"{fn}: lse", writable=True),
            softmax_scale or 0.0, tensor(workspace, f"{fn}: workspace", writable=True),
            stream_handle(stream, q, qt, fn), reuse_schedule,
            tensor(extra_kv_cache, f"{fn}: extra_kv_cache"),
            tensor(extra_indices, f"{fn}: extra_indices", "int32"),
            tensor(extra_topk_length, f"{fn}: extra_topk_length", "int32"))
        return out


def _plain_float(value):
    """None or a Python float: what check_scalars passes without a look (the per-call runs test
    this first and call check_scalars, which names a wrong value, only for anything else)."""
    return value is None or type(value) is float


def _outputs(fn, q, qt, out, lse, return_lse):
    check_scalars(fn, bools=dict(return_lse=return_lse))
    expect_rank(fn, "q", qt, 4, "[batch, q_len, num_heads, 576]")
    shape = tuple(qt.shape[:3]) + (DIM_V,)
    if out is None:
        out = allocator(q, f"{fn}: out", qt)(shape, "bf16")
    want_lse = return_lse or lse is not None
    if want_lse and lse is None:
        lse = allocator(q, f"{fn}: lse", qt)(shape[:3], "fp32")
    return out, lse, want_lse


# MlaPlan's keywords, in the order _plan_cache keys plans by.
MLA_KEYS = ("num_heads", "sparse", "kv_format", "page_size", "max_batch", "max_q_len", "max_seq_len", "topk",
            "lse", "attn_sink", "topk_length", "extra_topk", "extra_page_size",
            "extra_topk_length", "checked", "device", "lse_of_empty_row")
# The values of the three extra_* keys for a call without a second cache.
NO_EXTRA = (0, 64, False)
# The one-off calls' prepared shapes: the caller's argument metadata -> _OneOff.
_ONEOFF = _plan_cache.memo()


def checked_run(c):
    """Whether runs of a plan of config c record bad entries for check(): a checked CUDA plan,
    sparse (indices, topk_length) or dense (block_table, cache_seqlens)."""
    return c.checked and c.device.kind == _C.DeviceKind.CUDA


class _OneOff:
    """What the first one-off call of a shape prepared (gqa._OneOff's counterpart): the plan,
    its workspaces (one per stream; the caller's own when passed) and the outputs' shapes and
    dtypes."""

    __slots__ = ("plan", "workspaces", "new_out", "new_lse", "want_lse", "stream", "direct")

    def __init__(self, fn, plan, q, like, shape, want_lse):
        """q: the first call's; like: q when its library (torch, numpy) allocates the outputs,
        None when the caller passes them."""
        self.plan, self.want_lse = plan, want_lse
        self.workspaces = _plan_cache.StreamWorkspaces(plan.workspace_bytes, fn)
        self.new_out = self.new_lse = None
        self.stream = stream_getter(plan._cuda_index, q)
        # Tensors the plans' fast paths take as they come (not numpy's raw-bit views): sparse()
        # makes the C++ call itself, MlaPlan.run_sparse only for what that call refuses.
        self.direct = like is not None and type(like) is not np.ndarray
        if like is not None:
            self.new_out = maker(like, shape, "bf16", f"{fn}: out")
            self.new_lse = maker(like, shape[:3], "fp32", f"{fn}: lse")

    def outputs(self, q, out, lse):
        if out is None:
            out = self.new_out()
        if self.want_lse and lse is None:
            lse = self.new_lse()
        return out, lse

    def workspace(self, q, workspace, stream, fn):
        """(workspace, stream handle) of a run: the caller's workspace, else this shape's for
        the stream (the caller's, else the current one of q's library)."""
        current = self.stream()
        if stream is None:
            stream = current
        elif type(stream) is not int:
            stream = stream_int(stream, fn)
        if workspace is None:
            workspace = self.workspaces.get(stream, q, current)
        return workspace, stream

    def sparse(self, q, kv_cache, indices, out, lse, workspace, stream, topk_length, attn_sink,
               softmax_scale, extra_kv_cache, extra_indices, extra_topk_length):
        """A repeated mla_decode_sparse call: call() of run_sparse, whose fast path (one C++
        call) is made here for torch tensors and a plain scale; run_sparse takes anything that
        call refuses, and its checked path names the argument."""
        o, l = self.outputs(q, out, lse)
        ws, handle = self.workspace(q, workspace, stream, "mla_decode_sparse")
        if self.direct and (softmax_scale is None or type(softmax_scale) is float):
            try:
                _C.mla_decode_sparse_planned_fast(
                    self.plan._plan, q, kv_cache, indices, topk_length, attn_sink, o, l,
                    softmax_scale or 0.0, ws, handle, False, extra_kv_cache, extra_indices,
                    extra_topk_length)
                return self.done(o, l, ws, handle)
            except (Error, TypeError):
                pass
        self.plan.run_sparse(q, kv_cache, indices, o, lse=l, workspace=ws, stream=handle,
                             topk_length=topk_length, attn_sink=attn_sink,
                             softmax_scale=softmax_scale, extra_kv_cache=extra_kv_cache,
                             extra_indices=extra_indices, extra_topk_length=extra_topk_length)
        return self.done(o, l, ws, handle)

    def done(self, out, lse, workspace, stream):
        if self.plan._check_runs:
            self.plan.check(workspace, stream=stream)
        return (out, lse) if self.want_lse else out

    def call(self, run, fn, q, inputs, out, lse, workspace, stream, **scalars):
        """One call: run (the plan's run_dense or run_sparse) on q and inputs into the outputs
        (allocated when not given), on the workspace and stream workspace() picks; returns what
        the API returns."""
        o, l = self.outputs(q, out, lse)
        ws, handle = self.workspace(q, workspace, stream, fn)
        run(q, *inputs, o, lse=l, workspace=ws, stream=handle, **scalars)
        return self.done(o, l, ws, handle)


def _prepare(fn, key, q, qt, out, lse, want_lse, values):
    """The first call of a shape: its plan (cached by its values), the outputs allocated when
    the caller's library is one the prepared call cannot allocate in."""
    plan, _ = _plan_cache.plan(MlaPlan, MLA_KEYS, values, q, qt, fn)
    prepared = _OneOff(fn, plan, q, None if key is None else q, tuple(qt.shape[:3]) + (DIM_V,),
                       want_lse)
    if key is not None:
        _ONEOFF[key] = prepared
    elif out is None or (want_lse and lse is None):
        out, lse, _ = _outputs(fn, q, qt, out, lse, want_lse)
    return prepared, out, lse


def mla_decode_dense(q, kv_cache, block_table, cache_seqlens, out=None, *, softmax_scale=None,
                     kv_scale=None, kv_format=None, return_lse=False, lse=None, max_seq_len=None,
                     workspace=None, checked=None, stream=None):
    """Dense MLA decode; returns out, or (out, lse) when return_lse or lse is given.

    q [batch, q_len, num_heads, 576] bf16; kv_cache [num_blocks, page_size, 1, 576] bf16, or
    fp8 e4m3 with one scale (kv_scale: real = stored * kv_scale; see quantize_mla_fp8_e4m3), or
    [.., 656] uint8 (the sparse cache's token, see pack_mla_fp8); V is the first 512 of each
    token's values. kv_format (KV_FORMATS; None: from kv_cache's dtype, "fp8_e4m3" for uint8
    bits of e4m3 values). block_table [batch, max_blocks] int32; cache_seqlens [batch] int32 (the
    q_len new tokens included, causal among them); on a GPU both stay in device memory.
    max_seq_len (None: max_blocks * page_size) bounds cache_seqlens. out [.., 512] bf16.
    checked (None: deca.checked_by_default()): on a GPU, the kernel tests every block id and
    length it reads and this call raises deca.Error for the first bad one after the run (it then
    synchronises the stream; see MlaPlan.check).
    Plans at the first call of each shape and reuses that plan (and, without `workspace`, its
    workspace) after, as gqa_decode does.
    """
    fn = "mla_decode_dense"
    want_lse = bool(return_lse) or lse is not None
    # What identifies the call's shape (as in gqa_decode).
    tensors = (q, kv_cache, block_table, out, lse)
    values = ("dense", return_lse, max_seq_len, kv_format, checked)
    key = call_key(tensors, values) or py_key(tensors, values)
    if key is not None:
        hit = _ONEOFF.get(key)
        if hit is not None:
            return hit.call(hit.plan.run_dense, fn, q, (kv_cache, block_table, cache_seqlens),
                            out, lse, workspace, stream, softmax_scale=softmax_scale,
                            kv_scale=kv_scale)
    if kv_format is not None:
        choice(fn, "kv_format", kv_format, KV_FORMATS)
    qt = tensor(q, f"{fn}: q")
    kvt = tensor(kv_cache, f"{fn}: kv_cache", "fp8_e4m3" if kv_format == "fp8_e4m3" else None)
    btt = tensor(block_table, f"{fn}: block_table", "int32")
    check_scalars(fn, bools=dict(return_lse=return_lse, checked=checked))
    expect_rank(fn, "q", qt, 4, "[batch, q_len, num_heads, 576]")
    expect_rank(fn, "kv_cache", kvt, 4, "[num_blocks, page_size, 1, 576 | 656]")
    expect_rank(fn, "block_table", btt, 2, "[batch, max_blocks]")
    _expect_plan_sizes(fn, qt, kvt)
    page_size = kvt.shape[1]
    if max_seq_len is None:
        max_seq_len = min(btt.shape[1] * page_size, _INT32_MAX)
    values = (qt.shape[2], False, kv_format or dense_kv_format(kvt), page_size,
              max(qt.shape[0], 1), qt.shape[1], max(max_seq_len, 1), 0, want_lse, False, False) + \
        NO_EXTRA + (checked, _device_text(qt), "-inf")
    prepared, out, lse = _prepare(fn, key, q, qt, out, lse, want_lse, values)
    return prepared.call(prepared.plan.run_dense, fn, q, (kv_cache, block_table, cache_seqlens),
                         out, lse, workspace, stream, softmax_scale=softmax_scale,
                         kv_scale=kv_scale)


def dense_kv_format(kvt):
    """The kv_format a dense cache's dtype names (an imported deca._C.Tensor): bf16, fp8_e4m3,
    or the 656-byte token for uint8; "default" otherwise (the plan then names what it expects)."""
    dtype = str(kvt.dtype)
    if dtype in ("bf16", "fp8_e4m3"):
        return dtype
    if dtype == "uint8" and len(kvt.shape) == 4 and kvt.shape[3] == FP8_TOKEN_BYTES:
        return "fp8_sparse"
    return "default"


def mla_decode_sparse(q, kv_cache, indices, out=None, *, topk_length=None, attn_sink=None,
                      softmax_scale=None, return_lse=False, lse=None, workspace=None,
                      checked=None, stream=None, kv_format=None, extra_kv_cache=None,
                      extra_indices=None, extra_topk_length=None):
    """Sparse FP8 MLA decode; returns out, or (out, lse) when return_lse or lse is given.

    q [batch, q_len, num_heads, 576] bf16; kv_cache [num_blocks, page_size, 1, 656] uint8 (see
    pack_mla_fp8); indices [batch, q_len, topk] int32 global token ids (block * page_size +
    slot), -1 = skip; topk_length [batch] int32 (only the first topk_length[b] count);
    attn_sink [num_heads] fp32 (joins the denominator; lse excludes it).
    kv_format "model1" (None: from kv_cache's last dim, 584 for MODEL1): DeepSeek V4's cache, q
    [.., 512] and kv_cache [num_blocks, page_size, 1, 584] (pack_mla_fp8(format="model1")), V the
    whole 512-dim row, softmax_scale default 1 / sqrt(512); optionally a second cache in that
    format: extra_kv_cache with extra_indices [batch, q_len, extra_topk] (ids into it, -1 = skip)
    and extra_topk_length [batch] int32, whose selected tokens join the same softmax.
    checked (None: deca.checked_by_default()): on a GPU, the kernel tests every index and
    topk_length entry it reads and this call raises deca.Error for the first bad one after the
    run (it then synchronises the stream; see MlaPlan.check).
    Plans at the first call of each shape and reuses that plan (and, without `workspace`, its
    workspace) after, as gqa_decode does.
    """
    fn = "mla_decode_sparse"
    want_lse = bool(return_lse) or lse is not None
    extra = (extra_kv_cache, extra_indices, extra_topk_length)
    # What identifies the call's shape (as in gqa_decode).
    tensors = (q, kv_cache, indices, out, lse, topk_length, attn_sink, extra_kv_cache,
               extra_indices, extra_topk_length)
    values = ("sparse", return_lse, checked, kv_format)
    key = call_key(tensors, values) or py_key(tensors, values)
    if key is not None:
        hit = _ONEOFF.get(key)
        if hit is not None:
            return hit.sparse(q, kv_cache, indices, out, lse, workspace, stream, topk_length,
                              attn_sink, softmax_scale, extra_kv_cache, extra_indices,
                              extra_topk_length)
    if kv_format is not None:
        choice(fn, "kv_format", kv_format, ("default", "fp8_sparse", "model1"))
    qt = tensor(q, f"{fn}: q")
    kvt = tensor(kv_cache, f"{fn}: kv_cache")
    it = tensor(indices, f"{fn}: indices", "int32")
    check_scalars(fn, bools=dict(return_lse=return_lse, checked=checked))
    expect_rank(fn, "q", qt, 4, "[batch, q_len, num_heads, 576 | 512]")
    expect_rank(fn, "kv_cache", kvt, 4, "[num_blocks, page_size, 1, 656 | 584]")
    expect_rank(fn, "indices", it, 3, "[batch, q_len, topk]")
    _expect_plan_sizes(fn, qt, kvt)
    expect_dim_range(fn, "indices", it, 2, "topk", 1, _INT32_MAX)
    values = (qt.shape[2], True, kv_format or sparse_kv_format(kvt), kvt.shape[1],
              max(qt.shape[0], 1), qt.shape[1], min(kvt.shape[0] * kvt.shape[1], _INT32_MAX),
              it.shape[2], want_lse, attn_sink is not None, topk_length is not None) + \
        extra_config(fn, *extra) + (checked, _device_text(qt), "-inf")
    prepared, out, lse = _prepare(fn, key, q, qt, out, lse, want_lse, values)
    return prepared.call(prepared.plan.run_sparse, fn, q, (kv_cache, indices), out, lse,
                         workspace, stream, topk_length=topk_length, attn_sink=attn_sink,
                         softmax_scale=softmax_scale, extra_kv_cache=extra_kv_cache,
                         extra_indices=extra_indices, extra_topk_length=extra_topk_length)


def sparse_kv_format(kvt):
    """The kv_format a sparse cache's shape names (an imported deca._C.Tensor): "model1" for a
    584-byte token, "default" (the 656-byte token) otherwise (the plan names what it expects)."""
    if len(kvt.shape) == 4 and kvt.shape[3] == MODEL1_TOKEN_BYTES:
        return "model1"
    return "default"


def extra_config(fn, extra_kv_cache, extra_indices, extra_topk_length):
    """(extra_topk, extra_page_size, extra_topk_length) of a sparse call's plan, from the second
    cache's arguments (NO_EXTRA without them). The cache and its indices come together."""
    if extra_kv_cache is None and extra_indices is None:
        if extra_topk_length is not None:
            raise Error(f"{fn}: extra_topk_length: expected None without extra_kv_cache and "
                        f"extra_indices (the second cache), got a tensor")
        return NO_EXTRA
    if extra_kv_cache is None or extra_indices is None:
        given, missing = (("extra_kv_cache", "extra_indices") if extra_indices is None
                          else ("extra_indices", "extra_kv_cache"))
        raise Error(f"{fn}: {missing}: expected a tensor with {given} (the second cache and its "
                    f"indices come together), got None")
    ekv = tensor(extra_kv_cache, f"{fn}: extra_kv_cache")
    eit = tensor(extra_indices, f"{fn}: extra_indices", "int32")
    expect_rank(fn, "extra_kv_cache", ekv, 4, "[num_blocks, extra_page_size, 1, 584]")
    expect_rank(fn, "extra_indices", eit, 3, "[batch, q_len, extra_topk]")
    expect_dim_range(fn, "extra_kv_cache", ekv, 1, "page_size", 1, _INT32_MAX)
    expect_dim_range(fn, "extra_indices", eit, 2, "extra_topk", 1, _INT32_MAX)
    return (eit.shape[2], ekv.shape[1], extra_topk_length is not None)


def combine(partial_out, partial_lse, out=None, *, attn_sink=None, return_lse=False, lse=None,
            out_dtype=None, stream=None):
    """Merges split-KV partial results by their LSE; returns out, or (out, lse).

    partial_out [num_splits, batch, q_len, num_heads, dim_v] fp32; partial_lse [num_splits,
    batch, q_len, num_heads] fp32; attn_sink [num_heads] fp32 (denominator only). A split with
    lse -inf contributes nothing; a row whose splits are all -inf gives zeros and lse -inf.
    """
    fn = "combine"
    (out_dtype,) = check_dtype_keywords(fn, out_dtype=out_dtype)
    check_scalars(fn, bools=dict(return_lse=return_lse))
    pot = tensor(partial_out, f"{fn}: partial_out")
    expect_rank(fn, "partial_out", pot, 5, "[num_splits, batch, q_len, num_heads, dim_v]")
    shape = tuple(pot.shape[1:])
    if out is None:
        out = allocator(partial_out, f"{fn}: out", pot)(shape, out_dtype or "fp32")
    want_lse = return_lse or lse is not None
    if want_lse and lse is None:
        lse = allocator(partial_out, f"{fn}: lse", pot)(shape[:3], "fp32")
    _C.combine(pot, tensor(partial_lse, f"{fn}: partial_lse"),
               tensor(attn_sink, f"{fn}: attn_sink"),
               tensor(out, f"{fn}: out", out_dtype, writable=True),
               tensor(lse, f"{fn}: lse", writable=True),
               stream_handle(stream, partial_out, pot, fn))
    return (out, lse) if want_lse else out


def _expect_plan_sizes(fn, qt, kvt):
    """The sizes the one-shot plan takes from q and kv_cache, checked on those tensors."""
    expect_dim_range(fn, "q", qt, 1, "q_len", 1, _INT32_MAX)
    expect_dim_range(fn, "q", qt, 2, "num_heads", 1, _INT32_MAX)
    expect_dim_range(fn, "kv_cache", kvt, 1, "page_size", 1, _INT32_MAX)


def _device_text(t):
    d = t.device
    return "cpu" if d.kind == _C.DeviceKind.CPU else f"cuda:{d.index}"
