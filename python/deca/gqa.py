"""GQA / MQA / MHA decode over a paged KV cache (docs/semantics.md, "GQA / MQA / MHA decode")."""

from __future__ import annotations

import numpy as np

from . import _C, _plan_cache
from ._tensors import (FALLBACKS, Error, allocator, bits_views, call_key, check_dtype_keywords,
                       check_scalars, choice, current_stream, expect_rank, maker, numpy_dtype,
                       parse_device, py_key, stream_getter, stream_int, tensor)

_LAYOUTS = ("NHD", "HND")
# Keys per split when split_mode="fixed" is asked for without split_tokens: a few kernel tiles,
# so short requests stay one split and long ones still spread over the SMs; any fixed value
# gives batch invariance, this one is merely a reasonable cost.
DEFAULT_FIXED_SPLIT_TOKENS = 1024
_SPLIT_MODES = ("auto", "fixed")
_ROPE_STYLES = ("none", "neox", "gptj")
_CACHE_SHAPE = {
    "NHD": "[num_pages, page_size, num_kv_heads, head_dim]",
    "HND": "[num_pages, num_kv_heads, page_size, head_dim]",
}


def _run_tensors(fn, q, k_cache, v_cache, page_table, seq_lens, q_dtype, kv_dtype, lse,
                 tree_mask, sinks, k_scales, v_scales):
    """Imports every input, each named for messages, before anything is derived from them."""
    return dict(
        q=tensor(q, f"{fn}: q", q_dtype),
        k_cache=tensor(k_cache, f"{fn}: k_cache", kv_dtype),
        v_cache=tensor(v_cache, f"{fn}: v_cache", kv_dtype),
        page_table=tensor(page_table, f"{fn}: page_table", "int32"),
        seq_lens=tensor(seq_lens, f"{fn}: seq_lens", "int32"),
        lse=tensor(lse, f"{fn}: lse", writable=True),
        tree_mask=tensor(tree_mask, f"{fn}: tree_mask", "uint32"),
        sinks=tensor(sinks, f"{fn}: sinks"),
        k_scales=tensor(k_scales, f"{fn}: k_scales"),
        v_scales=tensor(v_scales, f"{fn}: v_scales"),
    )


# The one-off call's prepared shapes: the caller's argument metadata -> _OneOff.
_ONEOFF = _plan_cache.memo()


class _OneOff:
    """What the first one-off call of a shape prepared: the plan, its workspaces (one per stream,
    _plan_cache.StreamWorkspaces), and the outputs' shape and dtype (in the caller's library),
    so that a repeated call plans nothing."""

    __slots__ = ("plan", "workspaces", "new_out", "new_lse", "want_lse", "stream", "direct")

    def __init__(self, plan, q, like, out_shape, want_lse):
        """q: the first call's; like: q when its library (torch, numpy) allocates the outputs,
        None when the caller passes them (another library: the first-call path allocates)."""
        self.plan, self.want_lse = plan, want_lse
        self.workspaces = _plan_cache.StreamWorkspaces(plan.workspace_bytes, "gqa_decode")
        self.new_out = self.new_lse = None
        self.stream = stream_getter(plan._cuda_index, q)
        # Tensors GqaPlan.run's fast path takes as they come (not numpy's raw-bit views): the
        # C++ call is made here, GqaPlan.run (and its checked path) only for what it refuses.
        self.direct = like is not None and type(like) is not np.ndarray
        if like is not None:
            self.new_out = maker(like, out_shape, plan.config.out_dtype, "gqa_decode: out")
            self.new_lse = maker(like, out_shape[:3], "fp32", "gqa_decode: lse")

    def run(self, q, k_cache, v_cache, page_table, seq_lens, out, lse, tree_mask, sinks,
            k_scales, v_scales, k_scale, v_scale, softmax_scale, out_scale, stream):
        if out is None:
            out = self.new_out()
        if self.want_lse and lse is None:
            lse = self.new_lse()
        plan = self.plan
        current = self.stream()
        if stream is None:
            stream = current
        elif type(stream) is not int:
            stream = stream_int(stream, "gqa_decode")
        ws = self.workspaces.get(stream, q, current)
        done = False
        if self.direct:
            try:
                _C.gqa_decode_planned_fast(
                    plan._plan, q, k_cache, v_cache, page_table, seq_lens, out, lse, tree_mask,
                    sinks, k_scales, v_scales, k_scale, v_scale, softmax_scale or 0.0,
                    out_scale, ws, stream)
                done = True
            except (Error, TypeError):
                pass  # GqaPlan.run retries and its checked path names the argument
        if not done:
            plan.run(q, k_cache, v_cache, page_table, seq_lens, out, workspace=ws, lse=lse,
                     tree_mask=tree_mask, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                     k_scales=k_scales, v_scales=v_scales, softmax_scale=softmax_scale,
                     out_scale=out_scale, stream=stream)
        if plan._check_runs:
            # Checked mode: this call reports its own bad page ids and lengths (synchronising).
            plan.check(ws, stream=stream)
        return (out, lse) if self.want_lse else out


def gqa_decode(q, k_cache, v_cache, page_table, seq_lens, out=None, *, layout="NHD",
               q_dtype=None, kv_dtype=None, k_scale=1.0, v_scale=1.0, k_scales=None,
               v_scales=None, softmax_scale=None, softcap=0.0, window=0, sinks=None,
               tree_mask=None, return_lse=False, lse=None, out_dtype=None, out_scale=1.0,
               max_seq_len=None, split_mode="auto", split_tokens=None, beam_width=1,
               checked=None, skip_softmax_factor=0.0, stream=None):
    """Paged decode attention for one batch; returns out, or (out, lse) when return_lse or lse.

    q [batch, q_len, num_q_heads, head_dim] bf16|fp16; k_cache / v_cache in `layout` ("NHD":
    [num_pages, page_size, num_kv_heads, head_dim], "HND": [num_pages, num_kv_heads, page_size,
    head_dim]) bf16|fp16|fp8_e4m3|int8 (real = stored * k_scale, or * k_scales[kv_head]);
    page_table [batch, max_pages] int32; seq_lens [batch] int32 (new tokens included).
    Optional: sinks [num_q_heads] fp32, tree_mask [batch, q_len, ceil(q_len/32)] uint32,
    lse [batch, q_len, num_q_heads] fp32. out is allocated (numpy / torch) when None.
    This one-off form plans at the first call of each shape (tensor shapes, dtypes, device and
    these options) and reuses that plan and its workspace after; engines use GqaPlan once and
    GqaPlan.run per layer, with a workspace of their own per stream.
    checked (None: deca.checked_by_default()): on a GPU, the kernel tests the page ids and
    lengths it reads and this call raises deca.Error for the first bad one after the run (the
    call synchronises its stream; see GqaPlan.check).
    skip_softmax_factor (0 = exact): skip-softmax, approximate (docs/semantics.md): tiles of keys
    whose largest logit is below the running maximum by more than log(L / factor) add nothing
    and their V is not read.
    """
    # What identifies the call's shape (the tensors' shapes, dtypes and devices; the options):
    # a repeated one finds the plan its first call made.
    tensors = (q, k_cache, out, page_table, lse, tree_mask, sinks, k_scales, v_scales)
    values = (layout, q_dtype, kv_dtype, out_dtype, return_lse, window, softcap, max_seq_len,
              split_mode, split_tokens, beam_width, checked, skip_softmax_factor)
    key = call_key(tensors, values) or py_key(tensors, values)
    if key is not None:
        hit = _ONEOFF.get(key)
        if hit is not None:
            try:
                return hit.run(q, k_cache, v_cache, page_table, seq_lens, out, lse, tree_mask,
                               sinks, k_scales, v_scales, k_scale, v_scale, softmax_scale,
                               out_scale, stream)
            except (Error, TypeError):
                FALLBACKS["gqa_decode"] += 1  # the first-call path below names the argument
    fn = "gqa_decode"
    choice(fn, "layout", layout, _LAYOUTS)
    choice(fn, "split_mode", split_mode, _SPLIT_MODES)
    q_dtype, kv_dtype, out_dtype = check_dtype_keywords(fn, q_dtype=q_dtype, kv_dtype=kv_dtype,
                                                        out_dtype=out_dtype)
    check_scalars(fn, ints=dict(window=window, max_seq_len=max_seq_len, split_tokens=split_tokens,
                                beam_width=beam_width),
                  floats=dict(k_scale=k_scale, v_scale=v_scale, softmax_scale=softmax_scale,
                              softcap=softcap, out_scale=out_scale,
                              skip_softmax_factor=skip_softmax_factor),
                  bools=dict(return_lse=return_lse, checked=checked))
    t = _run_tensors(fn, q, k_cache, v_cache, page_table, seq_lens, q_dtype, kv_dtype, lse,
                     tree_mask, sinks, k_scales, v_scales)
    qt, kt = t["q"], t["k_cache"]
    expect_rank(fn, "q", qt, 4, "[batch, q_len, num_q_heads, head_dim]")
    expect_rank(fn, "k_cache", kt, 4, _CACHE_SHAPE[layout])
    if kt.dtype == "uint8" and kv_dtype is None:
        raise Error(f"{fn}: k_cache: expected dtype bf16, fp16, fp8_e4m3 or int8, got uint8 "
                    f"(for fp8 bits in uint8 pass kv_dtype=\"fp8_e4m3\")")
    out_t = None if out is None else tensor(out, f"{fn}: out", out_dtype, writable=True)
    want_lse = return_lse or lse is not None

    c = _C.GqaConfig()
    c.layout = layout
    c.q_dtype, c.kv_dtype = qt.dtype, kt.dtype
    c.out_dtype = out_t.dtype if out_t is not None else (out_dtype or qt.dtype)
    c.max_seq_len = max_seq_len or 0
    c.tree_mask = tree_mask is not None
    c.sinks = sinks is not None
    c.lse = want_lse
    c.per_head_kv_scale = k_scales is not None or v_scales is not None
    c.window, c.softcap, c.beam_width = window, softcap, beam_width
    c.split_mode, c.split_tokens = split_mode, _split_tokens(split_mode, split_tokens)
    if checked is not None:
        c.checked = checked
    c.skip_softmax_factor = skip_softmax_factor
    c.device = qt.device
    # The sizes and maxima from the tensors, checked on them (messages name q, k_cache, ...).
    c = _C.gqa_oneoff_config(c, qt, kt, t["page_table"], out_t)
    plan, _ = _plan_cache.plan(GqaPlan, GQA_KEYS, config_values(c), q, qt, fn)
    prepared = _OneOff(plan, q, None if key is None else q, tuple(qt.shape), want_lse)
    if key is not None:
        _ONEOFF[key] = prepared
    else:  # a library the prepared call does not allocate in
        if out is None:
            out = allocator(q, f"{fn}: out", qt)(tuple(qt.shape), c.out_dtype)
        if want_lse and lse is None:
            lse = allocator(q, f"{fn}: lse", qt)(tuple(qt.shape[:3]), "fp32")
    return prepared.run(q, k_cache, v_cache, page_table, seq_lens, out, lse, tree_mask, sinks,
                        k_scales, v_scales, k_scale, v_scale, softmax_scale, out_scale, stream)


# GqaPlan's keywords, in the order _plan_cache keys plans by (config_values).
GQA_KEYS = ("num_q_heads", "num_kv_heads", "head_dim", "page_size", "max_seq_len", "layout",
            "q_dtype", "kv_dtype", "out_dtype", "max_batch", "max_q_len", "tree_mask", "sinks",
            "lse", "per_head_kv_scale", "window", "softcap", "beam_width", "split_mode",
            "split_tokens", "checked", "skip_softmax_factor", "rope_style", "rotary_dim",
            "device")


def config_values(c):
    """A _C.GqaConfig's fields in GQA_KEYS order, as GqaPlan takes them (a plain tuple)."""
    d = c.device
    return tuple(getattr(c, name) for name in GQA_KEYS[:-1]) + (
        "cpu" if d.kind == _C.DeviceKind.CPU else f"cuda:{d.index}",)


def _split_tokens(split_mode, split_tokens):
    """split_tokens=None: 0 for "auto" (the plan chooses), DEFAULT_FIXED_SPLIT_TOKENS for
    "fixed"; a value given is passed on as it is (and checked in C++)."""
    if split_tokens is not None:
        return split_tokens
    return DEFAULT_FIXED_SPLIT_TOKENS if split_mode == "fixed" else 0


def _config(fn, num_q_heads, num_kv_heads, head_dim, page_size, *, max_seq_len=None,
            layout="NHD", q_dtype="bf16", kv_dtype="bf16", out_dtype=None, max_batch=1,
            max_q_len=1, tree_mask=False, sinks=False, lse=False, per_head_kv_scale=False,
            window=0, softcap=0.0, beam_width=1, split_mode="auto", split_tokens=None,
            checked=None, skip_softmax_factor=0.0, rope_style="none", rotary_dim=0,
            device="cpu"):
    """The _C.GqaConfig of GqaPlan's arguments (validated in C++ when it is used)."""
    choice(fn, "layout", layout, _LAYOUTS)
    choice(fn, "rope_style", rope_style, _ROPE_STYLES)
    choice(fn, "split_mode", split_mode, _SPLIT_MODES)
    q_dtype, kv_dtype, out_dtype = check_dtype_keywords(fn, q_dtype=q_dtype, kv_dtype=kv_dtype,
                                                        out_dtype=out_dtype)
    check_scalars(fn, ints=dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                head_dim=head_dim, page_size=page_size, max_batch=max_batch,
                                max_q_len=max_q_len, max_seq_len=max_seq_len, window=window,
                                beam_width=beam_width, split_tokens=split_tokens,
                                rotary_dim=rotary_dim),
                  floats=dict(softcap=softcap, skip_softmax_factor=skip_softmax_factor),
                  bools=dict(tree_mask=tree_mask, sinks=sinks, lse=lse,
                             per_head_kv_scale=per_head_kv_scale, checked=checked))
    if max_seq_len is None:
        # No default can be right: too small refuses runs, too large over-splits short requests
        # and sizes the workspace for nothing.
        raise Error(f"{fn}: max_seq_len: expected the longest KV length (tokens, new ones "
                    f"included) any run of this plan will see, e.g. max_seq_len=32768 (a "
                    f"required keyword), got none")
    c = _C.GqaConfig()
    c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size = (num_q_heads, num_kv_heads,
                                                              head_dim, page_size)
    c.layout = layout
    c.q_dtype, c.kv_dtype, c.out_dtype = q_dtype, kv_dtype, out_dtype or q_dtype
    c.max_batch, c.max_q_len, c.max_seq_len = max_batch, max_q_len, max_seq_len
    c.tree_mask, c.sinks, c.lse = tree_mask, sinks, lse
    c.per_head_kv_scale = per_head_kv_scale
    c.window, c.softcap, c.beam_width = window, softcap, beam_width
    c.split_mode, c.split_tokens = split_mode, _split_tokens(split_mode, split_tokens)
    if checked is not None:
        c.checked = checked
    c.skip_softmax_factor = skip_softmax_factor
    c.rope_style, c.rotary_dim = rope_style, rotary_dim
    c.device = parse_device(device, fn)
    return c


def precompile_gqa_decode(num_q_heads, num_kv_heads, head_dim=128, page_size=16, *,
                          compute_capability=0, **options):
    """Compiles the GPU kernel a GqaPlan of these arguments runs (options: GqaPlan's keywords)
    into the on-disk kernel cache (DECA_CACHE_DIR, else ~/.cache/deca) and returns its name.

    compute_capability: 80, 86, 89, 90, ... to compile without a GPU (the device option is then
    not used); 0 compiles for the device option's GPU. Nothing is launched: a build step or a
    server's start-up warms the cache so that no request waits for NVRTC.
    """
    fn = "precompile_gqa_decode"
    return _C.precompile_gqa_decode(
        _config(fn, num_q_heads, num_kv_heads, head_dim, page_size, **options),
        compute_capability)


class GqaPlan:
    """A plan for one model layer's decode shape: made once, run per layer and step.

    The plan fixes head counts, head_dim, page size, layout, dtypes and features, and the maxima
    every later run promises to stay within; from those alone it derives the kernel, the split
    count and the workspace size, so a run is CUDA-graph safe. On a CUDA device, allocate
    `workspace_bytes` bytes once (zeroed) and pass them to every run.
    """

    def __init__(self, num_q_heads, num_kv_heads, head_dim=128, page_size=16, *, max_seq_len=None,
                 **options):
        """max_seq_len (required): the longest KV length any run will see (new tokens included).
        options: layout="NHD", q_dtype="bf16", kv_dtype="bf16", out_dtype=None (= q_dtype),
        max_batch=1, max_q_len=1, tree_mask=False, sinks=False, lse=False,
        per_head_kv_scale=False, window=0, softcap=0.0, beam_width=1, split_mode="auto",
        split_tokens=None (0 for "auto"; DEFAULT_FIXED_SPLIT_TOKENS = 1024 for "fixed"),
        checked=None (deca.checked_by_default(): on in a debug build or with DECA_CHECKED=1; see
        check()), skip_softmax_factor=0.0 (0 = exact attention; > 0: skip-softmax, see
        gqa_decode), rope_style="none" ("neox" or "gptj": a fused plan, run with run_fused),
        rotary_dim=0 (fused: the rotated dims, a multiple of 16; 0 = head_dim), device="cpu"."""
        self._plan = _C.plan_gqa_decode(
            _config("GqaPlan", num_q_heads, num_kv_heads, head_dim, page_size,
                    max_seq_len=max_seq_len, **options))
        d = self._plan.config.device
        self._cuda_index = d.index if d.kind == _C.DeviceKind.CUDA else -1
        # Whether check() has anything to read: a checked plan on a GPU.
        self._check_runs = self._plan.config.checked and self._cuda_index >= 0
        c = self._plan.config
        self._numpy_dtypes = tuple(numpy_dtype(d) for d in (c.q_dtype, c.kv_dtype, c.out_dtype))

    config = property(lambda self: self._plan.config, doc="the validated _C.GqaConfig")
    workspace_bytes = property(lambda self: self._plan.workspace_bytes,
                               doc="bytes of device workspace every run needs (0 on the CPU)")
    num_splits = property(lambda self: self._plan.num_splits,
                          doc="CTAs per (request, kv head) along the sequence")
    split_tokens = property(lambda self: self._plan.split_tokens,
                            doc="keys per split (fixed split mode), else 0")
    kernel_name = property(lambda self: self._plan.kernel_name,
                           doc="the kernel specialization (its JIT cache key); '' on the CPU")
    sm_count = property(lambda self: self._plan.sm_count)
    checked = property(lambda self: self._plan.config.checked,
                       doc="whether the kernel tests the page ids and lengths it reads")

    def check(self, workspace, *, stream=None):
        """Checked mode: raises deca.Error for the first out-of-range page id or length that the
        runs on `workspace` met since the last check, e.g. "gqa_decode: page_table[3][17]:
        expected a page id in [0, 4096), got 99999 (found by the checked GPU run)", and clears
        the record. Synchronises `stream` (by default the current stream of the runs' library,
        else the legacy default stream): call it outside CUDA-graph capture, once per step or per
        layer, not inside a hot loop. run() never synchronises by itself. Nothing happens for an
        unchecked plan or on the CPU (which checks every index on the host before the run).
        """
        if not self.checked or self._cuda_index < 0:
            return
        if stream is None:
            stream = self._current_stream(workspace)
        elif type(stream) is not int:
            stream = stream_int(stream, "gqa_decode")
        _C.check_gqa_run(self._plan, tensor(workspace, "check_gqa_run: workspace", writable=True),
                         stream)

    def __repr__(self):
        c = self._plan.config
        return (f"GqaPlan(heads {c.num_q_heads}/{c.num_kv_heads}, head_dim {c.head_dim}, "
                f"page {c.page_size} {c.layout}, {c.q_dtype}/{c.kv_dtype}->{c.out_dtype}, "
                f"on {c.device}, splits {self.num_splits}, workspace {self.workspace_bytes} B, "
                f"kernel '{self.kernel_name}')")

    def run(self, q, k_cache, v_cache, page_table, seq_lens, out, *, workspace=None, lse=None,
            tree_mask=None, sinks=None, k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None,
            softmax_scale=None, out_scale=1.0, stream=None):
        """Runs the plan; writes out (and lse when given) in place and returns out.

        Dtypes come from the plan, so raw-bit arrays (uint16 for bf16/fp16, uint8 for fp8) need
        no keyword here. workspace: a tensor of at least workspace_bytes bytes on the device.
        stream: a cudaStream_t as int, or an object with .cuda_stream / .ptr; by default the
        current stream of q's library (torch, cupy), else the legacy default stream.

        The per-call cost is one C++ call: the tensors go straight to it (torch ones through
        torch's C DLPack export). Anything that call cannot take (ml_dtypes arrays, a dtype
        torch cannot export, a wrong argument) is retried on the checked path, which imports
        each argument by name and raises the message the user sees. Every error is raised
        before a launch, so the retry never runs a kernel twice.
        """
        if stream is None:
            # CPU plans need no stream: skip the lookup (a method call and module probes).
            stream = self._current_stream(q) if self._cuda_index >= 0 else 0
        elif type(stream) is not int:
            stream = stream_int(stream, "gqa_decode")
        fq, fk, fv, fo = q, k_cache, v_cache, out
        if type(q) is np.ndarray:
            # numpy has no bf16 / fp8: ml_dtypes arrays of the plan's dtypes go to the fast path
            # as their raw bits (the plan names their dtypes).
            qd, kd, od = self._numpy_dtypes
            fq, = bits_views(qd, q)
            fk, fv = bits_views(kd, k_cache, v_cache)
            fo, = bits_views(od, out)
        try:
            _C.gqa_decode_planned_fast(
                self._plan, fq, fk, fv, page_table, seq_lens, fo, lse, tree_mask, sinks,
                k_scales, v_scales, k_scale, v_scale, softmax_scale or 0.0, out_scale,
                workspace, stream)
        except (Error, TypeError):
            FALLBACKS["GqaPlan.run"] += 1
            self._run_checked(q, k_cache, v_cache, page_table, seq_lens, out, workspace, lse,
                              tree_mask, sinks, k_scale, v_scale, k_scales, v_scales,
                              softmax_scale, out_scale, stream)
        return out

    def _current_stream(self, q):
        return current_stream(self._cuda_index, q)

    def _run_checked(self, q, k_cache, v_cache, page_table, seq_lens, out, workspace, lse,
                     tree_mask, sinks, k_scale, v_scale, k_scales, v_scales, softmax_scale,
                     out_scale, stream):
        fn = "gqa_decode"
        check_scalars(fn, floats=dict(k_scale=k_scale, v_scale=v_scale,
                                      softmax_scale=softmax_scale, out_scale=out_scale))
        c = self._plan.config
        t = _run_tensors(fn, q, k_cache, v_cache, page_table, seq_lens, c.q_dtype, c.kv_dtype,
                         lse, tree_mask, sinks, k_scales, v_scales)
        out_t = tensor(out, f"{fn}: out", c.out_dtype, writable=True)
        ws_t = tensor(workspace, f"{fn}: workspace", writable=True)
        _C.gqa_decode_planned(
            self._plan, t["q"], t["k_cache"], t["v_cache"], t["page_table"], t["seq_lens"],
            out_t, t["lse"], t["tree_mask"], t["sinks"], t["k_scales"], t["v_scales"], k_scale,
            v_scale, softmax_scale or 0.0, out_scale, ws_t, stream)

    def run_fused(self, q, k_new, v_new, cos_sin_cache, k_cache, v_cache, page_table, seq_lens,
                  out, *, positions=None, workspace=None, lse=None, tree_mask=None, sinks=None,
                  k_scale=1.0, v_scale=1.0, k_scales=None, v_scales=None, softmax_scale=None,
                  out_scale=1.0, stream=None):
        """The fused decode step of a plan made with rope_style "neox" or "gptj" (docs/python.md,
        "Fused decode step"): rotates q and k_new ([batch, q_len, heads, head_dim], q's dtype,
        before rotary embedding) at their positions (positions [batch, q_len] int32, else
        seq_lens[b] - q_len + i) with cos_sin_cache [max_position, rotary_dim] (vLLM's layout:
        cos then sin), writes k_new / v_new into the caches at cache position
        seq_lens[b] - q_len + i (quantized with k_scale / v_scale or k_scales / v_scales for
        fp8 / int8 caches), then attends as run() does, in one launch. Writes out (and lse) and
        the new slots of k_cache / v_cache; returns out."""
        fn = "gqa_decode"
        if stream is None:
            stream = self._current_stream(q) if self._cuda_index >= 0 else 0
        elif type(stream) is not int:
            stream = stream_int(stream, fn)
        check_scalars(fn, floats=dict(k_scale=k_scale, v_scale=v_scale,
                                      softmax_scale=softmax_scale, out_scale=out_scale))
        c = self._plan.config
        t = _run_tensors(fn, q, k_cache, v_cache, page_table, seq_lens, c.q_dtype, c.kv_dtype,
                         lse, tree_mask, sinks, k_scales, v_scales)
        _C.gqa_decode_fused_planned(
            self._plan, t["q"], tensor(k_new, f"{fn}: k_new", c.q_dtype),
            tensor(v_new, f"{fn}: v_new", c.q_dtype), tensor(cos_sin_cache, f"{fn}: cos_sin_cache"),
            tensor(positions, f"{fn}: positions", "int32"),
            # The caches are written (the new tokens' slots).
            tensor(k_cache, f"{fn}: k_cache", c.kv_dtype, writable=True),
            tensor(v_cache, f"{fn}: v_cache", c.kv_dtype, writable=True),
            t["page_table"], t["seq_lens"], tensor(out, f"{fn}: out", c.out_dtype, writable=True),
            t["lse"], t["tree_mask"], t["sinks"], t["k_scales"], t["v_scales"], k_scale, v_scale,
            softmax_scale or 0.0, out_scale, tensor(workspace, f"{fn}: workspace", writable=True),
            stream)
        return out
