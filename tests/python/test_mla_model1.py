"""DeepSeek V4's MODEL1 sparse MLA decode on the CPU backend: the 584-byte page packer, the op
with one and two caches against the float64 numpy reference (written from docs/semantics.md),
MlaPlan.run_sparse, deca.compat.flash_mla_with_kvcache with FlashMLA's argument names and LSE
convention, and every error a caller can meet in the Python layer."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import close, close_lse
from deca import compat


def model1_cache(rng, blocks, page, *, pad=0, poison_ids=()):
    """A packed MODEL1 cache [blocks, page, 1, 584] over pages of the padded size (+ pad
    bytes), every byte outside the packed rows and scales 0xFF (NaN), the pad byte of every
    token 0xFF, and the tokens `poison_ids` wholly 0xFF: a reader that touches them gets NaN."""
    latent = rng.standard_normal((blocks, page, 1, 512))
    latent[..., :448] *= rng.uniform(0.01, 10.0, (blocks, page, 1, 1))  # varied scales
    stride = deca.mla_model1_page_bytes(page) + pad
    flat = np.full((blocks, stride), 0xFF, np.uint8)
    view = np.lib.stride_tricks.as_strided(flat, (blocks, page, 1, 584), (stride, 584, 584, 1))
    out = deca.pack_mla_fp8(latent.astype(ref.BF16), view, format="model1")
    assert out is view
    for b in range(blocks):
        flat[b, page * 576 + 7:page * 584:8] = 0xFF  # the pad bytes
    for x in poison_ids:
        b, s = divmod(int(x), page)
        flat[b, s * 576:(s + 1) * 576] = 0xFF
        flat[b, page * 576 + s * 8:page * 576 + s * 8 + 8] = 0xFF
    return flat, view


def ragged_lengths(rng, batch, topk, first_empty):
    """[batch] int32 in 0..topk: request `first_empty` counts nothing, the last request all."""
    lengths = rng.integers(0, topk + 1, batch).astype(np.int32)
    lengths[-1] = topk
    lengths[first_empty] = 0
    return lengths


def selection(rng, batch, q_len, topk, tokens, lengths):
    """(indices [batch, q_len, topk], the ids counted): ids of tokens 1.. (token 0 is never
    selected), -1 holes, a duplicate per row; past a request's length (lengths None: all count)
    ids outside the pool."""
    idx = rng.integers(1, tokens, (batch, q_len, topk)).astype(np.int32)
    idx[rng.random(idx.shape) < 0.2] = -1
    if topk > 1:
        idx[:, :, 1] = idx[:, :, 0]  # duplicates count twice
    used = set()
    for b in range(batch):
        n = topk if lengths is None else lengths[b]
        idx[b, :, n:] = 1 << 30
        used.update(int(x) for x in idx[b, :, :n].ravel() if x >= 0)
    return idx, used


def model1_case(rng, *, batch=2, q_len=1, heads=8, page=64, blocks=3, topk=32, extra=None,
                ragged=False, sink=False, pad=0):
    """q, (cache view, indices, lengths) of both caches and the sink; extra = (page, blocks,
    topk) of the second cache, or None. Unselected tokens are poisoned. Ragged lengths leave
    request 0 without keys in the first cache and request 1 (when there is one) in the second."""
    tokens = blocks * page
    lengths = ragged_lengths(rng, batch, topk, 0) if ragged else None
    idx, used = selection(rng, batch, q_len, topk, tokens, lengths)
    _, kv = model1_cache(rng, blocks, page, pad=pad,
                         poison_ids=sorted(set(range(tokens)) - used))
    second = None
    if extra is not None:
        epage, eblocks, etopk = extra
        etokens = epage * eblocks
        elen = ragged_lengths(rng, batch, etopk, min(1, batch - 1)) if ragged else None
        eidx, eused = selection(rng, batch, q_len, etopk, etokens, elen)
        _, ekv = model1_cache(rng, eblocks, epage, pad=pad,
                              poison_ids=sorted(set(range(etokens)) - eused))
        second = (ekv, eidx, elen)
    q = rng.standard_normal((batch, q_len, heads, 512)).astype(ref.BF16)
    attn_sink = None
    if sink:
        attn_sink = rng.normal(0.0, 1.5, heads).astype(np.float32)
        attn_sink[::5] = np.inf  # the row's output is zero, its LSE unchanged
        attn_sink[2::5] = -np.inf  # as no sink
    return q, kv, idx, lengths, second, attn_sink


def extra_kwargs(second):
    if second is None:
        return {}
    return dict(extra_kv_cache=second[0], extra_indices=second[1], extra_topk_length=second[2])


# --- the packer --------------------------------------------------------------------------------

def test_pack_allocates_padded_pages_and_round_trips(rng):
    latent = rng.standard_normal((3, 5, 1, 512)).astype(ref.BF16)
    packed = deca.pack_mla_fp8(latent, format="model1")
    assert packed.shape == (3, 5, 1, 584) and packed.dtype == np.uint8
    assert packed.strides == (deca.mla_model1_page_bytes(5), 584, 584, 1) == (3456, 584, 584, 1)
    back = deca.unpack_mla_fp8(packed, format="model1")
    assert back.shape == (3, 5, 1, 512) and back.dtype == np.float32
    want = np.array([ref.unpack_model1_token(packed, x) for x in range(15)]).reshape(back.shape)
    np.testing.assert_array_equal(back, want)
    # e4m3 keeps 3 mantissa bits under a power-of-two scale: within 2^-4 relative, plus the
    # smallest step of the tile's scale; RoPE values exactly.
    np.testing.assert_array_equal(back[..., 448:], latent[..., 448:].astype(np.float32))
    x = latent[..., :448].astype(np.float64)
    amax = np.abs(x).reshape(3, 5, 1, 7, 64).max(-1, keepdims=True)
    err = np.abs(back[..., :448] - x).reshape(3, 5, 1, 7, 64)
    assert (err <= np.abs(x).reshape(err.shape) / 16 + amax / 448 * 2 ** -6).all()
    bf16 = deca.unpack_mla_fp8(packed, out_dtype="bf16", format="model1")
    np.testing.assert_array_equal(bf16.astype(np.float32), back.astype(ref.BF16).astype(np.float32))


def test_pack_into_a_strided_out_leaves_the_padding(rng):
    latent = rng.standard_normal((2, 3, 1, 512)).astype(ref.BF16)
    flat, view = model1_cache(rng, 2, 3, pad=64)
    flat[:] = 0x11
    deca.pack_mla_fp8(latent, view, format="model1")
    assert (flat[:, 3 * 584:] == 0x11).all()  # padding and the extra 64 bytes untouched
    assert (flat[:, 3 * 576 + 7:3 * 584:8] == 0).all()  # pad bytes written 0


def test_pack_errors():
    latent = np.zeros((2, 4, 1, 512), ref.BF16)
    with pytest.raises(deca.Error, match=r'pack_mla_fp8: format: expected "fp8_sparse" or '
                                         r'"model1", got \'v4\''):
        deca.pack_mla_fp8(latent, format="v4")
    with pytest.raises(deca.Error, match=r"pack_mla_fp8: src: expected shape \[num_blocks, "
                                         r"page_size, 1, 512\] \(format \"model1\"\), got "
                                         r"\[2, 4, 576\]"):
        deca.pack_mla_fp8(np.zeros((2, 4, 576), ref.BF16), format="model1")
    dense = np.zeros((2, 4, 1, 584), np.uint8)  # slot stride 584 but blocks 2336 apart
    with pytest.raises(deca.Error, match=r"pack_mla_fp8: out: expected the stride of dim 0 "
                                         r"\(num_blocks\) >= 2880 bytes .* got 2336 bytes"):
        deca.pack_mla_fp8(latent, dense, format="model1")
    with pytest.raises(deca.Error, match=r"unpack_mla_fp8: src: expected shape \[num_blocks, "
                                         r"page_size, 1, 584\] \(format kModel1\)"):
        deca.unpack_mla_fp8(np.zeros((2, 4, 1, 656), np.uint8), format="model1")
    bad = latent.copy()
    bad[1, 2, 0, 7] = np.nan
    with pytest.raises(deca.Error, match="pack_mla_fp8: src: expected finite values"):
        deca.pack_mla_fp8(bad, format="model1")


# --- the op ------------------------------------------------------------------------------------

CASES = {
    "one-cache": dict(),
    "two-caches": dict(extra=(2, 40, 16)),
    "ragged-both": dict(batch=4, extra=(64, 2, 32), ragged=True),
    "heads16-qlen4-pages2-256": dict(heads=16, q_len=4, page=2, blocks=40, extra=(256, 1, 64),
                                     sink=True),
    "heads100-pages61-1": dict(heads=100, q_len=2, page=61, extra=(1, 30, 8), ragged=True,
                               batch=3, sink=True),
    "heads128-qlen2": dict(heads=128, q_len=2, topk=16, extra=(64, 2, 16), sink=True),
    "heads64-padded-blocks": dict(heads=64, extra=(2, 20, 8), pad=96, ragged=True, batch=3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model1_matches_numpy(rng, name):
    q, kv, idx, lengths, second, sink = model1_case(rng, **CASES[name])
    out, lse = deca.mla_decode_sparse(q, kv, idx, topk_length=lengths, attn_sink=sink,
                                      return_lse=True, **extra_kwargs(second))
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, idx, lengths, sink, extra=second)
    assert np.isfinite(out.astype(np.float32)).all()
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_model1_rows_without_keys_and_strided_q(rng):
    q, kv, idx, lengths, second, _ = model1_case(rng, batch=3, q_len=2, heads=8,
                                                 extra=(2, 30, 8), ragged=True)
    idx[2, 1] = -1
    second[1][2, 1] = -1  # request 2's second query: only -1 in both caches
    second[2][0] = 0  # request 0: no entry counts in either cache
    big = np.zeros((3, 2, 8, 640), ref.BF16)
    big[..., :512] = q
    qv = big[..., :512]  # head stride 640
    out, lse = deca.mla_decode_sparse(qv, kv, idx, topk_length=lengths, return_lse=True,
                                      **extra_kwargs(second))
    assert (out[0].astype(np.float32) == 0).all() and np.isneginf(lse[0]).all()
    assert (out[2, 1].astype(np.float32) == 0).all() and np.isneginf(lse[2, 1]).all()
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, idx, lengths, extra=second)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_model1_softmax_scale_default_is_for_512_dims(rng):
    q, kv, idx, _, second, _ = model1_case(rng, extra=(2, 30, 8))
    a = deca.mla_decode_sparse(q, kv, idx, **extra_kwargs(second))
    b = deca.mla_decode_sparse(q, kv, idx, softmax_scale=512 ** -0.5, **extra_kwargs(second))
    np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))
    c = deca.mla_decode_sparse(q, kv, idx, softmax_scale=576 ** -0.5, **extra_kwargs(second))
    assert not np.array_equal(a.astype(np.float32), c.astype(np.float32))


def test_model1_plan_run_sparse(rng):
    q, kv, idx, lengths, second, sink = model1_case(rng, batch=3, q_len=2, extra=(2, 30, 8),
                                                    ragged=True, sink=True)
    plan = deca.MlaPlan(8, sparse=True, kv_format="model1", page_size=64, max_batch=3,
                        max_q_len=2, topk=32, attn_sink=True, topk_length=True, extra_topk=8,
                        extra_page_size=2, extra_topk_length=True)
    assert plan.kv_format == "model1" and plan.config.extra_topk == 8
    out = np.zeros((3, 2, 8, 512), ref.BF16)
    lse = np.zeros((3, 2, 8), np.float32)
    from deca._tensors import FALLBACKS
    before = dict(FALLBACKS)
    for _ in range(2):  # both runs take the fast path: nothing falls back to the checked import
        plan.run_sparse(q, kv, idx, out, topk_length=lengths, attn_sink=sink, lse=lse,
                        extra_kv_cache=second[0], extra_indices=second[1],
                        extra_topk_length=second[2])
        want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, idx, lengths, sink,
                                        extra=second)
        close(out, want, "bf16")
        close_lse(lse, want_lse)
    assert dict(FALLBACKS) == before
    with pytest.raises(deca.Error, match=r"mla_decode_sparse: extra_topk_length\[2\]: expected "
                                         r"0\.\.8 \(plan.config.extra_topk\), got 9"):
        plan.run_sparse(q, kv, idx, out, topk_length=lengths, attn_sink=sink, lse=lse,
                        extra_kv_cache=second[0], extra_indices=second[1],
                        extra_topk_length=np.array([0, 0, 9], np.int32))


def test_model1_errors(rng):
    q, kv, idx, _, second, _ = model1_case(rng, extra=(2, 30, 8))
    fn = "mla_decode_sparse"
    with pytest.raises(deca.Error, match=rf"{fn}: extra_indices: expected a tensor with "
                                         r"extra_kv_cache \(the second cache and its indices "
                                         r"come together\), got None"):
        deca.mla_decode_sparse(q, kv, idx, extra_kv_cache=second[0])
    with pytest.raises(deca.Error, match=rf"{fn}: extra_topk_length: expected None without "
                                         r"extra_kv_cache and extra_indices"):
        deca.mla_decode_sparse(q, kv, idx, extra_topk_length=np.zeros(2, np.int32))
    with pytest.raises(deca.Error, match=rf"{fn}: q: dim 3 \(head_dim\): expected 512 \(448 "
                                         r"NoPE \+ 64 RoPE: plan.config.kv_format kModel1\), "
                                         r"got 576"):
        deca.mla_decode_sparse(np.zeros((2, 1, 8, 576), ref.BF16), kv, idx)
    with pytest.raises(deca.Error, match=r"plan_mla_decode: config.extra_topk: expected 0 \(a "
                                         r"second cache is read by kModel1 sparse decode only; "
                                         r"kv_format is kFP8Sparse \(fp8_sparse\)\), got 8"):
        deca.mla_decode_sparse(q, kv, idx, kv_format="fp8_sparse", **extra_kwargs(second))
    with pytest.raises(deca.Error, match=rf'{fn}: kv_format: expected "default" or '
                                         r'"fp8_sparse" or "model1", got \'bf16\''):
        deca.mla_decode_sparse(q, kv, idx, kv_format="bf16")
    bad = idx.copy()
    bad[1, 0, 3] = 192  # 3 blocks * 64
    with pytest.raises(deca.Error, match=rf"{fn}: indices\[1\]\[0\]\[3\]: expected -1 \(skip\) "
                                         r"or a token id in \[0, 192\)"):
        deca.mla_decode_sparse(q, kv, bad, **extra_kwargs(second))
    dense = np.zeros((3, 64, 1, 584), np.uint8)
    with pytest.raises(deca.Error, match=rf"{fn}: kv_cache: expected the stride of dim 0 "
                                         r"\(num_blocks\) >= 37440 bytes"):
        deca.mla_decode_sparse(q, dense, idx, **extra_kwargs(second))
    with pytest.raises(deca.Error, match=r"MlaPlan: kv_format: expected .* \"model1\", got "
                                         r"'v4'"):
        deca.MlaPlan(8, sparse=True, topk=32, kv_format="v4")


# --- deca.compat.flash_mla_with_kvcache ---------------------------------------------------------

def test_flash_mla_model1_two_caches(rng):
    q, kv, idx, lengths, second, sink = model1_case(rng, batch=3, q_len=2, heads=16,
                                                    extra=(2, 30, 8), ragged=True, sink=True)
    meta, splits = compat.get_mla_metadata()
    # FlashMLA keeps the cache as float8_e4m3fn bytes: deca reads them as they are.
    out, lse = compat.flash_mla_with_kvcache(
        q, kv.view(ref.FP8), None, None, 512, meta, splits, is_fp8_kvcache=True, indices=idx,
        attn_sink=sink, extra_k_cache=second[0].view(ref.FP8),
        extra_indices_in_kvcache=second[1], topk_length=lengths, extra_topk_length=second[2])
    assert out.shape == (3, 2, 16, 512) and lse.shape == (3, 16, 2)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, idx, lengths, sink, extra=second)
    close(out, want, "bf16")
    want_lse = want_lse.swapaxes(1, 2)
    # FlashMLA's convention: +inf for a row without a valid key, where deca gives -inf.
    close_lse(lse, np.where(np.isneginf(want_lse), np.inf, want_lse))
    # The metadata's step schedule serves a second layer of the same shape.
    out2, _ = compat.flash_mla_with_kvcache(
        q, kv, None, None, 512, meta, splits, is_fp8_kvcache=True, indices=idx, attn_sink=sink,
        extra_k_cache=second[0], extra_indices_in_kvcache=second[1], topk_length=lengths,
        extra_topk_length=second[2])
    np.testing.assert_array_equal(out2.astype(np.float32), out.astype(np.float32))


def test_flash_mla_model1_one_cache_default_scale(rng):
    q, kv, idx, _, _, _ = model1_case(rng, q_len=1, heads=8)
    out, lse = compat.flash_mla_with_kvcache(q, kv, None, None, 512, None, None,
                                             is_fp8_kvcache=True, indices=idx)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, idx, softmax_scale=512 ** -0.5)
    close(out, want, "bf16")
    close_lse(lse, want_lse.swapaxes(1, 2))


def test_flash_mla_model1_errors(rng):
    q, kv, idx, _, second, _ = model1_case(rng, extra=(2, 30, 8))
    fn = "flash_mla_with_kvcache"
    args = dict(is_fp8_kvcache=True, indices=idx)
    with pytest.raises(deca.Error, match=rf"{fn}: extra_indices_in_kvcache: expected a tensor "
                                         r"with extra_k_cache"):
        compat.flash_mla_with_kvcache(q, kv, None, None, 512, None, None,
                                      extra_k_cache=second[0], **args)
    with pytest.raises(deca.Error, match=rf"{fn}: k_cache: expected \[num_blocks, "
                                         r"page_block_size, 1, 584\], got \[3, 64, 1, 656\] "
                                         r"\(MODEL1"):
        compat.flash_mla_with_kvcache(q, np.zeros((3, 64, 1, 656), np.uint8), None, None, 512,
                                      None, None, **args)
    with pytest.raises(deca.Error, match=rf"{fn}: q: dim 3 \(head_dim\): expected 576 \(V3.2"):
        compat.flash_mla_with_kvcache(np.zeros((2, 1, 8, 500), ref.BF16), kv, None, None, 512,
                                      None, None, **args)
    with pytest.raises(deca.Error, match=rf"{fn}: extra_indices_in_kvcache: expected \[batch, "
                                         r"s_q, extra_topk\] with q's batch and s_q \(2, 1\), "
                                         r"got \[1, 1, 8\]"):
        compat.flash_mla_with_kvcache(q, kv, None, None, 512, None, None,
                                      extra_k_cache=second[0],
                                      extra_indices_in_kvcache=second[1][:1], **args)
    bad = second[1].copy()
    bad[0, 0, 0] = 60  # 30 blocks * 2
    with pytest.raises(deca.Error, match=rf"{fn}: extra_indices_in_kvcache\[0\]\[0\]\[0\]: "
                                         r"expected -1 \(skip\) or a token id in \[0, 60\)"):
        compat.flash_mla_with_kvcache(q, kv, None, None, 512, None, None,
                                      extra_k_cache=second[0], extra_indices_in_kvcache=bad,
                                      **args)
    v32_q = np.zeros((2, 1, 8, 576), ref.BF16)
    with pytest.raises(deca.Error, match=rf"{fn}: extra_k_cache: expected None with a V3.2 "
                                         r"call"):
        compat.flash_mla_with_kvcache(v32_q, np.zeros((3, 64, 1, 656), np.uint8), None, None,
                                      512, None, None, extra_k_cache=second[0], **args)


def test_torch_op_and_compat_on_cpu_tensors(rng):
    """torch.ops.deca.mla_decode_sparse and the compat call with torch tensors (the cache as
    float8_e4m3fn bytes, FlashMLA's dtype) give the numpy calls' bits."""
    torch = pytest.importorskip("torch")
    import deca.torch_ops  # noqa: F401  (registers torch.ops.deca)

    q, kv, idx, lengths, second, sink = model1_case(rng, batch=2, q_len=2, heads=8,
                                                    extra=(2, 30, 8), ragged=True, sink=True)
    want, want_lse = deca.mla_decode_sparse(q, kv, idx, topk_length=lengths, attn_sink=sink,
                                            return_lse=True, **extra_kwargs(second))

    def t(a):
        if a.dtype == ref.BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    tkv, tekv = t(kv), t(second[0])
    assert tkv.stride() == kv.strides  # the padded pages, element size 1
    out = torch.empty((2, 2, 8, 512), dtype=torch.bfloat16)
    lse = torch.empty((2, 2, 8), dtype=torch.float32)
    torch.ops.deca.mla_decode_sparse(t(q), tkv, t(idx), out, lse, t(lengths), t(sink), 0.0,
                                     tekv, t(second[1]), t(second[2]))
    np.testing.assert_array_equal(out.float().numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(lse.numpy(), want_lse)

    f8 = torch.float8_e4m3fn
    o, l = compat.flash_mla_with_kvcache(
        t(q), tkv.view(f8), None, None, 512, None, None, is_fp8_kvcache=True, indices=t(idx),
        attn_sink=t(sink), extra_k_cache=tekv.view(f8), extra_indices_in_kvcache=t(second[1]),
        topk_length=t(lengths), extra_topk_length=t(second[2]))
    np.testing.assert_array_equal(o.float().numpy(), want.astype(np.float32))
    flash_lse = want_lse.swapaxes(1, 2)
    np.testing.assert_array_equal(l.numpy(), np.where(np.isneginf(flash_lse), np.inf, flash_lse))
