"""deca.mla_decode_dense / mla_decode_sparse against the numpy reference."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import close, close_lse


def _dense_case(rng, seqlens, q_len, heads, page):
    batch = len(seqlens)
    need = [-(-n // page) for n in seqlens]
    num_blocks = sum(need) + 1
    ids = rng.permutation(num_blocks)
    table = np.full((batch, max(need) + 1), ids[-1], np.int32)  # spare columns: poisoned block
    owned = np.zeros((num_blocks, page), bool)
    at = 0
    for b, n in enumerate(seqlens):
        for j in range(need[b]):
            table[b, j] = ids[at]
            owned[ids[at], :min(page, n - j * page)] = True
            at += 1
    kv = rng.standard_normal((num_blocks, page, 1, 576)).astype(ref.BF16)
    kv[~owned] = np.nan
    q = rng.standard_normal((batch, q_len, heads, 576)).astype(ref.BF16)
    return q, kv, table, np.asarray(seqlens, np.int32)


@pytest.mark.parametrize("seqlens,q_len,heads,page", [
    ([70, 1, 129], 1, 16, 64),
    ([33, 20], 2, 8, 16),
    ([5], 4, 4, 64),
])
def test_mla_dense_matches_numpy(rng, seqlens, q_len, heads, page):
    q, kv, table, lens = _dense_case(rng, seqlens, q_len, heads, page)
    out, lse = deca.mla_decode_dense(q, kv, table, lens, return_lse=True)
    assert out.shape == (len(seqlens), q_len, heads, 512) and out.dtype == ref.BF16
    want, want_lse = ref.mla_dense(q.astype(np.float64), kv.astype(np.float64), table, lens)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_mla_dense_softmax_scale_and_plan(rng):
    q, kv, table, lens = _dense_case(rng, [40, 17], 1, 8, 16)
    plan = deca.MlaPlan(8, page_size=16, max_batch=2, max_seq_len=64, lse=False)
    assert plan.workspace_bytes == 0
    out = np.empty((2, 1, 8, 512), ref.BF16)
    plan.run_dense(q, kv, table, lens, out, softmax_scale=0.07)
    want, _ = ref.mla_dense(q.astype(np.float64), kv.astype(np.float64), table, lens,
                            softmax_scale=0.07)
    close(out, want, "bf16")


def dense_cache(kv, kv_format, rng=None, scale=None):
    """The bf16 case cache `kv` (NaN in unowned slots) stored as kv_format: (cache, kv_scale,
    real) with real [blocks, page, 1, 576] float64 the values each token holds by the format's
    definition (NaN where no token lives). e4m3: one power-of-two scale chosen by
    quantize_mla_fp8_e4m3, or `scale` (products rounded to fp32, then bf16); fp8_sparse: the
    656-byte token with each 128-value group at its own magnitude (different scales)."""
    owned = ~np.isnan(kv.astype(np.float32)).any(axis=-1)  # [blocks, page, 1]
    src = np.where(owned[..., None], kv.astype(np.float32), 0.0)
    if kv_format == "bf16":
        return kv, None, kv.astype(np.float64)
    if kv_format == "fp8_e4m3":
        if scale is None:
            cache, scale = deca.quantize_mla_fp8_e4m3(src.astype(ref.BF16))
        else:
            cache = deca.quantize_fp8(src.astype(ref.BF16), scale)
        real = (cache.astype(np.float32) * np.float32(scale)).astype(ref.BF16).astype(np.float64)
        cache.view(np.uint8)[~owned] = 0x7F  # e4m3 NaN
        real[~owned] = np.nan
        return cache, scale, real
    src[..., :512] *= np.repeat(np.exp2(rng.integers(-4, 5, src.shape[:3] + (4,))), 128, axis=-1)
    cache = deca.pack_mla_fp8(src.astype(ref.BF16))
    real = np.stack([ref.unpack_fp8_token(t) for t in cache.reshape(-1, 656)])
    real = real.reshape(src.shape)
    cache[~owned] = 0x7F  # NaN NoPE, huge scales, NaN RoPE
    real[~owned] = np.nan
    return cache, None, real


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "fp8_sparse"])
@pytest.mark.parametrize("seqlens,q_len,heads,page", [
    ([70, 1, 129, 0], 1, 16, 64),
    ([33, 20], 3, 8, 16),
    ([4], 4, 24, 1),
])
def test_mla_dense_formats_match_numpy(rng, kv_format, seqlens, q_len, heads, page):
    """Each cache format against the numpy reference over the values it stores; the format
    follows the cache's dtype (uint8 [.., 656]: the sparse token read densely)."""
    q, kv, table, lens = _dense_case(rng, seqlens, q_len, heads, page)
    cache, scale, real = dense_cache(kv, kv_format, rng)
    out, lse = deca.mla_decode_dense(q, cache, table, lens, kv_scale=scale, return_lse=True)
    want, want_lse = ref.mla_dense(q.astype(np.float64), real, table, lens)
    close(out, want, "bf16")
    close_lse(lse, want_lse)
    assert np.all(np.asarray(out.astype(np.float32))[lens == 0] == 0)


def test_mla_dense_e4m3_arbitrary_scale_and_uint8_bits(rng):
    """A scale that is no power of two (each value's product rounded to bf16), and the e4m3
    cache passed as uint8 bits with kv_format="fp8_e4m3" through a plan."""
    q, kv, table, lens = _dense_case(rng, [50, 9], 2, 8, 16)
    cache, scale, real = dense_cache(kv, "fp8_e4m3", scale=0.0123)
    want, want_lse = ref.mla_dense(q.astype(np.float64), real, table, lens)
    out, lse = deca.mla_decode_dense(q, cache, table, lens, kv_scale=scale, return_lse=True)
    close(out, want, "bf16")
    close_lse(lse, want_lse)
    plan = deca.MlaPlan(8, kv_format="fp8_e4m3", page_size=16, max_batch=2, max_q_len=2,
                        max_seq_len=64)
    assert plan.kv_format == "fp8_e4m3" and plan.config.kv_format == "fp8_e4m3"
    bits = np.empty((2, 2, 8, 512), ref.BF16)
    plan.run_dense(q, cache.view(np.uint8), table, lens, bits, lse=np.empty((2, 2, 8), np.float32),
                   kv_scale=scale, reuse_schedule=True)  # reuse_schedule: ignored on the CPU
    assert np.array_equal(bits.view(np.uint16), out.view(np.uint16))


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "fp8_sparse"])
def test_mla_dense_repeated_calls_take_the_fast_path(rng, kv_format):
    """A repeated one-off dense call of one shape runs through the plan's fast import in every
    cache format (numpy's bf16 / e4m3 caches as their raw bits), with the first call's result;
    a cache of another format on that plan still falls back and is refused by name."""
    from deca._tensors import FALLBACKS
    q, kv, table, lens = _dense_case(rng, [40, 3], 1, 8, 16)
    cache, scale, _ = dense_cache(kv, kv_format, rng)
    first = deca.mla_decode_dense(q, cache, table, lens, kv_scale=scale)
    before = FALLBACKS["MlaPlan.run_dense"]
    for _ in range(2):
        again = deca.mla_decode_dense(q, cache, table, lens, kv_scale=scale)
        assert np.array_equal(again.view(np.uint16), first.view(np.uint16))
    assert FALLBACKS["MlaPlan.run_dense"] == before
    plan = deca.MlaPlan(8, kv_format=kv_format, page_size=16, max_batch=2, max_seq_len=64)
    other = dense_cache(kv, "fp8_e4m3" if kv_format == "bf16" else "bf16", rng)[0]
    with pytest.raises(deca.Error, match=r"mla_decode_dense: kv_cache: expected dtype"):
        plan.run_dense(q, other, table, lens, np.empty((2, 1, 8, 512), ref.BF16),
                       lse=np.empty((2, 1, 8), np.float32))
    assert FALLBACKS["MlaPlan.run_dense"] == before + 1


def test_mla_dense_format_errors(rng):
    q, kv, table, lens = _dense_case(rng, [20], 1, 4, 16)
    with pytest.raises(deca.Error, match=r'MlaPlan: kv_format: expected "default" or "bf16" or '
                                         r'"fp8_e4m3" or "fp8_sparse" or "model1", got \'fp8\''):
        deca.MlaPlan(4, kv_format="fp8")
    with pytest.raises(deca.Error, match=r"plan_mla_decode: config.kv_format: expected kDefault, "
                                         r"kFP8Sparse or kModel1 for sparse decode .* got kBF16 "
                                         r"\(bf16\)"):
        deca.MlaPlan(4, sparse=True, topk=64, kv_format="bf16")
    with pytest.raises(deca.Error, match=r"mla_decode_dense: kv_scale: expected 1 \(only a "
                                         r"kFP8E4M3 cache has a per-cache scale"):
        deca.mla_decode_dense(q, kv, table, lens, kv_scale=0.5)
    cache, scale, _ = dense_cache(kv, "fp8_e4m3")
    with pytest.raises(deca.Error, match=r"mla_decode_dense: kv_scale: expected a finite value "
                                         r"> 0 .* got 0"):
        deca.mla_decode_dense(q, cache, table, lens, kv_scale=0.0)
    plan = deca.MlaPlan(4, kv_format="fp8_sparse", page_size=16, max_seq_len=32)
    with pytest.raises(deca.Error, match=r"mla_decode_dense: kv_cache: expected dtype uint8 "
                                         r"\(plan.config.kv_format kFP8Sparse\), got bf16"):
        plan.run_dense(q, kv, table, lens, np.empty((1, 1, 4, 512), ref.BF16),
                       lse=np.empty((1, 1, 4), np.float32))


def _sparse_case(rng, batch, q_len, heads, topk, page, num_blocks):
    latent = rng.standard_normal((num_blocks, page, 1, 576))
    latent[..., :512] *= rng.uniform(0.01, 10.0, (num_blocks, page, 1, 1))  # varied scales
    kv = deca.pack_mla_fp8(latent.astype(ref.BF16))
    total = num_blocks * page
    # Tokens 0..9 are never selected by a counted index: poison them (NaN NoPE bytes).
    kv[:, :, :, :512].reshape(-1, 512)[:10] = 0x7F
    indices = rng.integers(10, total, (batch, q_len, topk)).astype(np.int32)
    indices[rng.random(indices.shape) < 0.2] = -1
    indices[0, 0, 1] = indices[0, 0, 0]  # a duplicate counts twice
    q = rng.standard_normal((batch, q_len, heads, 576)).astype(ref.BF16)
    return q, kv, indices


def strided_kv(kv, layout):
    """The packed cache [blocks, page, 1, 656] as a view into a larger allocation whose other
    bytes are 0x7F (e4m3 NaN, huge scales and RoPE): "layer" one layer of [blocks, 2, page, 1,
    656] (block stride two pages), "slot" [blocks, page, 2, 656][:, :, 1:2] (slot stride two
    records). A kernel that assumed the dense strides would read the poison."""
    blocks, page = kv.shape[:2]
    if layout == "layer":
        big = np.full((blocks, 2, page, 1, 656), 0x7F, np.uint8)
        big[:, 1] = kv
        return big, big[:, 1]
    big = np.full((blocks, page, 2, 656), 0x7F, np.uint8)
    big[:, :, 1:2] = kv
    return big, big[:, :, 1:2]


@pytest.mark.parametrize("layout", ["layer", "slot"])
def test_mla_sparse_kv_strided_view(rng, layout):
    q, kv, indices = _sparse_case(rng, 2, 2, 8, 64, 16, num_blocks=6)
    _, view = strided_kv(kv, layout)
    assert not view.flags.c_contiguous
    out, lse = deca.mla_decode_sparse(q, view, indices, return_lse=True)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


@pytest.mark.parametrize("with_length,with_sink", [(False, False), (True, False), (True, True),
                                                   (False, True)])
def test_mla_sparse_matches_numpy(rng, with_length, with_sink):
    batch, q_len, heads, topk, page = 3, 2, 8, 24, 16
    q, kv, indices = _sparse_case(rng, batch, q_len, heads, topk, page, num_blocks=6)
    topk_length = None
    if with_length:
        topk_length = np.array([topk, 5, 0], np.int32)  # the last request sees nothing
        # Indices past topk_length must not be read: point them at poisoned tokens.
        indices[1, :, 5:] = rng.integers(0, 10, (q_len, topk - 5))
        indices[2] = 3
    sink = rng.normal(0.0, 1.5, heads).astype(np.float32) if with_sink else None
    out, lse = deca.mla_decode_sparse(q, kv, indices, topk_length=topk_length, attn_sink=sink,
                                      return_lse=True)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices, topk_length, sink)
    close(out, want, "bf16")
    close_lse(lse, want_lse)
    if with_length:
        assert (out[2].astype(np.float32) == 0).all() and np.isneginf(lse[2]).all()


def test_mla_sparse_all_skipped_row(rng):
    q, kv, indices = _sparse_case(rng, 2, 1, 4, 8, 16, num_blocks=2)
    indices[1] = -1
    out, lse = deca.mla_decode_sparse(q, kv, indices, return_lse=True)
    assert (out[1].astype(np.float32) == 0).all() and np.isneginf(lse[1]).all()
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_mla_plan_lse_of_empty_row(rng):
    """MlaPlan(lse_of_empty_row="+inf") (FlashMLA's convention, what deca.compat asks for): the
    rows without a valid key get LSE +inf where the default plan writes -inf; outputs and every
    other LSE are the same bytes. Dense (an empty request) and sparse (a row of -1 only,
    topk_length 0)."""
    q, kv, table, lens = _dense_case(rng, [0, 2, 40], 2, 4, 16)
    runs = {}
    for convention in ("-inf", "+inf"):
        plan = deca.MlaPlan(4, page_size=16, max_batch=3, max_q_len=2, max_seq_len=64,
                            lse_of_empty_row=convention)
        assert plan.config.lse_of_empty_row == convention
        out = np.full((3, 2, 4, 512), np.nan, ref.BF16)
        lse = np.full((3, 2, 4), np.nan, np.float32)
        plan.run_dense(q, kv, table, lens, out, lse=lse)
        runs[convention] = out, lse
    (out0, lse0), (out1, lse1) = runs["-inf"], runs["+inf"]
    assert np.array_equal(out0.view(np.uint16), out1.view(np.uint16))
    empty = np.isneginf(lse0)
    assert empty.sum() == 4 * 2  # request 0's two tokens
    assert np.isposinf(lse1[empty]).all()
    assert np.array_equal(lse0[~empty].view(np.uint32), lse1[~empty].view(np.uint32))

    q, kv, indices = _sparse_case(rng, 3, 1, 4, 16, 16, num_blocks=4)
    indices[1] = -1
    topk_length = np.array([16, 16, 0], np.int32)
    got = {}
    for convention in ("-inf", "+inf"):
        plan = deca.MlaPlan(4, sparse=True, topk=16, page_size=16, max_batch=3, topk_length=True,
                            lse_of_empty_row=convention)
        out = np.full((3, 1, 4, 512), np.nan, ref.BF16)
        lse = np.full((3, 1, 4), np.nan, np.float32)
        plan.run_sparse(q, kv, indices, out, topk_length=topk_length, lse=lse)
        got[convention] = out, lse
    assert np.array_equal(got["-inf"][0].view(np.uint16), got["+inf"][0].view(np.uint16))
    assert np.isneginf(got["-inf"][1][1:]).all() and np.isposinf(got["+inf"][1][1:]).all()
    assert np.array_equal(got["-inf"][1][0].view(np.uint32), got["+inf"][1][0].view(np.uint32))
    with pytest.raises(deca.Error, match=r'MlaPlan: lse_of_empty_row: expected "-inf" or "\+inf", '
                                         r"got 'inf'"):
        deca.MlaPlan(4, lse_of_empty_row="inf")
