"""deca.compat: the same inputs through each engine-style wrapper and through deca's own API
(bitwise: same backend, same plan), plus the semantic mappings checked independently."""

import math

import numpy as np
import pytest

import deca
import deca.compat as compat
import numpy_reference as ref
from cases import PagedCase, close, csr_pages
from test_mla import _dense_case, _sparse_case


def _eq(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


# --- FlashAttention ------------------------------------------------------------------------

@pytest.mark.parametrize("q_len,window_size,softcap,scale", [
    (1, (-1, -1), 0.0, None),
    (1, (5, -1), 0.0, None),
    (1, (7, 0), 30.0, 0.1),
    (3, (-1, -1), 0.0, None),
    (2, (4, 0), 0.0, None),
])
def test_flash_attn_matches_gqa_decode(rng, q_len, window_size, softcap, scale):
    case = PagedCase(rng, seq_lens=[37, 0, 16, 5], q_len=q_len, hq=6, hkv=2, d=64, page=16)
    case.seq_lens[1] = q_len  # FlashAttention's requests hold at least their own queries
    out, lse = compat.flash_attn_with_kvcache(
        case.q, case.k, case.v, cache_seqlens=case.seq_lens, block_table=case.page_table,
        softmax_scale=scale, causal=True, window_size=window_size, softcap=softcap,
        return_softmax_lse=True)
    window = 0 if window_size[0] < 0 else window_size[0] + 1
    want, want_lse = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                                     softmax_scale=scale, softcap=softcap, window=window,
                                     return_lse=True)
    assert out.shape == case.q.shape and lse.shape == (4, 6, q_len)
    assert lse.flags.c_contiguous
    _eq(out, want)
    _eq(lse, want_lse.swapaxes(1, 2))


def test_flash_attn_window_is_flash_attentions(rng):
    # window_size=(3, 0): the query at position p sees keys p-3..p -- the same as attending to
    # a cache that holds only those four keys.
    case = PagedCase(rng, seq_lens=[21], hq=4, hkv=1, d=32, page=8)
    out = compat.flash_attn_with_kvcache(case.q, case.k, case.v, cache_seqlens=case.seq_lens,
                                         block_table=case.page_table, causal=True,
                                         window_size=(3, 0))
    pages = case.page_table[0]
    last4_k = np.stack([case.k[pages[t // 8], t % 8] for t in range(17, 21)])[None]
    last4_v = np.stack([case.v[pages[t // 8], t % 8] for t in range(17, 21)])[None]
    want = compat.flash_attn_with_kvcache(case.q, last4_k, last4_v,
                                          cache_seqlens=np.array([4], np.int32))
    close(out, np.asarray(want).astype(np.float64), "bf16")


def test_flash_attn_contiguous_cache_and_int_seqlens(rng):
    q = rng.standard_normal((2, 1, 4, 32)).astype(ref.BF16)
    k = rng.standard_normal((2, 24, 2, 32)).astype(ref.BF16)
    v = rng.standard_normal((2, 24, 2, 32)).astype(ref.BF16)
    out = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=24)
    want = ref.gqa_decode(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                          np.array([[0], [1]], np.int32), np.array([24, 24], np.int32))[0]
    close(out, want, "bf16")


@pytest.mark.parametrize("kwargs,name", [
    (dict(k=np.zeros(1)), "v"),
    (dict(rotary_cos=np.zeros(1)), "k"),
    (dict(alibi_slopes=np.zeros(4, np.float32)), "alibi_slopes"),
    (dict(cache_batch_idx=np.zeros(2, np.int32)), "cache_batch_idx"),
    (dict(cache_leftpad=np.zeros(2, np.int32)), "cache_leftpad"),
    (dict(attention_chunk=64), "attention_chunk"),
    (dict(window_size=(-1, -2), causal=False), "window_size"),
])
def test_flash_attn_refuses_by_name(rng, kwargs, name):
    case = PagedCase(rng, seq_lens=[9, 4], q_len=2, hq=4, hkv=2, d=32, page=8)
    with pytest.raises(deca.Error, match=rf"flash_attn_with_kvcache: {name}:"):
        compat.flash_attn_with_kvcache(case.q, case.k, case.v, cache_seqlens=case.seq_lens,
                                       block_table=case.page_table, **kwargs)


def _flash_attn_visible(q_len, seqlen_k, left, right):
    """FlashAttention's rule, written from its docstring: query i sees key j iff
    p - left <= j <= p + right, p = i + seqlen_k - seqlen_q, -1 = unbounded."""
    vis = np.zeros((q_len, seqlen_k), bool)
    for i in range(q_len):
        p = i + seqlen_k - q_len
        for j in range(seqlen_k):
            vis[i, j] = (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
    return vis


@pytest.mark.parametrize("q_len,window_size", [
    (2, (-1, -1)), (5, (-1, -1)), (4, (-1, 1)), (3, (6, -1)), (33, (-1, 2)),
])
def test_flash_attn_non_causal_multi_token(rng, q_len, window_size):
    """causal=False with seqlen_q > 1: queries see keys past their own position (deca's tree
    mask underneath), checked against FlashAttention's rule in float64."""
    lens = [40, q_len, 17 + q_len]
    case = PagedCase(rng, seq_lens=lens, q_len=q_len, hq=4, hkv=2, d=32, page=8)
    out, lse = compat.flash_attn_with_kvcache(case.q, case.k, case.v,
                                              cache_seqlens=case.seq_lens,
                                              block_table=case.page_table, causal=False,
                                              window_size=window_size, return_softmax_lse=True)
    q = case.q.astype(np.float64)
    scale = 1.0 / math.sqrt(32)
    for b, n in enumerate(lens):
        rows = case.page_table[b]
        k = np.stack([case.k[rows[t // 8], t % 8] for t in range(n)]).astype(np.float64)
        v = np.stack([case.v[rows[t // 8], t % 8] for t in range(n)]).astype(np.float64)
        vis = _flash_attn_visible(q_len, n, *window_size)
        for h in range(4):
            logits = scale * q[b, :, h] @ k[:, h // 2].T
            logits[~vis] = -np.inf
            m = logits.max(-1, keepdims=True)
            w = np.exp(logits - m)
            want = (w @ v[:, h // 2]) / w.sum(-1, keepdims=True)
            close(out[b, :, h], want, "bf16")
            np.testing.assert_allclose(lse[b, h], (m[:, 0] + np.log(w.sum(-1))), rtol=1e-5)


def test_flash_attn_non_causal_refuses_short_requests(rng):
    case = PagedCase(rng, seq_lens=[9, 4], q_len=4, hq=4, hkv=2, d=32, page=8)
    case.seq_lens = np.array([9, 3], np.int32)
    with pytest.raises(deca.Error, match=r"flash_attn_with_kvcache: cache_seqlens: expected at "
                                         r"least seqlen_q \(4\).*got 3 at \[1\]"):
        compat.flash_attn_with_kvcache(case.q, case.k, case.v, cache_seqlens=case.seq_lens,
                                       block_table=case.page_table, causal=False)


# --- FlashInfer ----------------------------------------------------------------------------

def test_csr_to_page_table(rng):
    table, lens = compat.csr_to_page_table(np.array([0, 2, 2, 5]), np.array([7, 3, 9, 1, 4]),
                                           np.array([5, 0, 16]), 16)
    np.testing.assert_array_equal(lens, [21, 0, 48])
    np.testing.assert_array_equal(table[0, :2], [7, 3])
    np.testing.assert_array_equal(table[2], [9, 1, 4])
    with pytest.raises(deca.Error, match="last_page_len: expected 1..page_size"):
        compat.csr_to_page_table(np.array([0, 1]), np.array([0]), np.array([17]), 16)


@pytest.mark.parametrize("layout,combined,window_left,cap", [
    ("NHD", True, -1, None), ("HND", True, 6, 0.0), ("NHD", False, -1, 20.0),
])
def test_flashinfer_matches_gqa_decode(rng, layout, combined, window_left, cap):
    page = 16
    case = PagedCase(rng, seq_lens=[40, 1, 0, 16], hq=8, hkv=2, d=64, page=page,
                     layout=layout)
    indptr, indices, last = csr_pages(case, page)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1 << 20, np.uint8), layout)
    w.plan(indptr, indices, last, 8, 2, 64, page, window_left=window_left,
           logits_soft_cap=cap, q_data_type="bfloat16")
    cache = np.stack([case.k, case.v], axis=1) if combined else (case.k, case.v)
    q = case.q[:, 0]
    out, lse = w.run(q, cache, return_lse=True)
    want, want_lse = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                                     layout=layout, softcap=cap or 0.0,
                                     window=0 if window_left < 0 else window_left + 1,
                                     return_lse=True)
    assert out.shape == (4, 8, 64) and lse.shape == (4, 8)
    _eq(out, want[:, 0])
    # FlashInfer's LSE is base 2.
    np.testing.assert_allclose(lse, want_lse[:, 0] / math.log(2.0), rtol=1e-6)
    # A second run into caller buffers gives the same bits.
    out2, lse2 = np.empty_like(out), np.empty_like(lse)
    w.run(q, cache, out=out2, lse=lse2)
    _eq(out2, out)
    _eq(lse2, lse)


def test_flashinfer_replan_reuses_buffers_and_refuses_growth_in_graph_mode(rng):
    case = PagedCase(rng, seq_lens=[20, 9], hq=4, hkv=2, d=32, page=8)
    indptr, indices, last = csr_pages(case, 8)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8), use_cuda_graph=True,
                                                  max_seq_len=32)
    w.plan(indptr, indices, last, 4, 2, 32, 8, q_data_type="bfloat16")
    table = w._page_table
    w.plan(indptr, indices, last, 4, 2, 32, 8, q_data_type="bfloat16")
    assert w._page_table is table  # the buffer a captured graph reads stays put
    with pytest.raises(deca.Error, match="plan: indptr: expected batch 2 and at most 4 pages"):
        w.plan(np.array([0, 5, 6]), np.arange(6), np.array([8, 1]), 4, 2, 32, 8)
    with pytest.raises(deca.Error, match="pos_encoding_mode"):
        w.plan(indptr, indices, last, 4, 2, 32, 8, pos_encoding_mode="ROPE_LLAMA")
    fresh = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))
    with pytest.raises(deca.Error, match="run: self: expected plan"):
        fresh.run(case.q[:, 0], (case.k, case.v))


# --- FlashMLA ------------------------------------------------------------------------------

def test_flash_mla_sparse_matches_mla_decode_sparse(rng):
    q, kv, indices = _sparse_case(rng, 3, 2, 8, 24, 16, num_blocks=6)
    topk_length = np.array([24, 5, 0], np.int32)
    sink = rng.normal(0.0, 1.5, 8).astype(np.float32)
    meta, splits = compat.get_mla_metadata(None, 2 * 8, 1, num_heads_q=8, is_fp8_kvcache=True,
                                           topk=64)
    assert splits is None
    with pytest.raises(deca.Error, match="indices: expected topk 64"):
        compat.flash_mla_with_kvcache(q, kv, None, None, 512, meta, splits,
                                      is_fp8_kvcache=True, indices=indices)
    meta, splits = compat.get_mla_metadata()
    out, lse = compat.flash_mla_with_kvcache(q, kv, None, None, 512, meta, splits,
                                             is_fp8_kvcache=True, indices=indices,
                                             attn_sink=sink, topk_length=topk_length)
    want, want_lse = deca.mla_decode_sparse(q, kv, indices, topk_length=topk_length,
                                            attn_sink=sink, return_lse=True)
    assert out.shape == (3, 2, 8, 512) and lse.shape == (3, 8, 2)
    _eq(out, want)
    # FlashMLA's convention: +inf for a row without a valid key (request 2 has topk_length 0),
    # where deca's own LSE is -inf; every other row is deca's.
    want_lse = want_lse.swapaxes(1, 2).copy()
    assert np.isneginf(want_lse[2]).all() and np.isfinite(np.delete(want_lse, 2, 0)).all()
    want_lse[2] = np.inf
    _eq(lse, want_lse)


def test_flash_mla_dense_matches_mla_decode_dense(rng):
    q, kv, table, lens = _dense_case(rng, [70, 3, 129], 2, 16, 64)
    meta, splits = compat.get_mla_metadata(lens, 2 * 16, 1)
    out, lse = compat.flash_mla_with_kvcache(q, kv, table, lens, 512, meta, splits,
                                             causal=True)
    want, want_lse = deca.mla_decode_dense(q, kv, table, lens, return_lse=True)
    _eq(out, want)
    _eq(lse, want_lse.swapaxes(1, 2))


@pytest.mark.parametrize("s_q,heads,strided", [(2, 16, False), (3, 48, False),
                                                 (2, 100, False), (4, 8, True)])
def test_flash_mla_dense_non_causal(rng, s_q, heads, strided):
    """causal=False with s_q > 1: every query token sees every key of its request (FlashMLA's
    reference), in float64 from the bf16 inputs. 2 x 100 heads exceed deca's 128 heads a call
    (token by token), a strided q cannot fold its tokens into heads (token by token too)."""
    lens = [70, s_q, 129]
    q, kv, table, lens = _dense_case(rng, lens, s_q, heads, 64)
    if strided:
        wide = np.zeros(q.shape[:3] + (640,), q.dtype)
        wide[..., :576] = q
        q = wide[..., :576]
    out, lse = compat.flash_mla_with_kvcache(q, kv, table, lens, 512, None, None, causal=False)
    scale = 1.0 / math.sqrt(576)
    for b, n in enumerate(lens):
        rows = np.stack([kv[table[b, t // 64], t % 64, 0] for t in range(n)]).astype(np.float64)
        logits = scale * q[b].astype(np.float64) @ rows.T  # [s_q, heads, n]
        m = logits.max(-1, keepdims=True)
        w = np.exp(logits - m)
        want = (w @ rows[:, :512]) / w.sum(-1, keepdims=True)
        close(out[b], want, "bf16")
        np.testing.assert_allclose(lse[b], (m[..., 0] + np.log(w.sum(-1))).T, rtol=1e-5)


def test_flash_mla_dense_fp8_cache_and_empty_requests(rng):
    """Dense with is_fp8_kvcache=True reads the 656-byte sparse cache through block_table (what
    deca.mla_decode_dense does with kv_format "fp8_sparse"); an empty request's rows get out 0
    and LSE +inf, FlashMLA's convention (deca's own API gives -inf)."""
    from test_mla import dense_cache
    q, kv, table, lens = _dense_case(rng, [70, 0, 33], 1, 8, 16)
    cache, _, _ = dense_cache(kv, "fp8_sparse", rng)
    meta, splits = compat.get_mla_metadata(lens, 8, 1, is_fp8_kvcache=True)
    out, lse = compat.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, splits,
                                             is_fp8_kvcache=True)
    want, want_lse = deca.mla_decode_dense(q, cache, table, lens, kv_format="fp8_sparse",
                                           return_lse=True)
    _eq(out, want)
    assert np.all(np.isneginf(want_lse[1])) and np.all(np.isposinf(lse[1]))
    want_lse[1] = np.inf
    _eq(lse, want_lse.swapaxes(1, 2))
    assert np.all(out[1].astype(np.float32) == 0)


def test_flash_mla_refuses_by_name(rng):
    q, kv, indices = _sparse_case(rng, 1, 1, 4, 8, 16, num_blocks=2)
    meta, _ = compat.get_mla_metadata()
    for kwargs, name in [(dict(extra_k_cache=kv), "extra_k_cache"),
                         (dict(is_fp8_kvcache=False), "is_fp8_kvcache"),
                         (dict(causal=True), "causal")]:
        args = dict(is_fp8_kvcache=True, indices=indices)
        args.update(kwargs)
        with pytest.raises(deca.Error, match=rf"flash_mla_with_kvcache: {name}:"):
            compat.flash_mla_with_kvcache(q, kv, None, None, 512, meta, None, **args)
    with pytest.raises(deca.Error, match="head_dim_v: expected 512"):
        compat.flash_mla_with_kvcache(q, kv, None, None, 576, meta, None, is_fp8_kvcache=True,
                                      indices=indices)
