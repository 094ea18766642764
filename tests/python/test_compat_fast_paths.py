"""The compat calls' per-call fast paths with torch tensors (on CUDA when a GPU is present, else on
the CPU backend): a repeated call of a shape (FlashInfer's run(), flash_attn_with_kvcache with its
LSE, flash_mla_with_kvcache) writes what its first, checked call wrote, bit for bit, in outputs
shaped, strided and typed as torch.empty makes them, without a fallback; and a wrong argument on
a repeated call raises what the first call of that shape raises."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import deca  # noqa: E402
import deca.compat as compat  # noqa: E402
import numpy_reference as ref  # noqa: E402
from cases import PagedCase, csr_pages  # noqa: E402
from deca._tensors import FALLBACKS  # noqa: E402
from test_compat_torch import DEV, T, same_bits  # noqa: E402


def like_torch_empty(x):
    """x is laid out as torch.empty(x.shape, dtype=x.dtype) would lay it out, on DEV."""
    assert x.stride() == torch.empty(x.shape, dtype=x.dtype).stride()
    assert str(x.device) == str(torch.device(DEV)) and not x.requires_grad


def repeats_match_first(call, pair):
    """Calls call() three times: the repeats (the fast path) write the first call's bits into
    outputs laid out as torch.empty's (given ones aside), and none falls back. pair: call
    returns (out, lse). Returns the last result."""
    first = call()
    before = sum(FALLBACKS.values())
    for _ in range(2):
        again = call()
        for a, b in zip(first if pair else (first,), again if pair else (again,)):
            same_bits(a, b)
            like_torch_empty(b)
    assert sum(FALLBACKS.values()) == before
    return again


def _wrapper(rng, layout):
    case = PagedCase(rng, seq_lens=[40, 1, 0, 16], hq=8, hkv=2, d=64, page=16, layout=layout)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8, device=DEV),
                                                  layout)
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16, q_data_type=torch.bfloat16)
    return w, case


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("given_out", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_flashinfer_repeated_run_writes_the_first_runs_bits(rng, layout, combined, given_out,
                                                           return_lse):
    w, case = _wrapper(rng, layout)
    q = T(case.q)[:, 0]
    cache = torch.stack([T(case.k), T(case.v)], dim=1) if combined else (T(case.k), T(case.v))
    scales = dict(q_scale=0.75, k_scale=2.0, v_scale=0.5)

    def call():
        out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV) if given_out else None
        got = w.run(q, cache, out=out, return_lse=return_lse, **scales)
        o = got[0] if return_lse else got
        assert out is None or o is out
        return got

    repeats_match_first(call, return_lse)
    assert len(w._fast) == 1
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16, q_data_type=torch.bfloat16)
    assert not w._fast  # a new plan() checks its runs again


def _message(fn, *a, **kw):
    with pytest.raises(deca.Error) as info:
        fn(*a, **kw)
    return str(info.value)


@pytest.mark.parametrize("combined", [False, True])
def test_flashinfer_repeated_run_refuses_what_the_first_refuses(rng, combined):
    """A wrong scale on a repeated call (the fast path's C++ call refuses it, the checked run
    names it) raises the message a first call with that scale raises; so do a wrong out and
    another q dtype (other call shapes, checked on their first call)."""
    warm, case = _wrapper(rng, "NHD")
    q = T(case.q)[:, 0]
    cache = torch.stack([T(case.k), T(case.v)], dim=1) if combined else (T(case.k), T(case.v))
    warm.run(q, cache)
    bad_out = torch.empty(q.shape[0], 1, *q.shape[1:], dtype=q.dtype, device=DEV)
    for bad in (dict(k_scale=float("nan")), dict(v_scale=float("inf")), dict(out=bad_out)):
        cold, _ = _wrapper(np.random.default_rng(0), "NHD")
        want = _message(cold.run, q, cache, **bad)
        assert _message(warm.run, q, cache, **bad) == want
        assert want.startswith("BatchDecodeWithPagedKVCacheWrapper.run: ")
    assert "expected" in _message(warm.run, q.half(), cache)
    same_bits(warm.run(q, cache), warm.run(q, cache))


@pytest.mark.parametrize("return_lse", [False, True])
def test_flash_attn_repeated_call_writes_the_first_calls_bits(rng, return_lse):
    case = PagedCase(rng, seq_lens=[70, 3, 33], hq=8, hkv=2, d=64, page=16)
    q, k, v, lens, table = (T(x) for x in (case.q, case.k, case.v, case.seq_lens,
                                           case.page_table))

    def call(**kw):
        return compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              causal=True, return_softmax_lse=return_lse, **kw)

    again = repeats_match_first(call, return_lse)
    want, want_lse = deca.gqa_decode(q, k, v, table, lens, return_lse=True)
    same_bits(again[0] if return_lse else again, want)
    if return_lse:
        same_bits(again[1], want_lse.transpose(1, 2))
    # A repeated shape with int64 lengths: the fast call refuses, the checked one names them.
    msg = _message(compat.flash_attn_with_kvcache, q, k, v, cache_seqlens=lens.long(),
                   block_table=table, causal=True, return_softmax_lse=return_lse)
    assert msg.startswith("flash_attn_with_kvcache: cache_seqlens: expected torch.int32")


def test_flash_mla_repeated_call_outputs_are_torch_empty_like(rng):
    from test_compat_torch import flash_mla_lse
    from test_mla import _sparse_case
    q, kv, indices = _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6)
    want, want_lse = deca.mla_decode_sparse(T(q), T(kv), T(indices), return_lse=True)
    before = sum(FALLBACKS.values())
    for _ in range(3):
        out, lse = compat.flash_mla_with_kvcache(T(q), T(kv), None, None, 512, None, None,
                                                 is_fp8_kvcache=True, indices=T(indices))
        same_bits(out, want)
        same_bits(lse, flash_mla_lse(want_lse))
        like_torch_empty(out)
        like_torch_empty(lse)
    assert sum(FALLBACKS.values()) == before


def _strided(x, rng):
    """x itself, or the same values in a view that is not contiguous (every other head of a
    tensor with twice the heads; the last dim stays contiguous, as deca requires), at random."""
    if rng.random() < 0.5:
        return x
    wide = torch.full((x.shape[0], 2 * x.shape[1], *x.shape[2:]), float("nan"), dtype=x.dtype,
                      device=x.device)
    wide[:, ::2] = x
    return wide[:, ::2]


@pytest.mark.parametrize("seed", range(12))
def test_flashinfer_fast_run_on_new_data_matches_a_fresh_wrapper(seed):
    """Random configurations (odd head counts, groups 1..5, pages of 1..32 tokens, ragged and
    empty requests, both layouts, pair or combined cache, strided q): after a first run, a run
    of the same shape on new q and cache values (the fast path) writes what a fresh wrapper's
    first, checked run writes on those values, bit for bit."""
    rng = np.random.default_rng(1000 + seed)
    hkv = int(rng.choice([1, 2, 3]))
    hq = hkv * int(rng.integers(1, 6))
    d = int(rng.choice([64, 128]))
    page = int(rng.choice([1, 5, 16, 32]))
    layout = str(rng.choice(["NHD", "HND"]))
    combined = bool(rng.integers(2))
    lens = [int(n) for n in rng.integers(0, 70, int(rng.integers(1, 5)))]
    lse = bool(rng.integers(2))
    first = PagedCase(rng, seq_lens=lens, hq=hq, hkv=hkv, d=d, page=page, layout=layout)
    second = PagedCase(np.random.default_rng(2000 + seed), seq_lens=lens, hq=hq, hkv=hkv, d=d,
                       page=page, layout=layout)

    def wrapper():
        w = compat.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(16, dtype=torch.uint8, device=DEV), layout)
        # the second case's page table: both cases' caches are read through it, the first
        # case's pool being as large (same lengths, same page count)
        w.plan(*csr_pages(second, page), hq, hkv, d, page, q_data_type=torch.bfloat16)
        return w

    def args(case):
        q = _strided(T(case.q)[:, 0], rng)
        k, v = T(case.k), T(case.v)
        return q, (torch.stack([k, v], dim=1) if combined else (k, v))

    warm = wrapper()
    before = sum(FALLBACKS.values())
    warm.run(*args(first), return_lse=lse)
    got = warm.run(*args(second), return_lse=lse)
    assert len(warm._fast) == 1 and sum(FALLBACKS.values()) == before
    want = wrapper().run(*args(second), return_lse=lse)
    for a, b in zip(got if lse else (got,), want if lse else (want,)):
        same_bits(a, b)


@pytest.mark.parametrize("seed", range(8))
def test_flash_attn_fast_call_on_new_data_matches_gqa_decode(seed):
    """Random one-token configurations (odd head counts, ragged and empty requests, both KV
    layouts' NHD form, strided q, with and without LSE): a repeated call of a shape on new values
    (the fast path) writes deca.gqa_decode's bits for those values."""
    rng = np.random.default_rng(3000 + seed)
    hkv = int(rng.choice([1, 2, 3]))
    hq = hkv * int(rng.integers(1, 6))
    d = int(rng.choice([64, 128]))
    page = int(rng.choice([1, 8, 16]))
    lens = [int(n) for n in rng.integers(0, 60, int(rng.integers(1, 5)))]
    return_lse = bool(rng.integers(2))
    cases = [PagedCase(np.random.default_rng(4000 + 2 * seed + i), seq_lens=lens, hq=hq,
                       hkv=hkv, d=d, page=page) for i in range(2)]
    before = sum(FALLBACKS.values())
    for i, case in enumerate(cases):
        q, k, v, lens_t, table = (T(x) for x in (case.q, case.k, case.v, case.seq_lens,
                                                 case.page_table))
        q = _strided(q[:, 0], rng)[:, None]
        got = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens_t, block_table=table,
                                             causal=True, return_softmax_lse=return_lse)
        if i == 0:
            continue  # the first call of the shape: the checked path
        want, want_lse = deca.gqa_decode(q.contiguous(), k, v, table, lens_t, return_lse=True)
        same_bits(got[0] if return_lse else got, want)
        if return_lse:
            same_bits(got[1], want_lse.transpose(1, 2))
    assert sum(FALLBACKS.values()) == before


@pytest.mark.parametrize("seed", range(6))
def test_flash_mla_fast_call_on_new_data_matches_mla_decode_sparse(seed):
    """Random sparse calls (batch 1..3, head counts 1..20, topk 16..80 with -1 entries and
    duplicates, a strided cache view at random): after a first call of the shape, a call on new
    q, cache and indices (the fast path, one metadata object for the step as engines pass it)
    writes deca.mla_decode_sparse's bits for those values, LSE in FlashMLA's convention."""
    from test_compat_torch import flash_mla_lse
    from test_mla import _sparse_case, strided_kv
    rng = np.random.default_rng(5000 + seed)
    batch, heads = int(rng.integers(1, 4)), int(rng.integers(1, 21))
    topk, page = int(rng.choice([16, 48, 80])), int(rng.choice([16, 64]))
    meta, _ = compat.get_mla_metadata()
    before = sum(FALLBACKS.values())
    for i in range(2):
        q, kv, indices = _sparse_case(np.random.default_rng(6000 + 2 * seed + i), batch, 1,
                                      heads, topk, page, num_blocks=4)
        qt, kvt, it = T(q), T(kv), T(indices)
        if rng.integers(2):  # the same records in a view of a larger, poisoned allocation
            layout = str(rng.choice(["layer", "slot"]))
            big = T(strided_kv(kv, layout)[0])
            kvt = big[:, 1] if layout == "layer" else big[:, :, 1:2]
            assert not kvt.is_contiguous()
        out, lse = compat.flash_mla_with_kvcache(qt, kvt, None, None, 512,
                                                 meta if i else None, None,
                                                 is_fp8_kvcache=True, indices=it)
        if i == 0:
            continue
        want, want_lse = deca.mla_decode_sparse(qt, kvt, it, return_lse=True)
        same_bits(out, want)
        same_bits(lse, flash_mla_lse(want_lse))
    assert sum(FALLBACKS.values()) == before
