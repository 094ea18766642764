"""FlashInfer's BatchDecodeWithPagedKVCacheWrapper on deca's paged GQA decode.

FlashInfer names each request's pages in CSR form (indptr [batch + 1], indices [nnz],
last_page_len [batch]); deca reads a page table [batch, max_pages] and seq_lens [batch]. plan()
converts once, on the host, into two device buffers that run() only reads, so run() is
CUDA-graph safe; the kernel never sees the CSR form. The conversion is a few vectorised numpy
operations plus two host-to-device copies. Measured on the 2-core development VM (host buffers):
csr_to_page_table 22 us for batch 64 x 1..32 pages, 34 us for 256 x 1..64, 0.37 ms for
1024 x 1..256 (133k pages); the whole plan() 38 us, 99 us, 0.58 ms. On a GPU the two copies
add a synchronous host-to-device transfer (the page table is 4 bytes a page slot).
FlashInfer's own plan() also works on the host. Buffers are reused across plan() calls (copied into) while the batch size stays and
the pages per request fit; with use_cuda_graph=True they never move, and a plan that would not
fit raises instead (pass max_seq_len= to size them).

FlashInfer's window_left w shows keys p - w .. p (deca's window w + 1); logits_soft_cap is
deca's softcap; FlashInfer's LSE is base 2 (its kernels fold log2(e) into the scale), deca's
natural: run() rescales it by log2(e) in place.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _C, _cached_ops
from .._tensors import (FALLBACKS, Error, allocator, call_key, cupy_of, maker, py_key,
                        stream_getter, tensor, torch_of)
from . import _common

# deca's argument names -> the wrapper's, for messages deca raises past the checks here.
_NAMES = {"q": "q", "k_cache": "paged_kv_cache", "v_cache": "paged_kv_cache",
          "page_table": "indptr", "seq_lens": "last_page_len", "lse": "lse", "out": "out",
          "sinks": "sinks", "k_scale": "k_scale", "v_scale": "v_scale",
          "softmax_scale": "q_scale"}


class BatchDecodeWithPagedKVCacheWrapper:
    """plan() once per batch composition, run() per layer.

    float_workspace_buffer: FlashInfer's scratch buffer; deca keeps its own zeroed workspace
    per plan (its split counters must persist between calls and FlashInfer's buffer is shared
    and never zeroed), and uses this buffer only to learn the tensor library and device of the
    page-table buffers. use_tensor_cores, backend, jit_args and the paged_kv_*_buffer
    arguments are FlashInfer's tuning and graph plumbing, which deca does itself (accepted,
    unused). max_seq_len (deca's): the longest request, for sizing graph-safe buffers.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, *, max_seq_len=None):
        fn = "BatchDecodeWithPagedKVCacheWrapper"
        if kv_layout not in ("NHD", "HND"):
            raise Error(f"{fn}: kv_layout: expected \"NHD\" or \"HND\", got {kv_layout!r}")
        self._like = float_workspace_buffer
        self._like_t = tensor(float_workspace_buffer, f"{fn}: float_workspace_buffer")
        self._layout = kv_layout
        self._graph = bool(use_cuda_graph)
        self._max_seq_len = max_seq_len
        self._page_table = None  # [batch, capacity] int32 on the workspace's device
        self._seq_lens = None  # [batch] int32
        self._planned = None
        self._plans = {}
        self._plan_version = 0
        # run()'s repeated calls: the metadata of a call that passed every check -> _FastRun.
        self._fast = {}

    @property
    def is_cuda_graph_enabled(self):
        return self._graph

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, data_type=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None,
             seq_lens=None, fixed_split_size=None, disable_split_kv=False):
        """Reads the CSR page list (indptr [batch + 1], indices, last_page_len [batch], on the
        host or the device: a device copy is read once here) into the page table run() uses.
        block_tables [batch, max_pages] with seq_lens [batch] may replace the CSR form.
        q_data_type / kv_data_type (data_type: q_data_type's older name): a torch or numpy
        dtype, an ml_dtypes type, or a name ("float16", "bfloat16", "bf16", "fp8", "e4m3",
        "fp8_e4m3", "int8"). run() checks what it gets against everything promised here."""
        fn = "BatchDecodeWithPagedKVCacheWrapper.plan"
        if pos_encoding_mode != "NONE":
            raise Error(f"{fn}: pos_encoding_mode: expected \"NONE\" (deca applies no "
                        f"positional encoding), got {pos_encoding_mode!r}")
        if window_left is None or window_left < -1:
            raise Error(f"{fn}: window_left: expected -1 (none) or >= 0, got "
                        f"{window_left!r}")
        for name, value in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise Error(f"{fn}: {name}: expected an int >= 1, got {value!r}")
        if num_qo_heads % num_kv_heads:
            raise Error(f"{fn}: num_qo_heads: expected a multiple of num_kv_heads "
                        f"({num_kv_heads}), got {num_qo_heads}")
        q_dtype = _common.dtype_spelling(fn, "q_data_type" if data_type is None else
                                         "data_type", data_type if data_type is not None else
                                         q_data_type)
        if q_dtype not in ("bf16", "fp16"):
            raise Error(f"{fn}: q_data_type: expected torch.float16 or torch.bfloat16 (deca's "
                        f"queries), got {q_data_type!r}")
        kv_dtype = q_dtype
        if kv_data_type is not None:
            kv_dtype = _common.dtype_spelling(fn, "kv_data_type", kv_data_type)
            if kv_dtype not in ("bf16", "fp16", "fp8_e4m3", "int8"):
                raise Error(f"{fn}: kv_data_type: expected torch.float16, torch.bfloat16, "
                            f"torch.float8_e4m3fn or torch.int8, got {kv_data_type!r}")
        if block_tables is not None:
            if seq_lens is None:
                raise Error(f"{fn}: seq_lens: expected [batch] int32 with block_tables, got "
                            f"None")
            table = _host(block_tables).astype(np.int32)
            lens = _host(seq_lens).astype(np.int32)
        else:
            table, lens = csr_to_page_table(_host(indptr), _host(indices),
                                            _host(last_page_len), page_size, fn)
        self._store(fn, table, lens, page_size)
        split_mode, split_tokens = "auto", 0
        if fixed_split_size is not None and fixed_split_size > 0:
            split_mode, split_tokens = "fixed", int(fixed_split_size)
        elif disable_split_kv:
            # One split per request: a fixed split as long as the longest request.
            split_mode, split_tokens = "fixed", self._page_table.shape[1] * page_size
        self._planned = _Planned(
            num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
            head_dim=int(head_dim), page_size=int(page_size),
            window=0 if window_left < 0 else window_left + 1,
            softcap=float(logits_soft_cap or 0.0), sm_scale=sm_scale, q_dtype=q_dtype,
            kv_dtype=kv_dtype, split_mode=split_mode, split_tokens=split_tokens,
            batch=int(self._seq_lens.shape[0]))
        self._plan_version += 1  # run() makes its deca plans for this plan() anew
        self._fast.clear()

    def _store(self, fn, table, lens, page_size):
        batch, pages = table.shape
        capacity = pages
        if self._max_seq_len is not None:
            capacity = max(capacity, -(-int(self._max_seq_len) // page_size))
        old = self._page_table
        fits = old is not None and old.shape[0] == batch and old.shape[1] >= pages
        if not fits and old is not None and self._graph:
            raise Error(f"{fn}: indptr: expected batch {old.shape[0]} and at most "
                        f"{old.shape[1]} pages per request with use_cuda_graph=True (the "
                        f"buffers captured graphs read), got batch {batch} and {pages} pages "
                        f"(pass max_seq_len= to the wrapper to size them)")
        if not fits:
            self._page_table = _device_zeros(self._like, self._like_t, (batch, capacity))
            self._seq_lens = _device_zeros(self._like, self._like_t, (batch,))
        padded = np.zeros((batch, self._page_table.shape[1]), np.int32)
        padded[:, :pages] = table
        _copy_into(self._page_table, padded)
        _copy_into(self._seq_lens, lens)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None,
            out=None, lse=None, return_lse=False, enable_pdl=None, window_left=None,
            sinks=None):
        """q [batch, num_qo_heads, head_dim]; paged_kv_cache: one tensor [max_pages, 2,
        page_size, num_kv_heads, head_dim] (NHD) / [max_pages, 2, num_kv_heads, page_size,
        head_dim] (HND), or a (k_cache, v_cache) pair of [max_pages, page_size, num_kv_heads,
        head_dim] (NHD) / [max_pages, num_kv_heads, page_size, head_dim] (HND) tensors. Each is
        checked against what plan() promised (dtypes, heads, head_dim, page size, layout).
        Returns out [batch, num_qo_heads, head_dim], or (out, lse [batch, num_qo_heads] fp32,
        base-2 log) with return_lse or lse given. enable_pdl is accepted and has no effect:
        deca launches with programmatic dependent launch on sm_90 and later whatever it says."""
        fn = "BatchDecodeWithPagedKVCacheWrapper.run"
        key = None
        if not args and lse is None and window_left is None and not _common.compiling(q):
            # What identifies the call's shape (q's, the cache's, out's, sinks' shapes, dtypes and
            # devices; the options): everything run() checks against plan() before deca sees it.
            tensors = (q, tuple(paged_kv_cache) if type(paged_kv_cache) is list else
                       paged_kv_cache, out, sinks)
            values = (bool(return_lse),)
            key = call_key(tensors, values) or py_key(tensors, values)
            fast = None if key is None else self._fast.get(key)
            if fast is not None and _plain(q_scale) and _plain(k_scale) and _plain(v_scale):
                try:
                    return fast.run(self, q, paged_kv_cache, q_scale, k_scale, v_scale, out,
                                    sinks)
                except (Error, TypeError):
                    FALLBACKS[fn] += 1  # the checked run below names what the fast one refused
        p = self._planned
        if p is None:
            raise Error(f"{fn}: self: expected plan() to have been called, got no plan")
        if args:
            raise Error(f"{fn}: args: expected no extra positional arguments (deca takes "
                        f"k_scale / v_scale by keyword), got {len(args)}")
        if window_left is not None and (0 if window_left < 0 else window_left + 1) != \
                p.window:
            raise Error(f"{fn}: window_left: expected the planned {p.window - 1} (or "
                        f"None), got {window_left!r}")
        k_cache, v_cache, out, lse, want_lse, softmax_scale, ks, vs = self._prepare(
            fn, q, paged_kv_cache, out, lse, return_lse, q_scale, k_scale, v_scale)
        q4, out4, lse4 = q[:, None], out[:, None], lse[:, None] if want_lse else None
        ops = _common.torch_ops(q)
        if ops is not None:
            ops.gqa_decode(q4, k_cache, v_cache, self._page_table, self._seq_lens, out4, lse4,
                           sinks, None, None, self._layout, self._capacity(), "",
                           ks, vs, softmax_scale, p.softcap, p.window, 1.0, p.split_mode,
                           p.split_tokens)
        else:
            plan, ws = self._plan_for(q4, k_cache, out4, want_lse, sinks is not None)
            try:
                plan.run(q4, k_cache, v_cache, self._page_table, self._seq_lens, out4,
                         workspace=ws, lse=lse4, sinks=sinks, k_scale=ks, v_scale=vs,
                         softmax_scale=softmax_scale)
            except Error as e:
                raise _common.translate(e, fn, "gqa_decode", _NAMES) from None
            if key is not None and type(q) is not np.ndarray:  # numpy: raw-bit views
                self._fast[key] = _FastRun(plan, ws, q, p, want_lse)
        return _returned(out, lse, want_lse)

    def run_fused(self, q, k_new, v_new, paged_kv_cache, cos_sin_cache, *, positions=None,
                  is_neox=True, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
                  return_lse=False, sinks=None):
        """One launch for what FlashInfer does in three calls per layer:
        apply_rope_with_cos_sin_cache(positions, q, k_new, head_dim, cos_sin_cache, is_neox)
        (vLLM's rotary convention: cos_sin_cache [max_position, rotary_dim], the cos of the
        rotary_dim / 2 frequencies then their sin; is_neox True rotates the halves, False the
        interleaved pairs; dims past rotary_dim unrotated), then append_paged_kv_cache(k_rot,
        v_new, batch_indices = arange(batch), positions = last token of each request,
        paged_kv_cache, indices, indptr, last_page_len) with this plan's indices, which must
        already count the new token (plan() after growing last_page_len, as for an append),
        then run(q_rot, paged_kv_cache). q [batch, num_qo_heads, head_dim], k_new / v_new
        [batch, num_kv_heads, head_dim] in q's dtype (one new token per request); fp8 caches
        store round(x / k_scale), round(x / v_scale). positions [batch] int32 or int64: the
        rotary positions (None: each token's cache position). Returns what run() returns."""
        fn = "BatchDecodeWithPagedKVCacheWrapper.run_fused"
        p = self._planned
        if p is None:
            raise Error(f"{fn}: self: expected plan() to have been called, got no plan")
        k_cache, v_cache, out, lse, want_lse, softmax_scale, ks, vs = self._prepare(
            fn, q, paged_kv_cache, out, lse, return_lse, q_scale, k_scale, v_scale)
        batch = p.batch
        pos = None
        if positions is not None:
            if _common.dtype_of(positions) != "int32":
                positions = positions.int() if _common.is_torch(positions) else \
                    positions.astype(np.int32)
            pos = positions.reshape(batch, 1)
        style = "neox" if is_neox else "gptj"
        q4, out4, lse4 = q[:, None], out[:, None], lse[:, None] if want_lse else None
        k4, v4 = k_new[:, None], v_new[:, None]
        ops = _common.torch_ops(q)
        try:
            if ops is not None:
                ops.gqa_decode_fused(q4, k4, v4, cos_sin_cache, pos, k_cache, v_cache,
                                     self._page_table, self._seq_lens, out4, lse4, sinks, None,
                                     None, style, self._layout, self._capacity(), "", ks, vs,
                                     softmax_scale, p.softcap, p.window, 1.0)
            else:
                _cached_ops.gqa_fused(q4, k4, v4, cos_sin_cache, k_cache, v_cache,
                                      self._page_table, self._seq_lens, out4, lse4,
                                      positions=pos, rope_style=style, fn=fn,
                                      layout=self._layout, max_seq_len=self._capacity(),
                                      k_scale=ks, v_scale=vs, softmax_scale=softmax_scale,
                                      softcap=p.softcap, window=p.window, sinks=sinks,
                                      split_mode=p.split_mode, split_tokens=p.split_tokens)
        except Error as e:
            raise _common.translate(e, fn, "gqa_decode", _NAMES) from None
        return _returned(out, lse, want_lse)

    def _prepare(self, fn, q, paged_kv_cache, out, lse, return_lse, q_scale, k_scale, v_scale):
        """What run() and run_fused() check and allocate alike: the cache's two views checked
        against the plan, out and lse (allocated when missing), the softmax and KV scales."""
        p = self._planned
        k_cache, v_cache = _split_cache(fn, paged_kv_cache, self._layout)
        p.check_run(fn, self._layout, q, k_cache, v_cache,
                    isinstance(paged_kv_cache, (tuple, list)))
        batch, heads, dim = p.batch, p.num_qo_heads, p.head_dim
        want_lse = return_lse or lse is not None
        if out is None:
            out = allocator(q, f"{fn}: out")((batch, heads, dim), q.dtype)
        if want_lse and lse is None:
            lse = allocator(q, f"{fn}: lse")((batch, heads), "fp32")
        elif want_lse:
            _common.expect_dtype(fn, "lse", lse, ("fp32",))
        softmax_scale = (p.sm_scale or 1.0 / math.sqrt(dim)) * \
            _common.scale_float(fn, "q_scale", q_scale)
        ks = _common.scale_float(fn, "k_scale", k_scale)
        vs = _common.scale_float(fn, "v_scale", v_scale)
        return k_cache, v_cache, out, lse, want_lse, softmax_scale, ks, vs

    def _capacity(self):
        return self._page_table.shape[1] * self._planned.page_size

    def _plan_for(self, q4, k_cache, out4, want_lse, sinks):
        """The deca plan (and workspace) of this FlashInfer plan for runs with / without LSE
        and sinks, made at the first such run."""
        key = (want_lse, sinks, self._plan_version)
        hit = self._plans.get(key)
        if hit is None:
            if any(k[2] != self._plan_version for k in self._plans):
                self._plans.clear()  # made for an earlier plan()
            p = self._planned
            hit = _cached_ops.gqa_plan(q4, k_cache, self._page_table, out4,
                                       fn="BatchDecodeWithPagedKVCacheWrapper.run",
                                       layout=self._layout, max_seq_len=self._capacity(),
                                       lse=want_lse, sinks=sinks, window=p.window,
                                       softcap=p.softcap, split_mode=p.split_mode,
                                       split_tokens=p.split_tokens)
            self._plans[key] = hit
        return hit

    forward = run


def _plain(scale):
    """A scale run_fast takes as it is: None or a Python number (not a tensor to read)."""
    return scale is None or type(scale) is float or type(scale) is int


class _FastRun:
    """run() of a call whose key (run()'s) an earlier call had, which passed every check
    against plan(): the outputs allocated and one C++ call, which takes q and out as they come
    ([batch, heads, dim]; deca's q_len axis inserted there) and the combined cache as it is."""

    def __init__(self, plan, ws, q, planned, want_lse):
        self.c_plan, self.ws = plan._plan, ws
        self.stream = stream_getter(plan._cuda_index, q)
        batch, heads, dim = planned.batch, planned.num_qo_heads, planned.head_dim
        self.scale = planned.sm_scale or 1.0 / math.sqrt(dim)
        self.want_lse = want_lse
        fn = "BatchDecodeWithPagedKVCacheWrapper.run"
        self.new_out = maker(q, (batch, heads, dim), q.dtype, f"{fn}: out")
        self.new_lse = maker(q, (batch, heads), "fp32", f"{fn}: lse") if want_lse else None

    def run(self, wrapper, q, cache, q_scale, k_scale, v_scale, out, sinks):
        pair = isinstance(cache, (tuple, list))
        k_cache, v_cache = (cache[0], cache[1]) if pair else (cache, None)
        if out is None:
            out = self.new_out()
        lse = self.new_lse() if self.want_lse else None
        _C.gqa_decode_planned_fast(
            self.c_plan, q, k_cache, v_cache, wrapper._page_table, wrapper._seq_lens, out, lse,
            None, sinks, None, None, 1.0 if k_scale is None else float(k_scale),
            1.0 if v_scale is None else float(v_scale),
            self.scale * (1.0 if q_scale is None else float(q_scale)), 1.0, self.ws,
            self.stream(), False, True, not pair)
        return _returned(out, lse, self.want_lse)


class _Planned:
    """What plan() promised (heads, head_dim, page size, dtypes, batch, window, splits), which
    run() checks its arguments against."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def check_run(self, fn, layout, q, k_cache, v_cache, pair):
        b, h, d = _common.rank(fn, "q", q, 3, "[batch, num_qo_heads, head_dim]")
        for dim, (got, want, what) in enumerate(((b, self.batch, "the batch plan()'s indptr "
                                                  "holds"),
                                                 (h, self.num_qo_heads, "plan()'s num_qo_heads"),
                                                 (d, self.head_dim, "plan()'s head_dim"))):
            if got != want:
                name = ("batch", "num_qo_heads", "head_dim")[dim]
                raise Error(f"{fn}: q: dim {dim} ({name}): expected {want} ({what}), got {got}")
        got = _common.dtype_of(q)
        if got != self.q_dtype:
            raise Error(f"{fn}: q: expected {_common.spell(q, self.q_dtype)} (plan()'s "
                        f"q_data_type), got {_common.spell(q, got)} (plan() with "
                        f"q_data_type={_common.spell(q, got)} for such a q)")
        names = ("paged_kv_cache[0]", "paged_kv_cache[1]") if pair else \
            ("paged_kv_cache[:, 0]", "paged_kv_cache[:, 1]")
        for name, cache in zip(names, (k_cache, v_cache)):
            self._check_cache(fn, name, layout, cache)

    def _check_cache(self, fn, name, layout, cache):
        dims = ("[max_pages, page_size, num_kv_heads, head_dim]" if layout == "NHD" else
                "[max_pages, num_kv_heads, page_size, head_dim]")
        shape = _common.rank(fn, name, cache, 4, f"{dims} ({layout})")
        page, heads = (shape[1], shape[2]) if layout == "NHD" else (shape[2], shape[1])
        if shape[3] != self.head_dim:
            raise Error(f"{fn}: {name}: dim 3 (head_dim): expected {self.head_dim} (plan()'s "
                        f"head_dim), got {shape[3]}")
        if (page, heads) != (self.page_size, self.num_kv_heads):
            other = "HND" if layout == "NHD" else "NHD"
            hint = ""
            if (heads, page) == (self.page_size, self.num_kv_heads):
                hint = (f"; the cache looks {other}: construct the wrapper with "
                        f"kv_layout=\"{other}\"")
            raise Error(f"{fn}: {name}: expected {dims} ({layout}) with page_size "
                        f"{self.page_size} and num_kv_heads {self.num_kv_heads} (plan()'s), got "
                        f"{list(shape)}{hint}")
        got = _common.dtype_of(cache)
        if got != self.kv_dtype and not (got == "uint8" and self.kv_dtype == "fp8_e4m3"):
            raise Error(f"{fn}: {name}: expected {_common.spell(cache, self.kv_dtype)} (plan()'s "
                        f"kv_data_type, q_data_type when not given), got "
                        f"{_common.spell(cache, got)}")


def csr_to_page_table(indptr, indices, last_page_len, page_size, fn="csr_to_page_table"):
    """FlashInfer's CSR page list (numpy) -> (page_table [batch, max_pages], seq_lens [batch])
    int32: request b owns pages indices[indptr[b]:indptr[b + 1]], all full but the last, which
    holds last_page_len[b] tokens (a request with no pages has length 0)."""
    indptr = np.asarray(indptr, np.int64).reshape(-1)
    last = np.asarray(last_page_len, np.int64).reshape(-1)
    batch = indptr.shape[0] - 1
    if batch < 0 or last.shape[0] != batch:
        raise Error(f"{fn}: last_page_len: expected [batch] with indptr [batch + 1], got "
                    f"{last.shape[0]} entries and indptr of {indptr.shape[0]}")
    counts = np.diff(indptr)
    if (counts < 0).any():
        raise Error(f"{fn}: indptr: expected non-decreasing offsets, got {indptr.tolist()}")
    if indptr[-1] > np.asarray(indices).size or indptr[0] < 0:
        raise Error(f"{fn}: indices: expected at least indptr[-1] = {int(indptr[-1])} "
                    f"entries, got {np.asarray(indices).size}")
    bad = (counts > 0) & ((last < 1) | (last > page_size))
    if bad.any():
        b = int(np.argmax(bad))
        raise Error(f"{fn}: last_page_len: expected 1..page_size ({page_size}) for a request "
                    f"with pages, got {int(last[b])} at request {b}")
    max_pages = max(int(counts.max()) if batch else 0, 1)
    table = np.zeros((batch, max_pages), np.int32)
    owned = np.arange(max_pages)[None, :] < counts[:, None]
    # Row-major order of the mask is CSR order: row b's True cells take its pages in turn.
    table[owned] = np.asarray(indices).reshape(-1)[indptr[0]:indptr[-1]]
    lens = np.where(counts > 0, (counts - 1) * page_size + last, 0).astype(np.int32)
    return table, lens


def _split_cache(fn, cache, layout):
    if isinstance(cache, (tuple, list)):
        if len(cache) != 2:
            raise Error(f"{fn}: paged_kv_cache: expected a (k_cache, v_cache) pair, got "
                        f"{len(cache)} tensors")
        return cache[0], cache[1]
    shape = tuple(getattr(cache, "shape", ()))
    if len(shape) != 5 or shape[1] != 2:
        want = ("[max_pages, 2, page_size, num_kv_heads, head_dim]" if layout == "NHD" else
                "[max_pages, 2, num_kv_heads, page_size, head_dim]")
        raise Error(f"{fn}: paged_kv_cache: expected {want} or a (k, v) pair, got shape "
                    f"{list(shape)}")
    # Two strided views of one allocation: deca reads any page stride.
    return cache[:, 0], cache[:, 1]


def _host(x):
    if torch_of(x) is not None:
        return x.detach().cpu().numpy()
    cupy = cupy_of(x)
    if cupy is not None:
        return cupy.asnumpy(x)
    return np.asarray(x)


def _device_zeros(like, like_t, shape):
    torch = torch_of(like)
    if torch is not None:
        return torch.zeros(shape, dtype=torch.int32, device=like.device)
    cupy = cupy_of(like)
    if cupy is not None:
        with cupy.cuda.Device(like_t.device.index):
            return cupy.zeros(shape, dtype=np.int32)
    return np.zeros(shape, np.int32)


def _copy_into(dst, host):
    torch = torch_of(dst)
    if torch is not None:
        if dst.device.type == "cpu":
            dst.numpy()[...] = host  # torch's CPU copy_ spins up its thread pool: slower
        else:
            dst.copy_(torch.from_numpy(np.ascontiguousarray(host)))
        return
    if cupy_of(dst) is not None:
        dst.set(np.ascontiguousarray(host))
        return
    dst[...] = host


def _returned(out, lse, want_lse):
    """What run() / run_fused() return: out, or (out, lse) in FlashInfer's base 2."""
    if not want_lse:
        return out
    lse *= _common.LOG2_E  # deca's natural log -> FlashInfer's base 2
    return out, lse
