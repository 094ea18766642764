"""Skip-softmax (skip_softmax_factor, docs/semantics.md "Skip-softmax") from Python: the CPU
backend against the numpy reference's own reading of the rule on peaked data (tiles do drop),
factor 0 exact, the error bound on every backend, the keyword's checks, and on CUDA the "_skip"
kernel within the bound of exact attention (torch tensors; skipped without them)."""

import math

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase, close, close_lse, store, tree_mask


def peak(case, rng, hq, hkv, heavy=6, gap=12.0):
    """Peaked data (a bf16 NHD case): per (request, kv head) a unit direction u; q rows of the
    group get sqrt(d) u added and `heavy` keys (the first 3 and some at random) gap u: their
    logits sit ~gap above the rest."""
    batch, q_len, _, d = case.q.shape
    page = case.k.shape[1]
    q64, k64 = case.q64.copy(), case.k64.copy()
    for b, n in enumerate(case.seq_lens):
        for kvh in range(hkv):
            u = rng.standard_normal(d)
            u /= np.linalg.norm(u)
            heads = slice(kvh * hq // hkv, (kvh + 1) * hq // hkv)
            q64[b, :, heads, :] += math.sqrt(d) * u
            for t in set(list(range(min(3, n))) + list(rng.integers(0, n, heavy - 3))):
                pg, slot = case.page_table[b, t // page], t % page
                k64[pg, slot, kvh, :] += gap * u
    case.q, case.q64 = store(q64, "bf16")
    case.k, case.k64 = store(k64, "bf16")
    return case


def run(case, **kw):
    return deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                           return_lse=True, **kw)


@pytest.mark.parametrize("factor", [0.5, 5.0])
def test_cpu_matches_numpy_rule(rng, factor):
    case = peak(PagedCase(rng, seq_lens=[700, 130, 1], hq=6, hkv=2, d=64, page=16), rng, 6, 2)
    out, lse = run(case, skip_softmax_factor=factor)
    want, want_lse = case.reference(skip_softmax_factor=factor)
    exact, _ = case.reference()
    assert np.abs(want - exact).max() > 1e-4  # the rule drops tiles of this data
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_features_compose_on_cpu(rng):
    case = peak(PagedCase(rng, seq_lens=[500, 64, 300], q_len=4, hq=8, hkv=2, d=64, page=16),
                rng, 8, 2)
    kw = dict(tree_mask=tree_mask(rng, 3, 4), sinks=rng.normal(0.0, 2.0, 8).astype(np.float32),
              softcap=25.0, window=200)
    out, lse = run(case, skip_softmax_factor=2.0, **kw)
    want, want_lse = case.reference(skip_softmax_factor=2.0, **kw)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_zero_factor_is_exact(rng):
    case = PagedCase(rng, seq_lens=[300, 17], hq=4, hkv=2, d=64, page=16)
    out, lse = run(case)
    out0, lse0 = run(case, skip_softmax_factor=0.0)
    assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(out0).view(np.uint16))
    assert np.array_equal(lse, lse0)
    plan = deca.GqaPlan(4, 2, 64, 16, max_seq_len=512, skip_softmax_factor=0.0)
    assert plan.config.skip_softmax_factor == 0.0


def within_bound(out, lse, exact, exact_lse, v_spread, factor, rel_tol):
    """docs/semantics.md's bound: each element within f / (1 + f) of its spread, LSE lower by
    less than log(1 + f)."""
    got = np.asarray(out, np.float64)
    row_max = np.abs(exact).max(axis=-1, keepdims=True)
    assert (np.abs(got - exact) <= factor / (1 + factor) * v_spread + rel_tol * row_max).all()
    drop = exact_lse - np.asarray(lse, np.float64)
    fin = np.isfinite(exact_lse)
    assert (drop[fin] >= -1e-4).all() and (drop[fin] <= math.log1p(factor) + 1e-4).all()


def spread(case, hq, hkv):
    """[batch, 1, hq, d]: each V element's range over the request's keys."""
    out = []
    page = case.v.shape[1]
    for b, n in enumerate(case.seq_lens):
        t = np.arange(n)
        rows = case.v64[case.page_table[b, t // page], t % page]  # [n, hkv, d]
        r = rows.max(axis=0) - rows.min(axis=0)
        out.append(np.repeat(r, hq // hkv, axis=0)[None])
    return np.stack(out)


@pytest.mark.parametrize("factor", [0.1, 1.0, 10.0])
def test_cpu_within_the_bound(rng, factor):
    case = peak(PagedCase(rng, seq_lens=[900, 40], hq=4, hkv=2, d=64, page=16), rng, 4, 2)
    out, lse = run(case, skip_softmax_factor=factor)
    exact, exact_lse = case.reference()
    within_bound(out, lse, exact, exact_lse, spread(case, 4, 2), factor, 2.0 ** -7)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_factor_is_refused(rng, bad):
    case = PagedCase(rng, seq_lens=[10], hq=4, hkv=2, d=64, page=16)
    with pytest.raises(deca.Error, match="skip_softmax_factor"):
        run(case, skip_softmax_factor=bad)
    with pytest.raises(deca.Error, match="skip_softmax_factor"):
        deca.GqaPlan(4, 2, 64, 16, max_seq_len=64, skip_softmax_factor=bad)


def test_cuda_skip_kernel_within_the_bound(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from test_cuda import cuda, host
    case = peak(PagedCase(rng, seq_lens=[5000, 3000], hq=16, hkv=2, d=128, page=32), rng, 16, 2)
    args = [cuda(a) for a in (case.q, case.k, case.v, case.page_table, case.seq_lens)]
    exact, exact_lse = case.reference()
    for factor in (0.1, 1.0):
        out, lse = deca.gqa_decode(*args, return_lse=True, skip_softmax_factor=factor)
        within_bound(host(out), host(lse), exact, exact_lse, spread(case, 16, 2), factor, 1e-2)
    plan = deca.GqaPlan(16, 2, 128, 32, max_seq_len=8192, max_batch=2, skip_softmax_factor=1.0,
                        device="cuda:0")
    assert plan.kernel_name.endswith("_skip")
