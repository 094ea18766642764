"""deca.compat follows each peer's conventions, on the CPU backend: the LSE (FlashMLA: natural
log, [batch, heads, s_q], +inf for a row without a valid key; FlashInfer: base 2; FlashAttention:
natural log, [batch, nheads, seqlen_q], -inf for a row without a key); any MLA page size
(FlashMLA's tests use 2, 61, 69 and 576); the arguments FlashAttention-3 ignores in a call
(rotary_seqlens without rotary, scheduler_metadata); an fp8 q with q_descale, widened exactly,
with the descales in every form FlashAttention-3 and vLLM pass them."""

import math

import ml_dtypes
import numpy as np
import pytest

import deca
import deca.compat as compat
import numpy_reference as ref
from cases import PagedCase, close, close_lse
from test_mla import _dense_case, _sparse_case


def _bits(x):
    x = np.ascontiguousarray(x)
    return x.view(np.uint8)


# --- LSE conventions ------------------------------------------------------------------------------

@pytest.mark.parametrize("s_q", [1, 3])
def test_flash_mla_lse_is_flashmlas(rng, s_q):
    q, kv, indices = _sparse_case(rng, 3, s_q, 8, 64, 16, num_blocks=6)
    indices[1] = -1  # request 1 has no valid key: FlashMLA's LSE +inf, out zeros
    topk_length = np.array([64, 64, 0], np.int32)  # request 2 neither
    sink = rng.normal(0.0, 1.0, 8).astype(np.float32)
    out, lse = compat.flash_mla_with_kvcache(q, kv, None, None, 512, None, None,
                                             is_fp8_kvcache=True, indices=indices,
                                             topk_length=topk_length, attn_sink=sink)
    assert lse.shape == (3, 8, s_q) and lse.dtype == np.float32 and lse.flags.c_contiguous
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices, topk_length, sink)
    close(out, want, "bf16")
    assert (out[1:].astype(np.float32) == 0).all()
    assert np.isposinf(lse[1:]).all()
    close_lse(lse[:1], want_lse[:1].swapaxes(1, 2))  # natural log, sink left out


def test_flash_mla_dense_lse_layout(rng):
    q, kv, table, lens = _dense_case(rng, [70, 3, 129], 2, 4, 16)
    out, lse = compat.flash_mla_with_kvcache(q, kv, table, lens, 512, None, None, causal=True)
    want, want_lse = ref.mla_dense(q.astype(np.float64), kv.astype(np.float64), table, lens)
    assert lse.shape == (3, 4, 2)
    close(out, want, "bf16")
    close_lse(lse, want_lse.swapaxes(1, 2))


def test_repeated_calls_write_the_peers_lse_layout_directly(rng):
    """The fast path of a repeated call takes the returned [batch, heads, 1] LSE as it is (the
    binding swaps the view's dims; no swapaxes per call) and writes FlashMLA's +inf in the
    kernels: the same bytes as the first, checked call, and no fallback to the checked path."""
    from deca._tensors import FALLBACKS
    q, kv, indices = _sparse_case(rng, 3, 1, 8, 64, 16, num_blocks=6)
    indices[1] = -1
    sink = rng.normal(0.0, 1.0, 8).astype(np.float32)
    case = PagedCase(rng, seq_lens=[37, 0, 16], q_len=1, hq=6, hkv=2, d=32, page=8)
    before = dict(FALLBACKS)
    mla, fa = [], []
    for _ in range(3):
        mla.append(compat.flash_mla_with_kvcache(q, kv, None, None, 512, None, None,
                                                 is_fp8_kvcache=True, indices=indices,
                                                 attn_sink=sink))
        fa.append(compat.flash_attn_with_kvcache(case.q, case.k, case.v,
                                                 cache_seqlens=case.seq_lens,
                                                 block_table=case.page_table, causal=True,
                                                 return_softmax_lse=True))
    assert dict(FALLBACKS) == before
    for (out, lse), (out0, lse0) in ((m, mla[0]) for m in mla[1:]):
        assert lse.shape == (3, 8, 1) and np.array_equal(_bits(lse), _bits(lse0))
        assert np.array_equal(_bits(out), _bits(out0))
    assert np.isposinf(mla[-1][1][1]).all() and np.isfinite(mla[-1][1][0]).all()
    for (out, lse), (out0, lse0) in ((f, fa[0]) for f in fa[1:]):
        assert lse.shape == (3, 6, 1) and np.array_equal(_bits(lse), _bits(lse0))
        assert np.array_equal(_bits(out), _bits(out0))
    assert np.isneginf(fa[-1][1][1]).all() and np.isfinite(fa[-1][1][0]).all()


@pytest.mark.parametrize("seqlen_q", [1, 2])
def test_flash_attn_lse_is_natural_and_transposed(rng, seqlen_q):
    case = PagedCase(rng, seq_lens=[37, 0, 16], q_len=seqlen_q, hq=6, hkv=2, d=32, page=8)
    out, lse = compat.flash_attn_with_kvcache(case.q, case.k, case.v,
                                              cache_seqlens=case.seq_lens,
                                              block_table=case.page_table, causal=True,
                                              return_softmax_lse=True)
    want, want_lse = case.reference()
    assert lse.shape == (3, 6, seqlen_q) and lse.flags.c_contiguous
    close(out, want, "bf16")
    close_lse(lse, want_lse.swapaxes(1, 2))
    assert np.isneginf(lse[1]).all() and (out[1].astype(np.float32) == 0).all()


def test_flashinfer_lse_is_base_2(rng):
    page = 8
    case = PagedCase(rng, seq_lens=[37, 5], hq=4, hkv=2, d=32, page=page)
    counts = [-(-int(n) // page) for n in case.seq_lens]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = np.concatenate([case.page_table[b, :c] for b, c in enumerate(counts)])
    last = np.array([(n - 1) % page + 1 for n in case.seq_lens], np.int32)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))
    w.plan(indptr, indices.astype(np.int32), last, 4, 2, 32, page, q_data_type="bf16")
    _, lse = w.run(case.q[:, 0], (case.k, case.v), return_lse=True)
    _, want_lse = case.reference()
    np.testing.assert_allclose(lse, want_lse[:, 0] / math.log(2.0), rtol=1e-5)


# --- MLA: any page size ---------------------------------------------------------------------------

@pytest.mark.parametrize("page", [1, 2, 61, 69, 257, 576])
def test_mla_sparse_any_page_size(rng, page):
    q, kv, indices = _sparse_case(rng, 2, 2, 4, 64, page, num_blocks=max(3, 80 // page))
    out, lse = deca.mla_decode_sparse(q, kv, indices, return_lse=True)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices)
    close(out, want, "bf16")
    close_lse(lse, want_lse)
    plan = deca.MlaPlan(4, sparse=True, page_size=page, max_batch=2, max_q_len=2, topk=64)
    out2 = np.empty_like(out)
    plan.run_sparse(q, kv, indices, out2, lse=np.empty_like(lse))
    np.testing.assert_array_equal(_bits(out2), _bits(out))


@pytest.mark.parametrize("page", [2, 61, 576])
def test_mla_dense_any_page_size(rng, page):
    q, kv, table, lens = _dense_case(rng, [page + 1, 2, 2 * page - 1, page], 2, 4, page)
    out, lse = deca.mla_decode_dense(q, kv, table, lens, return_lse=True)
    want, want_lse = ref.mla_dense(q.astype(np.float64), kv.astype(np.float64), table, lens)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_flash_mla_page_576_as_flashmlas_tests_pass_it(rng):
    """FlashMLA's test packs its cache as [blocks, block_size + 1, 656][:, :block_size] (a block
    stride one token longer than the block) and reads it as float8_e4m3fn."""
    page = 576
    q, packed, indices = _sparse_case(rng, 2, 1, 8, 128, page, num_blocks=2)
    big = np.zeros((2, page + 1, 656), np.uint8)
    big[:, :page] = packed[:, :, 0]
    cache = big[:, :page].reshape(2, page, 1, 656).view(ml_dtypes.float8_e4m3fn)
    assert not cache.flags.c_contiguous
    out, lse = compat.flash_mla_with_kvcache(q, cache, None, None, 512, None, None,
                                             is_fp8_kvcache=True, indices=indices)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), packed, indices)
    close(out, want, "bf16")
    close_lse(lse, want_lse.swapaxes(1, 2))


# --- FlashAttention-3's arguments -----------------------------------------------------------------

def test_flash_attn_ignores_what_flashattention3_ignores(rng):
    """rotary_seqlens (read only with rotary_cos), scheduler_metadata, num_splits, pack_gqa and
    sm_margin change nothing; rotary without k / v appended is refused by name."""
    case = PagedCase(rng, seq_lens=[37, 16], q_len=2, hq=4, hkv=2, d=32, page=8)
    args = dict(cache_seqlens=case.seq_lens, page_table=case.page_table, causal=True)
    want = compat.flash_attn_with_kvcache(case.q, case.k, case.v, **args)
    got = compat.flash_attn_with_kvcache(case.q, case.k, case.v, **args,
                                         rotary_seqlens=case.seq_lens, rotary_interleaved=False,
                                         scheduler_metadata=np.zeros(8, np.int32), num_splits=3,
                                         pack_gqa=True, sm_margin=4)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    with pytest.raises(deca.Error, match="flash_attn_with_kvcache: k: expected .* new keys "
                                         "with rotary_cos"):
        compat.flash_attn_with_kvcache(case.q, case.k, case.v, **args,
                                       rotary_cos=np.zeros((64, 8), ref.BF16),
                                       rotary_sin=np.zeros((64, 8), ref.BF16),
                                       rotary_seqlens=case.seq_lens)


@pytest.mark.parametrize("lens", [[2, 37, 1], [5, 5, 5]])
def test_flash_attn_request_shorter_than_its_queries(rng, lens):
    """FlashAttention's causal mask for seqlen_k < seqlen_q: query i sees keys up to
    i + seqlen_k - seqlen_q, so the first queries see none (zeros, LSE -inf)."""
    q_len = 6
    case = PagedCase(rng, seq_lens=[max(n, q_len) for n in lens], q_len=q_len, hq=4, hkv=2,
                     d=32, page=4)
    case.seq_lens = np.asarray(lens, np.int32)
    out, lse = compat.flash_attn_with_kvcache(case.q, case.k, case.v,
                                              cache_seqlens=case.seq_lens,
                                              block_table=case.page_table, causal=True,
                                              return_softmax_lse=True)
    want, want_lse = case.reference()
    close(out, want, "bf16")
    close_lse(lse, want_lse.swapaxes(1, 2))
    for b, n in enumerate(lens):
        assert (out[b, :q_len - n].astype(np.float32) == 0).all()
        assert np.isneginf(lse[b, :, :q_len - n]).all() and np.isfinite(lse[b, :, q_len - n:]).all()


def _fp8_case(rng, batch=3, hq=6, hkv=2, q_len=1):
    case = PagedCase(rng, seq_lens=[37, 9, 20][:batch], q_len=q_len, hq=hq, hkv=hkv, d=32,
                     page=8, kv_dtype="fp8_e4m3")
    q8 = (rng.standard_normal(case.q.shape) * 8).astype(ml_dtypes.float8_e4m3fn)
    return case, q8


def test_fp8_q_is_widened_exactly(rng):
    case, q8 = _fp8_case(rng)
    qb = q8.astype(ref.BF16)
    assert (qb.astype(np.float64) == q8.astype(np.float64)).all()  # e4m3 -> bf16 is exact
    args = dict(cache_seqlens=case.seq_lens, block_table=case.page_table)
    got, lse = compat.flash_attn_with_kvcache(q8, case.k, case.v, **args,
                                              return_softmax_lse=True)
    want, want_lse = compat.flash_attn_with_kvcache(qb, case.k, case.v, **args,
                                                    return_softmax_lse=True)
    assert got.dtype == ref.BF16  # FlashAttention-3 returns bf16 for an fp8 q
    np.testing.assert_array_equal(_bits(got), _bits(want))
    np.testing.assert_array_equal(_bits(lse), _bits(want_lse))


def _descale_reference(case, q8, qd, kd, vd):
    """float64 attention with real q = q8 * qd[b, kv head], k = k8 * kd[b, kv head], v alike."""
    batch, q_len, hq, d = q8.shape
    hkv = case.k.shape[2]
    group = hq // hkv
    outs = []
    for b in range(batch):
        qr = q8[b:b + 1].astype(np.float64) * np.repeat(qd[b], group)[None, None, :, None]
        out, _ = ref.gqa_decode(qr, case.k64, case.v64, case.page_table[b:b + 1],
                                case.seq_lens[b:b + 1], k_scales=kd[b], v_scales=vd[b])
        outs.append(out)
    return np.concatenate(outs)


@pytest.mark.parametrize("form", ["float", "one_row", "expanded", "equal_rows", "per_request",
                                  "per_head_1d"])
def test_fp8_q_with_descales(rng, form):
    case, q8 = _fp8_case(rng)
    batch, hkv = 3, 2
    rows = {k: rng.uniform(0.02, 0.1, (batch, hkv)).astype(np.float32) for k in "qkv"}
    if form == "float":
        qd, kd, vd = 0.5, 0.05, 0.07
        full = {k: np.full((batch, hkv), v, np.float32) for k, v in zip("qkv", (qd, kd, vd))}
    elif form == "per_request":
        qd, kd, vd = rows["q"], rows["k"], rows["v"]
        full = rows
    else:
        one = {k: r[:1] for k, r in rows.items()}
        full = {k: np.repeat(r, batch, 0) for k, r in one.items()}
        if form == "one_row":
            qd, kd, vd = one["q"][:1], one["k"], one["v"]  # (1, nheads_k)
            qd = np.repeat(qd, 1, 0)
        elif form == "expanded":  # vLLM: one scale expand()ed to (batch, nheads_k), stride 0
            qd, kd, vd = (np.broadcast_to(one[k], (batch, hkv)) for k in "qkv")
        elif form == "equal_rows":
            qd, kd, vd = full["q"], full["k"], full["v"]
        else:
            qd, kd, vd = one["q"][0], one["k"][0], one["v"][0]  # deca's [nheads_k]
    got = compat.flash_attn_with_kvcache(q8, case.k, case.v, cache_seqlens=case.seq_lens,
                                         block_table=case.page_table, q_descale=qd,
                                         k_descale=kd, v_descale=vd)
    want = _descale_reference(case, q8, full["q"], full["k"], full["v"])
    close(got, want, "bf16")
    if form == "per_request":  # one request at a time, each with its rows as per-head scales
        for b in range(batch):
            alone = deca.gqa_decode(q8[b:b + 1].astype(ref.BF16), case.k, case.v,
                                    case.page_table[b:b + 1], case.seq_lens[b:b + 1],
                                    k_scales=qd[b] * kd[b], v_scales=vd[b])
            np.testing.assert_array_equal(_bits(got[b:b + 1]), _bits(alone))


def test_descales_apply_to_fp8_only(rng):
    """As in FlashAttention-3: q_descale only scales an fp8 q, k / v_descale an 8-bit cache."""
    case = PagedCase(rng, seq_lens=[37, 9], hq=4, hkv=2, d=32, page=8)
    args = dict(cache_seqlens=case.seq_lens, block_table=case.page_table)
    want = compat.flash_attn_with_kvcache(case.q, case.k, case.v, **args)
    scale = np.full((2, 2), 3.0, np.float32)
    got = compat.flash_attn_with_kvcache(case.q, case.k, case.v, **args, q_descale=scale,
                                         k_descale=scale, v_descale=scale)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_descale_errors_name_the_argument(rng):
    case, q8 = _fp8_case(rng)
    args = dict(cache_seqlens=case.seq_lens, block_table=case.page_table)
    with pytest.raises(deca.Error, match=r"flash_attn_with_kvcache: q_descale: expected float32 "
                                         r"\(batch, nheads_k\) = \(3, 2\)"):
        compat.flash_attn_with_kvcache(q8, case.k, case.v, **args,
                                       q_descale=np.ones((3, 6), np.float32))
    with pytest.raises(deca.Error, match=r"flash_attn_with_kvcache: k_descale: expected "
                                         r"numpy.float32, got numpy.float64"):
        compat.flash_attn_with_kvcache(q8, case.k, case.v, **args, k_descale=np.ones((3, 2)))
