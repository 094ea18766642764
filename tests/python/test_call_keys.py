"""The keys the plan-less entry points find a call's prepared shape by (deca._tensors.call_key,
py_key): what they tell apart and what they do not describe; and, on every entry point, that a
repeated call whose shape, dtype or layout changed is checked again and raises what a first
call raises."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import deca  # noqa: E402
import deca.compat as compat  # noqa: E402
from cases import PagedCase, csr_pages  # noqa: E402
from deca import _plan_cache  # noqa: E402
from deca._tensors import FALLBACKS, call_key, py_key, stream_getter  # noqa: E402
from test_compat_torch import DEV, T  # noqa: E402

def test_call_key_tells_shapes_dtypes_devices_and_values_apart():
    """Through DLPack's exchange API, or (DECA_PY_DLPACK_EXCHANGE=0, an older torch) through the
    tensors' attributes: the same distinctions."""
    x = torch.zeros(2, 3, dtype=torch.bfloat16, device=DEV)
    same = torch.ones(2, 3, dtype=torch.bfloat16, device=DEV)
    assert call_key((x, 1, None), ("NHD", 0.5)) == call_key((same, 1, None), ("NHD", 0.5))
    # What the prepared calls do not derive anything from: a tensor's strides and values.
    assert call_key((torch.empty(3, 2, dtype=x.dtype, device=DEV).t(),), ()) == call_key((x,), ())
    different = [
        ((torch.zeros(3, 2, dtype=x.dtype, device=DEV), 1, None), ()),  # shape
        ((torch.zeros(2, 3, 1, dtype=x.dtype, device=DEV), 1, None), ()),  # rank
        ((x.half(), 1, None), ()),  # dtype
        ((x.float(), 1, None), ()),
        ((x, True, None), ()),  # True is not 1
        ((x, 1.0, None), ()),  # nor 1.0
        ((x, 1, "None"), ()),
        ((x, 1, (None,)), ()),
        ((x, 2, None), ()),
        ((None, x, 1), ()),  # order
        ((x, 1), (None,)),  # which tuple
        ((x, 1, None), (-1,)),
        ((x, 1, None), ((-1, -1),)),
        ((x, 1, None), ((-1, 0),)),
        ((x, 1, None), ("NHD",)),
        ((x, 1, None), ("HND",)),
    ]
    if DEV != "cpu":
        different.append(((x.cpu(), 1, None), ()))  # device
    keys = {call_key(*p) for p in different} | {call_key((x, 1, None), ())}
    assert len(keys) == len(different) + 1 and None not in keys
    assert call_key(((x, same), None), ()) == call_key(((same, x), None), ())  # a (k, v) pair
    # What it does not describe: the caller then keys by py_key.
    for other in (np.zeros(3), [1, 2], torch.nn.Parameter(x.float()), object(), 2 ** 70):
        assert call_key((x, other), ()) is None
    # A tensor among the options: its metadata would not name its value.
    assert call_key((x,), (torch.tensor(0.5, device=DEV),)) is None
    assert call_key([x], ()) is None  # tuples only
    long = tuple(range(300))  # past call_key's buffer: keyed in Python
    assert call_key((x,), long) is None and py_key((x,), long) is not None


def test_py_key_describes_numpy_torch_and_plain_values():
    a, b = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    assert py_key((a, 1), ((-1, -1),)) == py_key((b, 1), ((-1, -1),))
    assert py_key((a,), ()) != py_key((a.astype(np.float16),), ()) != py_key((a.T,), ())
    t = torch.zeros(2, 3)
    assert py_key((t,), (np.int64(4),)) == py_key((torch.ones(2, 3),), (np.int64(4),))
    assert py_key((t,), (np.int64(4),)) != py_key((t,), (np.int64(5),))
    assert py_key(((t, a),), ()) == py_key(((torch.ones(2, 3), b),), ())  # a (k, v) pair
    assert py_key((t,), ()) != py_key((t.double(),), ())
    assert py_key((t,), ([1],)) is None  # not hashable
    assert py_key((torch.nn.Parameter(t),), ()) is None  # a subclass: prepared anew every call
    assert py_key((t,), (torch.tensor(0.5),)) is None  # an option's value in a tensor
    assert py_key((t,), (np.zeros(2),)) is None


def test_an_option_given_as_a_tensor_is_not_keyed_by_its_shape(rng):
    """softmax_scale as a one-element tensor: two calls with different values give each value's
    result (the call is prepared anew, never found by the tensor's shape)."""
    case = PagedCase(rng, seq_lens=[40, 7], hq=8, hkv=2, d=64, page=16)
    q, k, v, lens, table = (T(x) for x in (case.q, case.k, case.v, case.seq_lens,
                                           case.page_table))
    for scale in (0.05, 0.2, 0.05):
        got = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                             causal=True, softmax_scale=torch.tensor(scale))
        want = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              causal=True, softmax_scale=scale)
        assert torch.equal(got, want)


def _message(fn, *a, **kw):
    with pytest.raises(deca.Error) as info:
        fn(*a, **kw)
    return str(info.value)


def _changed_calls_raise(good, bad_calls):
    """Each bad call raises, after good() ran twice (its shape prepared, then the fast path), the
    message it raises with nothing prepared; good() then still takes the fast path."""
    cold = []
    for bad in bad_calls:
        _plan_cache.clear()
        cold.append(_message(bad))
    good()
    good()
    for bad, want in zip(bad_calls, cold):
        assert _message(bad) == want
    before = sum(FALLBACKS.values())
    good()
    assert sum(FALLBACKS.values()) == before


def test_flash_attn_changed_calls_raise(rng):
    case = PagedCase(rng, seq_lens=[40, 7], hq=8, hkv=2, d=64, page=16)
    q, k, v, lens, table = (T(x) for x in (case.q, case.k, case.v, case.seq_lens,
                                           case.page_table))

    def call(q=q, k=k, v=v, lens=lens, table=table):
        return compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              causal=True, return_softmax_lse=True)
    hnd = (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    bad = [lambda: call(table=table.long()), lambda: call(lens=lens.long()),
           lambda: call(q=q.float()), lambda: call(k=hnd[0], v=hnd[1]),
           lambda: call(q=q[:, :, :3]), lambda: call(v=v.half())]
    _changed_calls_raise(call, bad)
    assert "k_cache looks like" in _message(bad[3])  # the HND hint


@pytest.mark.parametrize("combined", [False, True])
def test_flashinfer_changed_runs_raise(rng, combined):
    """plan() promised 8 query heads, 2 KV heads, head_dim 64, pages of 16, bf16 and batch 3: a
    run() with anything else raises, after runs of the planned shape too."""
    case = PagedCase(rng, seq_lens=[40, 7, 16], hq=8, hkv=2, d=64, page=16)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8, device=DEV))
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16, q_data_type=torch.bfloat16)
    q, k, v = T(case.q)[:, 0], T(case.k), T(case.v)

    def cache(k, v):
        return torch.stack([k, v], dim=1) if combined else (k, v)

    def run(q=q, kv=cache(k, v)):
        return w.run(q, kv)
    pages32 = (k[:6].reshape(3, 32, 2, 64), v[:6].reshape(3, 32, 2, 64))
    hnd = (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    bad = [lambda: run(q=torch.cat([q, q], 1)), lambda: run(q=q[:2]), lambda: run(q=q.half()),
           lambda: run(kv=cache(*pages32)), lambda: run(kv=cache(k.half(), v.half())),
           lambda: run(kv=cache(*hnd))]
    cold = []
    for b in bad:
        w._fast.clear()
        cold.append(_message(b))
    run()
    run()
    assert len(w._fast) == 1
    for b, want in zip(bad, cold):
        assert _message(b) == want and want.startswith("BatchDecodeWithPagedKVCacheWrapper.run:")
    assert "kv_layout=\"HND\"" in cold[-1]


def test_flash_mla_changed_calls_raise(rng):
    from test_mla import _sparse_case
    q, kv, indices = (T(x) for x in _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6))
    meta, _ = compat.get_mla_metadata()

    def call(q=q, kv=kv, indices=indices):
        return compat.flash_mla_with_kvcache(q, kv, None, None, 512, meta, None,
                                             is_fp8_kvcache=True, indices=indices)
    bf16_cache = torch.zeros(6, 16, 1, 576, dtype=torch.bfloat16, device=DEV)
    bad = [lambda: call(indices=indices.long()), lambda: call(q=q.half()),
           lambda: call(kv=bf16_cache), lambda: call(kv=kv[..., :600])]
    _changed_calls_raise(call, bad)


def test_one_off_changed_calls_raise(rng):
    case = PagedCase(rng, seq_lens=[40, 7], hq=8, hkv=2, d=64, page=16)
    q, k, v, lens, table = (T(x) for x in (case.q, case.k, case.v, case.seq_lens,
                                           case.page_table))

    def gqa(q=q, k=k, table=table):
        return deca.gqa_decode(q, k, v, table, lens, return_lse=True)
    _changed_calls_raise(gqa, [lambda: gqa(table=table.long()), lambda: gqa(q=q.float()),
                               lambda: gqa(k=k.half())])
    from test_mla import _sparse_case
    mq, mkv, midx = (T(x) for x in _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6))

    def mla(q=mq, indices=midx):
        return deca.mla_decode_sparse(q, mkv, indices, return_lse=True)
    _changed_calls_raise(mla, [lambda: mla(indices=midx.long()), lambda: mla(q=mq.half())])


@pytest.mark.skipif(DEV == "cpu", reason="needs a CUDA device")
def test_stream_getter_follows_torchs_current_stream():
    """A prepared call's bound stream lookup answers torch's current stream at call time."""
    x = torch.zeros(1, device=DEV)
    get = stream_getter(torch.device(DEV).index or 0, x)
    assert get() == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert get() == side.cuda_stream
    assert stream_getter(-1, x)() == 0
