"""The compat calls' prepared path: a repeated call of a shape (flash_attn_with_kvcache's and
flash_mla_with_kvcache's run(checked=False)) on values that change between calls -- new q, new
cache contents, new page tables, indices and lengths, the same shapes -- writes what a fresh,
checked call of those values writes, bit for bit, in numpy and (where installed) torch; and
FlashMLA's metadata is the decode step's schedule: made by the step's first call, reused by its
later ones."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase, to_cuda
from deca import _cached_ops
from deca._tensors import FALLBACKS
from deca.compat import flash_attn, flash_mla, get_mla_metadata
from test_mla import _sparse_case
from test_mla_model1 import model1_case

try:
    import torch
except ImportError:
    torch = None

LIBS = ["numpy"] + (["torch"] if torch is not None else [])
DEV = "cuda:0" if torch is not None and torch.cuda.is_available() else "cpu"


def lib_of(lib):
    """numpy arrays as they are, or as torch tensors on DEV with the same dtype, bits and
    strides (None stays None)."""
    if lib == "numpy":
        return lambda a: a

    def conv(a):
        if a is None or a.flags.c_contiguous:
            return to_cuda(a, DEV)
        t = torch.from_numpy(a)  # a strided byte view (MODEL1's padded pages): strides kept
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=DEV).copy_(t)
    return conv


def _bytes(x):
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).view(np.uint8)
    return x.contiguous().view(torch.uint8).cpu().numpy()


def same_results(got, want):
    """Two results (a tensor or a tuple of them): same shapes, dtypes, strides and bits."""
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
        assert (a.strides if isinstance(a, np.ndarray) else a.stride()) == \
            (b.strides if isinstance(b, np.ndarray) else b.stride())
        np.testing.assert_array_equal(_bytes(a), _bytes(b))


def prepared_matches_fresh(module, call, first, second):
    """call(first) prepares the shape; call(second) -- the prepared path, with no fallback --
    must give what a fresh checked call(second) gives (module's prepared calls hidden)."""
    call(first)
    before, shapes = sum(FALLBACKS.values()), len(module._PREPARED)
    got = call(second)
    assert sum(FALLBACKS.values()) == before and len(module._PREPARED) == shapes
    saved, module._PREPARED = module._PREPARED, {}
    try:
        want = call(second)
    finally:
        module._PREPARED = saved
    same_results(got, want)
    return got


# --- flash_attn_with_kvcache -------------------------------------------------------------------

FA_CONFIGS = {
    "one token": dict(q_len=1),
    "one token, lse": dict(q_len=1, lse=True),
    "causal, short request": dict(q_len=3, lse=True),
    "non-causal (tree mask)": dict(q_len=3, lse=True, causal=False),
    "fp8 cache, float descales": dict(q_len=1, lse=True, kv="fp8_e4m3", descale="float"),
    "fp8 cache, per-request descales": dict(q_len=2, lse=True, kv="fp8_e4m3",
                                            descale="rows"),
    "fp8 q": dict(q_len=1, lse=True, kv="fp8_e4m3", q8=True, descale="float"),
    "fp8 q, no descale": dict(q_len=1, kv="fp8_e4m3", q8=True),
    "int8 cache, no descale": dict(q_len=1, kv="int8"),
}


def _fa_values(seed, cfg, lens):
    """The call's arguments on new values: q, cache contents, page table, lengths `lens` (at
    most the pool's [40, 20, 17, 33], so that only owned slots are read) and descales."""
    rng = np.random.default_rng(seed)
    kv = cfg.get("kv", "bf16")
    scale = 1.0 if kv == "bf16" else 0.05
    case = PagedCase(rng, seq_lens=[40, 20, 17, 33], q_len=cfg["q_len"], hq=6, hkv=3, d=64,
                     page=8, kv_dtype=kv, k_scale=scale, v_scale=scale)
    q = case.q
    if cfg.get("q8"):
        q = (rng.standard_normal(q.shape) * 8).astype(ref.FP8)
    descales = {}
    if cfg.get("descale") == "float":
        descales = dict(k_descale=0.05, v_descale=0.07, q_descale=0.5 if cfg.get("q8") else None)
    elif cfg.get("descale") == "rows":  # rows that differ per request: one request at a time
        descales = {n: rng.uniform(0.02, 0.1, (4, 3)).astype(np.float32)
                    for n in ("k_descale", "v_descale")}
    return q, case.k, case.v, case.page_table, np.asarray(lens, np.int32), descales


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", list(FA_CONFIGS))
def test_flash_attn_prepared_call_on_new_values_matches_a_fresh_call(lib, name):
    cfg = FA_CONFIGS[name]
    conv = lib_of(lib)
    causal = cfg.get("causal", True)
    # New lengths on the second call: an empty request, one short of seqlen_q where a causal
    # call may have it (its first queries see no key), a page +- 1.
    short = cfg["q_len"] - 1 if causal and cfg["q_len"] > 1 else cfg["q_len"]
    lens = ([40, 20, 17, 33], [0, max(short, 1), 9, 32])

    def call(values):
        q, k, v, table, seq_lens, descales = values
        scales = {n: (conv(s) if isinstance(s, np.ndarray) else s) for n, s in descales.items()}
        return flash_attn.flash_attn_with_kvcache(
            conv(q), conv(k), conv(v), cache_seqlens=conv(seq_lens), block_table=conv(table),
            causal=causal, return_softmax_lse=cfg.get("lse", False), **scales)

    prepared_matches_fresh(flash_attn, call, _fa_values(1, cfg, lens[0]),
                           _fa_values(2, cfg, lens[1]))


@pytest.mark.parametrize("lib", LIBS)
def test_flash_attn_multi_token_per_request_descales_return_the_lse(lib):
    """Descale rows that differ per request run one request at a time; with seqlen_q > 1 each
    request's LSE rows are its own call's (as deca.gqa_decode with its rows as per-head
    scales), on the first call and on the prepared one."""
    conv = lib_of(lib)
    cfg = FA_CONFIGS["fp8 cache, per-request descales"]
    for seed in (3, 4):
        q, k, v, table, lens, d = _fa_values(seed, cfg, [40, 2, 17, 33])
        out, lse = flash_attn.flash_attn_with_kvcache(
            conv(q), conv(k), conv(v), cache_seqlens=conv(lens), block_table=conv(table),
            causal=True, return_softmax_lse=True, k_descale=conv(d["k_descale"]),
            v_descale=conv(d["v_descale"]))
        for b in range(4):
            r = slice(b, b + 1)
            want, want_lse = deca.gqa_decode(
                conv(q[r]), conv(k), conv(v), conv(table[r]), conv(lens[r]),
                k_scales=conv(d["k_descale"][b]), v_scales=conv(d["v_descale"][b]),
                return_lse=True)
            same_results(out[r], want)
            same_results(lse[r], want_lse.swapaxes(1, 2).copy() if lib == "numpy" else
                         want_lse.transpose(1, 2).contiguous())


# --- flash_mla_with_kvcache --------------------------------------------------------------------

MLA_CONFIGS = {
    "one token": dict(q_len=1),
    "one token, lengths and sink": dict(q_len=1, lengths=True, sink=True),
    "two tokens, lengths, fp8 view": dict(q_len=2, lengths=True, fp8_view=True),
    "MODEL1, two caches": dict(q_len=1, model1=True),
    "MODEL1, two tokens": dict(q_len=2, model1=True),
}


def _mla_values(seed, cfg):
    """(q, k_cache, indices, keywords) on new values of one shape: batch 3, 5 heads, topk 64;
    MODEL1: a second cache (topk 16 over pages of 2) and ragged lengths in both."""
    rng = np.random.default_rng(seed)
    if cfg.get("model1"):
        q, kv, idx, lengths, second, sink = model1_case(
            rng, batch=3, q_len=cfg["q_len"], heads=5, extra=(2, 30, 16), ragged=True,
            sink=True)
        return q, kv, idx, dict(topk_length=lengths, attn_sink=sink, extra_k_cache=second[0],
                                extra_indices_in_kvcache=second[1],
                                extra_topk_length=second[2])
    q, kv, idx = _sparse_case(rng, 3, cfg["q_len"], 5, 64, 16, num_blocks=6)
    kw = {}
    if cfg.get("lengths"):
        kw["topk_length"] = rng.integers(0, 65, 3).astype(np.int32)
    if cfg.get("sink"):
        kw["attn_sink"] = rng.normal(0.0, 1.5, 5).astype(np.float32)
    if cfg.get("fp8_view"):
        kv = kv.view(ref.FP8)  # FlashMLA's float8_e4m3fn bytes
    return q, kv, idx, kw


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("name", list(MLA_CONFIGS))
def test_flash_mla_prepared_call_on_new_values_matches_a_fresh_call(lib, name):
    """Each call is a decode step of its own (new metadata: new lengths get a new schedule)."""
    conv = lib_of(lib)

    def call(values):
        q, kv, idx, kw = values
        meta, splits = get_mla_metadata()
        return flash_mla.flash_mla_with_kvcache(
            conv(q), conv(kv), None, None, 512, meta, splits, is_fp8_kvcache=True,
            indices=conv(idx), **{n: None if a is None else conv(a) for n, a in kw.items()})

    cfg = MLA_CONFIGS[name]
    prepared_matches_fresh(flash_mla, call, _mla_values(5, cfg), _mla_values(6, cfg))


class _Recorder(_cached_ops.StepSchedule):
    """A step's schedule that records each run's answer from workspace_for (a run that
    schedules, or one that reuses the schedule) and each scheduled() mark."""

    def __init__(self):
        super().__init__()
        self.log = []

    def workspace_for(self, plan, like, like_t, where):
        ws, reuse = super().workspace_for(plan, like, like_t, where)
        self.log.append("reuse" if reuse else "schedule")
        return ws, reuse

    def scheduled(self, plan):
        self.log.append("mark")
        super().scheduled(plan)


@pytest.mark.parametrize("lib", LIBS)
def test_flash_mla_metadata_is_the_steps_schedule(monkeypatch, lib):
    """FlashMLA's metadata serves one decode step: its first call schedules and marks the
    schedule, the step's later calls (other layers: new q, cache and indices; even other
    lengths, which the step's layers share by FlashMLA's contract and deca cannot read on the
    host) reuse it unmarked again, a call of another shape schedules in a workspace of its own,
    after which the first shape schedules again; a call that raised leaves the schedule unmarked.
    The reused layer writes a fresh call's bits. (A CPU plan has no workspace and so no
    schedule: here it is given a stand-in, which the CPU backend ignores.)"""
    conv = lib_of(lib)
    real = _cached_ops.mla_sparse_plan

    def with_workspace(*a, **kw):
        plan, ws = real(*a, **kw)
        return plan, ws if ws is not None else np.zeros(1, np.uint8)

    monkeypatch.setattr(_cached_ops, "mla_sparse_plan", with_workspace)
    monkeypatch.setattr(flash_mla, "_PREPARED", {})
    lengths = np.array([64, 7, 0], np.int32)

    def layer(seed, meta, topk=64, lens=lengths):
        q, kv, idx = _sparse_case(np.random.default_rng(seed), 3, 1, 5, topk, 16, num_blocks=6)
        args = (conv(q), conv(kv), None, None, 512, meta, None)
        kw = dict(is_fp8_kvcache=True, indices=conv(idx), topk_length=conv(lens))
        return lambda: flash_mla.flash_mla_with_kvcache(*args, **kw)

    meta, _ = get_mla_metadata()
    rec = meta._schedule = _Recorder()
    layer(1, meta)()
    got = layer(2, meta)()  # the step's next layer
    same_results(got, layer(2, None)())
    layer(3, meta, lens=np.array([5, 64, 1], np.int32))()
    assert rec.log == ["schedule", "mark", "reuse", "reuse"]
    rec.log.clear()
    layer(4, meta, topk=128, lens=np.array([128, 0, 3], np.int32))()  # another shape
    layer(5, meta)()
    layer(6, meta)()
    assert rec.log == ["schedule", "mark", "schedule", "mark", "reuse"]

    meta, _ = get_mla_metadata()
    rec = meta._schedule = _Recorder()
    bad = lengths.astype(np.int64)
    q, kv, idx = _sparse_case(np.random.default_rng(7), 3, 1, 5, 64, 16, num_blocks=6)
    with pytest.raises(deca.Error, match="topk_length: expected .*int32"):
        flash_mla.flash_mla_with_kvcache(conv(q), conv(kv), None, None, 512, meta, None,
                                         is_fp8_kvcache=True, indices=conv(idx),
                                         topk_length=conv(bad))
    layer(8, meta)()
    layer(9, meta)()
    assert rec.log == ["schedule", "schedule", "mark", "reuse"]
