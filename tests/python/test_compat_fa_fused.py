"""flash_attn_with_kvcache with k / v appended and rotary (deca's fused decode step) against a
float64 reference written from FlashAttention's semantics: rotate q and k at their positions,
store k / v at cache_seqlens[b] + i in the cache's format, attend over cache_seqlens + seqlen_new
keys. The cache afterwards: the new slots hold the reference's values, every other byte is as
before (poisoned slots included)."""

import numpy as np
import pytest

import deca
import deca.compat as compat
import numpy_reference as ref
from cases import PagedCase, close, store

FA = "flash_attn_with_kvcache"


def _rotate64(x, pos, cos, sin, interleaved):
    """x [batch, s, heads, d] float64 rotated at pos [batch, s] with cos / sin [n, rd / 2]."""
    half = cos.shape[1]
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    a = 2 * np.arange(half) if interleaved else np.arange(half)
    b = a + 1 if interleaved else a + half
    out = x.copy()
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


class _Case:
    """A paged cache whose slots cache_seqlens[b] .. + seqlen_new are this step's (poisoned), and
    the step's q / k / v with FlashAttention's cos / sin tables."""

    def __init__(self, rng, *, cache_seqlens, seqlen_new, rotary_dim, kv_dtype="bf16",
                 q_dtype="bf16", descale=1.0, hq=6, hkv=3, d=64, page=8, seqlen_ro=64):
        self.cache_seqlens = np.asarray(cache_seqlens, np.int32)
        self.c = PagedCase(rng, seq_lens=self.cache_seqlens + seqlen_new, q_len=seqlen_new,
                           hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype, k_scale=descale,
                           v_scale=descale)
        self.kv_dtype, self.descale, self.page = kv_dtype, descale, page
        batch = len(cache_seqlens)
        self.q, self.q64 = store(rng.standard_normal((batch, seqlen_new, hq, d)), q_dtype)
        new_dtype = "fp8_e4m3" if q_dtype == "fp8_e4m3" else "bf16"
        self.k, self.k64 = store(rng.standard_normal((batch, seqlen_new, hkv, d)), new_dtype)
        self.v, self.v64 = store(rng.standard_normal((batch, seqlen_new, hkv, d)), new_dtype)
        self.cos = self.sin = None
        if rotary_dim:
            ang = rng.uniform(0, 2 * np.pi, (seqlen_ro, rotary_dim // 2))
            self.cos = np.cos(ang).astype(np.float32)
            self.sin = np.sin(ang).astype(np.float32)
        for b in range(batch):
            for t in self._new_slots(b):
                self._slot(self.c.k, b, t)[...] = np.nan
                self._slot(self.c.v, b, t)[...] = np.nan
        self.k_before, self.v_before = self.c.k.copy(), self.c.v.copy()

    def _new_slots(self, b):
        return range(int(self.cache_seqlens[b]), int(self.cache_seqlens[b]) + self.k.shape[1])

    def _slot(self, cache, b, t):
        return cache[self.c.page_table[b, t // self.page], t % self.page]

    def call(self, **kw):
        extra = {} if self.cos is None else dict(rotary_cos=self.cos, rotary_sin=self.sin)
        if self.kv_dtype == "fp8_e4m3":
            extra.update(k_descale=self.descale, v_descale=self.descale)
        return compat.flash_attn_with_kvcache(
            self.q, self.c.k, self.c.v, self.k, self.v, cache_seqlens=self.cache_seqlens,
            block_table=self.c.page_table, return_softmax_lse=True, **extra, **kw)

    def reference(self, causal, interleaved, rotary_seqlens=None, softmax_scale=None):
        """(out [batch, s, hq, d], lse [batch, hq, s], new k / v as stored) in float64."""
        batch, s, hq, d = self.q.shape
        hkv = self.k.shape[2]
        base = self.cache_seqlens if rotary_seqlens is None else rotary_seqlens
        pos = base[:, None] + np.arange(s)[None, :]
        q, k = self.q64, self.k64
        if self.cos is not None:
            cos, sin = self.cos.astype(np.float64), self.sin.astype(np.float64)
            # FlashAttention: a causal (or local) q at base + i, any other q at base.
            q = _rotate64(q, pos if causal else np.repeat(base[:, None], s, 1), cos, sin,
                          interleaved)
            k = _rotate64(k, pos, cos, sin, interleaved)
        # The rotation's results are rounded to q's dtype, as FlashAttention's reference has them.
        q, k = (x.astype(ref.BF16).astype(np.float64) for x in (q, k))
        new_k = store(k, self.kv_dtype, self.descale)[1]
        new_v = store(self.v64, self.kv_dtype, self.descale)[1]
        scale = (softmax_scale or d ** -0.5)
        out = np.zeros((batch, s, hq, d))
        lse = np.zeros((batch, hq, s))
        for b in range(batch):
            n = int(self.cache_seqlens[b])
            old_k = np.stack([self.c.k64[self.c.page_table[b, t // self.page], t % self.page]
                              for t in range(n)] or [np.zeros((hkv, d))])[:n]
            old_v = np.stack([self.c.v64[self.c.page_table[b, t // self.page], t % self.page]
                              for t in range(n)] or [np.zeros((hkv, d))])[:n]
            keys = np.concatenate([old_k, new_k[b]]) * self.descale
            vals = np.concatenate([old_v, new_v[b]]) * self.descale
            for h in range(hq):
                g = h // (hq // hkv)
                logits = keys[:, g] @ q[b, :, h].T * scale  # [keys, s]
                for i in range(s):
                    seen = logits[: n + i + 1 if causal else n + s, i]
                    m = seen.max()
                    p = np.exp(seen - m)
                    out[b, i, h] = p @ vals[: len(seen), g] / p.sum()
                    lse[b, h, i] = m + np.log(p.sum())
        return out, lse, new_k, new_v

    def check_cache(self, new_k, new_v):
        """The new slots hold new_k / new_v (stored numbers), every other byte is unchanged."""
        k_after, v_after = self.c.k.copy(), self.c.v.copy()
        tol = "fp8_e4m3" if self.kv_dtype == "fp8_e4m3" else "bf16"
        for b in range(len(self.cache_seqlens)):
            for i, t in enumerate(self._new_slots(b)):
                close(self._slot(k_after, b, t).astype(np.float64), new_k[b, i], tol)
                close(self._slot(v_after, b, t).astype(np.float64), new_v[b, i], tol)
                for cache in (k_after, v_after):
                    self._slot(cache, b, t)[...] = np.nan
        np.testing.assert_array_equal(k_after.view(np.uint8), self.k_before.view(np.uint8))
        np.testing.assert_array_equal(v_after.view(np.uint8), self.v_before.view(np.uint8))


@pytest.mark.parametrize("seqlen_new", [1, 2, 3, 4])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [64, 32, 0])
def test_append_rotary_matches_reference(rng, seqlen_new, interleaved, rotary_dim):
    case = _Case(rng, cache_seqlens=[0, 7, 8, 13], seqlen_new=seqlen_new, rotary_dim=rotary_dim)
    out, lse = case.call(causal=True, rotary_interleaved=interleaved)
    want, want_lse, new_k, new_v = case.reference(True, interleaved)
    close(out, want, "bf16")
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)
    case.check_cache(new_k, new_v)


@pytest.mark.parametrize("interleaved", [False, True])
def test_non_causal_single_token_and_rotary_seqlens(rng, interleaved):
    """seqlen_new 1 non-causal (q at base, the same as k's) and rotary_seqlens as the base."""
    case = _Case(rng, cache_seqlens=[5, 16, 1], seqlen_new=1, rotary_dim=32)
    out, _ = case.call(causal=False, rotary_interleaved=interleaved)
    want, _, new_k, new_v = case.reference(False, interleaved)
    close(out, want, "bf16")
    case.check_cache(new_k, new_v)
    case = _Case(rng, cache_seqlens=[5, 16, 1], seqlen_new=3, rotary_dim=32)
    base = np.array([40, 2, 9], np.int32)
    out, _ = case.call(causal=True, rotary_interleaved=interleaved, rotary_seqlens=base)
    want, _, new_k, new_v = case.reference(True, interleaved, rotary_seqlens=base)
    close(out, want, "bf16")
    case.check_cache(new_k, new_v)


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("descale", [1.0, 0.25])
def test_fp8_cache_with_descales(rng, q_dtype, descale):
    """An fp8 cache: the new keys are stored as round(rotated k / k_descale); an fp8 q / k / v
    (FlashAttention-3's fp8 call) are real values once multiplied by their descales."""
    case = _Case(rng, cache_seqlens=[3, 8, 11], seqlen_new=2, rotary_dim=48 - 16,
                 kv_dtype="fp8_e4m3", q_dtype=q_dtype, descale=descale)
    if q_dtype == "fp8_e4m3":
        # The new k / v as FlashAttention-3 holds them: stored numbers, real = stored * descale.
        case.k64, case.v64 = case.k64 * descale, case.v64 * descale
    out, _ = case.call(causal=True, rotary_interleaved=False)
    want, _, new_k, new_v = case.reference(True, False)
    assert out.dtype == ref.BF16
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=0.1, atol=0.05)
    case.check_cache(new_k, new_v)


def test_append_without_rotary_is_exact(rng):
    """k / v alone: stored as they are (a rotation by angle 0 changes no bit)."""
    case = _Case(rng, cache_seqlens=[0, 9, 4], seqlen_new=2, rotary_dim=0)
    case.call(causal=True)
    for b in range(3):
        for i, t in enumerate(case._new_slots(b)):
            np.testing.assert_array_equal(case._slot(case.c.k, b, t).view(np.uint16),
                                          case.k[b, i].view(np.uint16))
            np.testing.assert_array_equal(case._slot(case.c.v, b, t).view(np.uint16),
                                          case.v[b, i].view(np.uint16))


@pytest.mark.parametrize("seqlen_new", [2, 4])
def test_non_causal_append_without_rotary(rng, seqlen_new):
    """A multi-token non-causal query with k / v appended: every query sees every key, the new
    ones included (deca's tree mask over the new tokens)."""
    case = _Case(rng, cache_seqlens=[0, 6, 9], seqlen_new=seqlen_new, rotary_dim=0)
    out, lse = case.call(causal=False)
    want, want_lse, new_k, new_v = case.reference(False, False)
    close(out, want, "bf16")
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)
    case.check_cache(new_k, new_v)


def test_cos_sin_table_built_once_per_pair(rng):
    from deca.compat import _fa_fused
    case = _Case(rng, cache_seqlens=[2, 5], seqlen_new=1, rotary_dim=32)
    first = _fa_fused.cos_sin_cache(case.cos, case.sin)
    assert _fa_fused.cos_sin_cache(case.cos, case.sin) is first
    assert first.shape == (case.cos.shape[0], 32)
    np.testing.assert_array_equal(first[:, :16], case.cos)
    np.testing.assert_array_equal(first[:, 16:], case.sin)
    other = case.cos.copy()
    assert _fa_fused.cos_sin_cache(other, case.sin) is not first


@pytest.mark.parametrize("kwargs,match", [
    (dict(k_len=2), r"k: dim 1 \(seqlen_new\): expected seqlen_q \(3\)"),
    (dict(no_v=True), r"v: expected \[batch, seqlen_new, nheads_k, headdim\]"),
    (dict(no_k=True, rotary=True), r"k: expected \[batch, seqlen_new, nheads_k, headdim\]"),
    (dict(causal=False), r"causal: expected True"),
    (dict(cache_batch_idx=np.arange(2, dtype=np.int32)), r"cache_batch_idx: expected None"),
    (dict(cache_leftpad=np.zeros(2, np.int32)), r"cache_leftpad: expected None"),
    (dict(cu_seqlens_k_new=np.zeros(3, np.int32)), r"cu_seqlens_k_new: expected None"),
    (dict(rotary_dim=24), r"rotary_cos: dim 1: expected rotary_dim / 2"),
    (dict(no_sin=True), r"rotary_sin: expected \[seqlen_ro, rotary_dim / 2\]"),
])
def test_refusals_name_the_argument(rng, kwargs, match):
    kw = dict(kwargs)
    case = _Case(rng, cache_seqlens=[4, 6], seqlen_new=3, rotary_dim=kw.pop("rotary_dim", 32))
    k = case.k[:, :kw.pop("k_len")] if "k_len" in kw else case.k
    v = case.v[:, :k.shape[1]]
    if kw.pop("no_v", False):
        v = None
    if kw.pop("no_k", False):
        k = v = None
    kw.pop("rotary", None)
    sin = None if kw.pop("no_sin", False) else case.sin
    kw.setdefault("causal", True)
    before = case.c.k.copy()
    with pytest.raises(deca.Error, match=rf"{FA}: {match}"):
        compat.flash_attn_with_kvcache(case.q, case.c.k, case.c.v, k, v, rotary_cos=case.cos,
                                       rotary_sin=sin, cache_seqlens=case.cache_seqlens,
                                       block_table=case.c.page_table, **kw)
    np.testing.assert_array_equal(case.c.k.view(np.uint8), before.view(np.uint8))
