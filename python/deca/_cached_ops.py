"""Decode calls without a plan argument, over _plan_cache: the bodies of the torch custom ops
(deca.torch_ops) and the plan lookups of the compat wrappers.

Each takes the tensors and the scalar options a custom op can carry (no plan objects), derives
the plan's config from the tensors' shapes and dtypes at the first call of a shape, and runs the
cached plan into the caller's out / lse. A repeated call finds its (plan, workspace) by the
tensors' own metadata (shape, dtype and device objects, read without an import) and the
options.
"""

from __future__ import annotations

from . import _C, _plan_cache
from ._tensors import Error, call_key, expect_rank, py_key, tensor, torch_of
from .gqa import GQA_KEYS, GqaPlan
from .mla import MLA_KEYS, NO_EXTRA, MlaPlan, dense_kv_format, extra_config, sparse_kv_format

# Set by deca.torch_ops once torch.ops.deca.* exist. A flag, not a look in sys.modules: the
# compat wrappers read it in code torch.compile traces (see _tensors.torch_of).
TORCH_OPS_REGISTERED = False

# The caller's metadata and options -> (plan, workspace).
_GQA_CALLS = _plan_cache.memo()
_MLA_CALLS = _plan_cache.memo()


def gqa(q, k_cache, v_cache, page_table, seq_lens, out, lse=None, *, fn="gqa_decode",
        layout="NHD", max_seq_len=0, kv_dtype=None, k_scale=1.0, v_scale=1.0, k_scales=None,
        v_scales=None, softmax_scale=0.0, softcap=0.0, window=0, sinks=None, out_scale=1.0,
        split_mode="auto", split_tokens=0, skip_softmax_factor=0.0):
    """Paged GQA decode of q [batch, q_len, hq, d] into out (and lse [batch, q_len, hq]).
    max_seq_len 0: the page table's capacity (max_pages * page_size)."""
    plan, ws = gqa_plan(q, k_cache, page_table, out, fn=fn, layout=layout,
                        max_seq_len=max_seq_len, kv_dtype=kv_dtype, lse=lse is not None,
                        sinks=sinks is not None,
                        per_head=k_scales is not None or v_scales is not None, window=window,
                        softcap=softcap, split_mode=split_mode, split_tokens=split_tokens,
                        skip_softmax_factor=skip_softmax_factor)
    # The caller's objects, not imports: GqaPlan.run's fast path takes them directly.
    plan.run(q, k_cache, v_cache, page_table, seq_lens, out, workspace=ws, lse=lse,
             sinks=sinks, k_scale=k_scale, v_scale=v_scale, k_scales=k_scales,
             v_scales=v_scales, softmax_scale=softmax_scale or None, out_scale=out_scale)
    return out


def gqa_fused(q, k_new, v_new, cos_sin_cache, k_cache, v_cache, page_table, seq_lens, out,
              lse=None, *, positions=None, rope_style="neox", fn="gqa_decode", layout="NHD",
              max_seq_len=0, kv_dtype=None, k_scale=1.0, v_scale=1.0, k_scales=None,
              v_scales=None, softmax_scale=0.0, softcap=0.0, window=0, sinks=None,
              out_scale=1.0, split_mode="auto", split_tokens=0, tree_mask=None):
    """The fused decode step (GqaPlan.run_fused's semantics): rotary_dim from cos_sin_cache's
    last dimension, positions [batch, q_len] int32 or None, tree_mask as for gqa_decode."""
    rotary_dim = int(tuple(getattr(cos_sin_cache, "shape", (0, 0)))[-1])
    plan, ws = gqa_plan(q, k_cache, page_table, out, fn=fn, layout=layout,
                        max_seq_len=max_seq_len, kv_dtype=kv_dtype, lse=lse is not None,
                        sinks=sinks is not None,
                        per_head=k_scales is not None or v_scales is not None, window=window,
                        softcap=softcap, split_mode=split_mode, split_tokens=split_tokens,
                        tree_mask=tree_mask is not None, rope_style=rope_style,
                        rotary_dim=rotary_dim)
    plan.run_fused(q, k_new, v_new, cos_sin_cache, k_cache, v_cache, page_table, seq_lens, out,
                   positions=positions, workspace=ws, lse=lse, tree_mask=tree_mask, sinks=sinks,
                   k_scale=k_scale,
                   v_scale=v_scale, k_scales=k_scales, v_scales=v_scales,
                   softmax_scale=softmax_scale or None, out_scale=out_scale)
    return out


def gqa_plan(q, k_cache, page_table, out, *, fn, layout="NHD", max_seq_len=0, kv_dtype=None,
             lse=False, sinks=False, per_head=False, window=0, softcap=0.0, split_mode="auto",
             split_tokens=0, tree_mask=False, skip_softmax_factor=0.0, rope_style="none",
             rotary_dim=0):
    """(GqaPlan, workspace) of a GQA call: looked up by the tensors' metadata and the options,
    derived from the tensors' shapes and dtypes at the first call."""
    options = (layout, max_seq_len, kv_dtype, lse, sinks, per_head, window, softcap, split_mode,
               split_tokens, tree_mask, skip_softmax_factor, rope_style, rotary_dim)
    tensors = (q, k_cache, out, page_table)
    key = call_key(tensors, options) or py_key(tensors, options)  # (_tensors.call_key)
    if key is not None:
        hit = _GQA_CALLS.get(key)
        if hit is not None:
            return hit
    hit = _gqa_plan(q, k_cache, page_table, out, fn, *options)
    if key is not None:
        _GQA_CALLS[key] = hit
    return hit


def _gqa_plan(q, k_cache, page_table, out, fn, layout, max_seq_len, kv_dtype, lse, sinks,
              per_head_kv_scale, window, softcap, split_mode, split_tokens, tree_mask,
              skip_softmax_factor, rope_style, rotary_dim):
    q_shape, q_dtype, device = _meta(q, f"{fn}: q")
    k_shape, k_dtype, _ = _meta(k_cache, f"{fn}: k_cache", kv_dtype or None)
    _, out_dtype, _ = _meta(out, f"{fn}: out")
    expect_rank(fn, "q", _Shape(q_shape, q_dtype), 4, "[batch, q_len, num_q_heads, head_dim]")
    expect_rank(fn, "k_cache", _Shape(k_shape, k_dtype), 4,
                "[num_pages, page_size, num_kv_heads, head_dim]" if layout == "NHD" else
                "[num_pages, num_kv_heads, page_size, head_dim]")
    batch, q_len, hq, d = q_shape
    page_size, hkv = (k_shape[1], k_shape[2]) if layout == "NHD" else (k_shape[2], k_shape[1])
    if not max_seq_len:
        pt_shape = tuple(getattr(page_table, "shape", ()))
        max_seq_len = pt_shape[-1] * page_size if len(pt_shape) == 2 else 1
    values = dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=page_size,
                  max_seq_len=max(int(max_seq_len), 1), layout=layout, q_dtype=q_dtype,
                  kv_dtype=k_dtype, out_dtype=out_dtype, max_batch=max(batch, 1),
                  max_q_len=q_len, tree_mask=bool(tree_mask), sinks=sinks, lse=lse,
                  per_head_kv_scale=per_head_kv_scale, window=int(window),
                  softcap=float(softcap), beam_width=1, split_mode=split_mode,
                  split_tokens=int(split_tokens), checked=_C.checked_by_default(),
                  skip_softmax_factor=float(skip_softmax_factor), rope_style=rope_style,
                  rotary_dim=int(rotary_dim), device=device)
    return _plan_cache.plan(GqaPlan, GQA_KEYS, tuple(values[k] for k in GQA_KEYS), q, None, fn)


_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                 "float8_e4m3fn": "fp8_e4m3", "int8": "int8", "uint8": "uint8",
                 "int32": "int32"}


class _Shape:
    """What expect_rank reads of a tensor."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _meta(x, where, dtype=None):
    """(shape, deca dtype name, device text) of x. torch tensors are read through their own
    attributes (DLPack export costs microseconds a tensor); anything else, or a torch dtype
    deca has no name for, through deca's import, which raises the message naming `where`."""
    if torch_of(x) is not None:
        name = _TORCH_DTYPES.get(str(x.dtype)[6:])
        if name is not None:
            if dtype is not None and dtype != name and not (dtype == "fp8_e4m3" and
                                                            name == "uint8"):
                tensor(x, where, dtype)  # raises the dtype mismatch by name
            dev = x.device
            return (tuple(x.shape), dtype or name,
                    "cpu" if dev.type == "cpu" else f"cuda:{dev.index or 0}")
    t = tensor(x, where, dtype)
    return t.shape, t.dtype, _plan_cache.device_text(t)


def mla_sparse(q, kv_cache, indices, out, lse=None, *, fn="mla_decode_sparse",
               topk_length=None, attn_sink=None, softmax_scale=0.0, schedule=None,
               extra_kv_cache=None, extra_indices=None, extra_topk_length=None,
               lse_of_empty_row="-inf"):
    """Sparse FP8 MLA decode of q [batch, q_len, heads, 576] into out [.., 512] (and lse); a
    584-byte cache is MODEL1's (q [.., 512]), with the optional second cache (extra_*).
    lse_of_empty_row: MlaPlan's ("+inf": FlashMLA's convention, written by the kernels).

    `schedule` (a StepSchedule): on CUDA the run uses the holder's workspace, schedules on the
    holder's first call with this shape and reuses that schedule after (the other layers of a
    decode step)."""
    plan, ws = mla_sparse_plan(q, kv_cache, indices, fn=fn, lse=lse is not None,
                               attn_sink=attn_sink is not None,
                               topk_length=topk_length is not None,
                               extra=(extra_kv_cache, extra_indices, extra_topk_length),
                               lse_of_empty_row=lse_of_empty_row)
    reuse = False
    if schedule is not None and ws is not None:  # no workspace: the CPU, nothing to schedule
        ws, reuse = schedule.workspace_for(plan, q, None, fn)
    # The caller's objects, not imports: MlaPlan.run_sparse's fast path takes them directly.
    plan.run_sparse(q, kv_cache, indices, out, topk_length=topk_length, attn_sink=attn_sink,
                    lse=lse, softmax_scale=softmax_scale or None, workspace=ws,
                    reuse_schedule=reuse, extra_kv_cache=extra_kv_cache,
                    extra_indices=extra_indices, extra_topk_length=extra_topk_length)
    if schedule is not None:
        schedule.scheduled(plan)
    return out


def mla_sparse_plan(q, kv_cache, indices, *, fn, lse, attn_sink, topk_length,
                    extra=(None, None, None), lse_of_empty_row="-inf"):
    """(MlaPlan, workspace) of a sparse MLA call, as gqa_plan; extra: (extra_kv_cache,
    extra_indices, extra_topk_length), MODEL1's second cache."""
    tensors = (q, kv_cache, indices) + tuple(extra)
    values = (lse, attn_sink, topk_length, lse_of_empty_row)
    key = call_key(tensors, values) or py_key(tensors, values)  # as gqa_plan's
    if key is not None:
        hit = _MLA_CALLS.get(key)
        if hit is not None:
            return hit
    qt = tensor(q, f"{fn}: q")
    kvt = tensor(kv_cache, f"{fn}: kv_cache")
    it = tensor(indices, f"{fn}: indices")
    expect_rank(fn, "q", qt, 4, "[batch, q_len, num_heads, 576 | 512]")
    expect_rank(fn, "kv_cache", kvt, 4, "[num_blocks, page_size, 1, 656 | 584]")
    expect_rank(fn, "indices", it, 3, "[batch, q_len, topk]")
    extra_topk, extra_page_size, extra_topk_length = extra_config(fn, *extra)
    config = dict(num_heads=qt.shape[2], sparse=True, page_size=kvt.shape[1],
                  max_batch=max(qt.shape[0], 1), max_q_len=qt.shape[1],
                  max_seq_len=max(min(kvt.shape[0] * kvt.shape[1], 2 ** 31 - 1), 1),
                  topk=it.shape[2], lse=lse, attn_sink=attn_sink, topk_length=topk_length,
                  kv_format=sparse_kv_format(kvt), extra_topk=extra_topk,
                  extra_page_size=extra_page_size, extra_topk_length=extra_topk_length,
                  checked=None, device=_plan_cache.device_text(qt),
                  lse_of_empty_row=lse_of_empty_row)
    hit = _plan_cache.plan(MlaPlan, MLA_KEYS, tuple(config[k] for k in MLA_KEYS), q, qt, fn)
    if key is not None:
        _MLA_CALLS[key] = hit
    return hit


class StepSchedule:
    """A decode step's MLA sparse schedule (what FlashMLA's tile-scheduler metadata holds): a
    workspace of its own, scheduled by the first call made with it and reused by the later ones,
    whose batch, q_len, topk and topk_length contents must be the first's (the layers of one
    step; a schedule of another shape computes nothing: NaN out). A call with another plan
    (another shape) gets a workspace of that plan's size and schedules again."""

    def __init__(self):
        self._plan = None
        self._ws = None
        self._done = False

    def workspace_for(self, plan, like, like_t, where):
        """(workspace, reuse_schedule) for a run of `plan`; like_t (like imported) is needed only
        to allocate, and made here when None."""
        if self._plan is not plan:
            from ._tensors import zeros_bytes
            self._plan, self._done = plan, False
            if like_t is None:
                like_t = tensor(like, f"{where}: q")
            self._ws = zeros_bytes(like, like_t, plan.workspace_bytes, f"{where}: workspace")
        return self._ws, self._done

    def scheduled(self, plan):
        """Marks the workspace as holding a schedule of `plan` (after a run that made one)."""
        if self._plan is plan:
            self._done = True


def mla_dense(q, kv_cache, block_table, cache_seqlens, out, lse=None, *,
              fn="mla_decode_dense", softmax_scale=0.0, kv_scale=1.0, kv_format=None,
              schedule=None, lse_of_empty_row="-inf"):
    """Dense MLA decode of q [batch, q_len, heads, 576] into out [.., 512] (and lse).

    kv_format (None: from kv_cache's dtype; "fp8_e4m3" for uint8 bits of e4m3 values) as
    deca.mla_decode_dense; `schedule` (a StepSchedule) as mla_sparse's."""
    plan, ws = mla_dense_plan(q, kv_cache, block_table, fn=fn, lse=lse is not None,
                              kv_format=kv_format, lse_of_empty_row=lse_of_empty_row)
    reuse = False
    if schedule is not None and ws is not None:  # as in mla_sparse
        ws, reuse = schedule.workspace_for(plan, q, None, fn)
    plan.run_dense(q, kv_cache, block_table, cache_seqlens, out, lse=lse,
                   softmax_scale=softmax_scale or None, kv_scale=kv_scale, workspace=ws,
                   reuse_schedule=reuse)
    if schedule is not None:
        schedule.scheduled(plan)
    return out


def mla_dense_plan(q, kv_cache, block_table, *, fn, lse, kv_format=None, lse_of_empty_row="-inf"):
    """(MlaPlan, workspace) of a dense MLA call, as gqa_plan; kv_format as mla_dense's."""
    tensors = (q, kv_cache, block_table)
    values = ("dense", lse, kv_format, lse_of_empty_row)
    key = call_key(tensors, values) or py_key(tensors, values)  # as gqa_plan's
    if key is not None:
        hit = _MLA_CALLS.get(key)
        if hit is not None:
            return hit
    qt = tensor(q, f"{fn}: q")
    kvt = tensor(kv_cache, f"{fn}: kv_cache", "fp8_e4m3" if kv_format == "fp8_e4m3" else None)
    btt = tensor(block_table, f"{fn}: block_table")
    expect_rank(fn, "q", qt, 4, "[batch, q_len, num_heads, 576]")
    expect_rank(fn, "kv_cache", kvt, 4, "[num_blocks, page_size, 1, 576 | 656]")
    expect_rank(fn, "block_table", btt, 2, "[batch, max_blocks]")
    config = dict(num_heads=qt.shape[2], sparse=False,
                  kv_format=kv_format or dense_kv_format(kvt), page_size=kvt.shape[1],
                  max_batch=max(qt.shape[0], 1), max_q_len=qt.shape[1],
                  max_seq_len=max(min(btt.shape[1] * kvt.shape[1], 2 ** 31 - 1), 1), topk=0,
                  lse=lse, attn_sink=False, topk_length=False, checked=None,
                  device=_plan_cache.device_text(qt), lse_of_empty_row=lse_of_empty_row)
    config.update(zip(("extra_topk", "extra_page_size", "extra_topk_length"), NO_EXTRA))
    hit = _plan_cache.plan(MlaPlan, MLA_KEYS, tuple(config[k] for k in MLA_KEYS), q, qt, fn)
    if key is not None:
        _MLA_CALLS[key] = hit
    return hit


__all__ = ["gqa", "gqa_plan", "mla_sparse", "mla_sparse_plan", "mla_dense", "mla_dense_plan",
           "StepSchedule", "Error"]
