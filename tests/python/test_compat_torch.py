"""deca.compat and the torch custom ops with torch tensors: on CUDA when a GPU is present, else
on the CPU backend. Same inputs through the wrappers and through deca's own API (bitwise),
torch.compile(fullgraph=True) holding the ops, torch.library.opcheck of their registration, and
a CUDA-graph capture of the FlashAttention call."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import deca  # noqa: E402  (torch first, as engines import it: deca.compat registers its ops)
import deca.compat as compat  # noqa: E402
import numpy_reference as ref  # noqa: E402
from cases import PagedCase  # noqa: E402
DEV = "cuda:0" if torch.cuda.is_available() else "cpu"
# torch.compile traces these wrappers: they must not look modules up in sys.modules (conftest).
pytestmark = pytest.mark.usefixtures("sys_modules_off_limits")


def T(a):
    """numpy (ml_dtypes included) -> torch tensor on DEV with the same dtype and bits."""
    if a.dtype == ref.BF16:
        t = torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    elif a.dtype == ref.FP8:
        t = torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(DEV)


def same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def flash_mla_lse(deca_lse):
    """deca's LSE [batch, s_q, h] as FlashMLA returns it: [batch, h, s_q], +inf for a row
    without a valid key (deca: -inf)."""
    lse = deca_lse.transpose(1, 2).contiguous()
    lse[lse == float("-inf")] = float("inf")
    return lse


def _fa_inputs(rng, q_len=1, kv_dtype="bf16"):
    case = PagedCase(rng, seq_lens=[70, 3, 33], q_len=q_len, hq=8, hkv=2, d=64, page=16,
                     kv_dtype=kv_dtype, k_scale=0.05 if kv_dtype != "bf16" else 1.0,
                     v_scale=0.05 if kv_dtype != "bf16" else 1.0)
    return case, [T(x) for x in (case.q, case.k, case.v, case.seq_lens, case.page_table)]


def test_ops_are_registered():
    import deca.torch_ops  # noqa: F401
    for name in ("gqa_decode", "mla_decode_sparse", "mla_decode_dense"):
        assert hasattr(torch.ops.deca, name)


def test_flash_attn_torch_matches_gqa_decode(rng):
    case, (q, k, v, lens, table) = _fa_inputs(rng, q_len=2)
    out, lse = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              causal=True, window_size=(20, 0),
                                              return_softmax_lse=True)
    want, want_lse = deca.gqa_decode(q, k, v, table, lens, window=21, return_lse=True)
    same_bits(out, want)
    same_bits(lse, want_lse.transpose(1, 2))


def test_flash_attn_repeat_calls_take_the_memoised_plan(rng):
    """The second call of a shape takes the (plan, workspace) memoised by the tensors' own shape,
    dtype and device objects; each changed option or shape gets its own plan, and every call
    writes what deca's own API writes."""
    from deca import _plan_cache
    prepared = compat.flash_attn._PREPARED
    _plan_cache.clear()
    case, (q, k, v, lens, table) = _fa_inputs(rng)
    want = deca.gqa_decode(q, k, v, table, lens)
    for _ in range(3):
        same_bits(compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table), want)
    assert len(prepared) == 1
    windowed = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              window_size=(5, 0))
    same_bits(windowed, deca.gqa_decode(q, k, v, table, lens, window=6))
    two = compat.flash_attn_with_kvcache(q[:2], k, v, cache_seqlens=lens[:2], block_table=table[:2])
    same_bits(two, deca.gqa_decode(q[:2], k, v, table[:2], lens[:2]))
    assert len(prepared) == 3
    _plan_cache.clear()
    assert not prepared


def test_flash_attn_fp8_cache_with_descale(rng):
    case, (q, k, v, lens, table) = _fa_inputs(rng, kv_dtype="fp8_e4m3")
    out = compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                         causal=True, k_descale=0.05, v_descale=0.05)
    want = deca.gqa_decode(q, k, v, table, lens, k_scale=0.05, v_scale=0.05)
    same_bits(out, want)


def test_torch_compile_fullgraph_holds_the_op(rng):
    case, (q, k, v, lens, table) = _fa_inputs(rng)

    def attend(q, k, v, lens, table):
        return compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              causal=True, return_softmax_lse=True)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v, lens, table)
    want, want_lse = attend(q, k, v, lens, table)
    same_bits(out, want)
    same_bits(lse, want_lse)


def test_opcheck_gqa_decode(rng):
    import deca.torch_ops  # noqa: F401
    case, (q, k, v, lens, table) = _fa_inputs(rng)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=DEV)
    args = (q, k, v, table, lens, out, lse, None, None, None, "NHD", 0, "", 1.0, 1.0, 0.0,
            0.0, 0, 1.0, "auto", 0)
    torch.library.opcheck(torch.ops.deca.gqa_decode.default, args)


def test_flashinfer_torch_matches_gqa_decode(rng):
    page = 16
    case = PagedCase(rng, seq_lens=[40, 1, 0, 16], hq=8, hkv=2, d=64, page=page, layout="HND")
    counts = [-(-int(n) // page) for n in case.seq_lens]
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)
    indices = torch.tensor(np.concatenate([case.page_table[b, :c] for b, c in
                                           enumerate(counts)]), dtype=torch.int32)
    last = torch.tensor([(n - 1) % page + 1 if n else 0 for n in case.seq_lens],
                        dtype=torch.int32)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
    w.plan(indptr.to(DEV), indices.to(DEV), last.to(DEV), 8, 2, 64, page,
           q_data_type=torch.bfloat16)
    kv = torch.stack([T(case.k), T(case.v)], dim=1)
    out, lse = w.run(T(case.q)[:, 0], kv, return_lse=True)
    want, want_lse = deca.gqa_decode(T(case.q), T(case.k), T(case.v), T(case.page_table),
                                     T(case.seq_lens), layout="HND", return_lse=True)
    same_bits(out, want[:, 0])
    torch.testing.assert_close(lse, want_lse[:, 0] / np.log(2.0), rtol=1e-6, atol=0)


def test_flash_mla_sparse_torch(rng):
    from test_mla import _sparse_case
    q, kv, indices = _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6)
    meta, splits = compat.get_mla_metadata()
    try:
        out, lse = compat.flash_mla_with_kvcache(T(q), T(kv), None, None, 512, meta, splits,
                                                 is_fp8_kvcache=True, indices=T(indices))
    except deca.Error as e:
        if DEV != "cpu" and "cuda" in str(e).lower():
            pytest.skip(f"mla_decode_sparse has no CUDA kernel in this build: {e}")
        raise
    want, want_lse = deca.mla_decode_sparse(T(q), T(kv), T(indices), return_lse=True)
    same_bits(out, want)
    same_bits(lse, flash_mla_lse(want_lse))


def test_flash_mla_repeat_calls_take_the_memoised_plan(rng):
    """Repeated FlashMLA calls of one shape reuse the memoised (plan, workspace) and write what
    deca's own API writes; another topk gets its own."""
    from deca import _plan_cache
    from test_mla import _sparse_case
    prepared = compat.flash_mla._PREPARED
    _plan_cache.clear()
    q, kv, indices = _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6)
    want, want_lse = deca.mla_decode_sparse(T(q), T(kv), T(indices), return_lse=True)
    for _ in range(3):
        out, lse = compat.flash_mla_with_kvcache(T(q), T(kv), None, None, 512, None, None,
                                                 is_fp8_kvcache=True, indices=T(indices))
        same_bits(out, want)
        same_bits(lse, flash_mla_lse(want_lse))
    assert len(prepared) == 1
    half = T(np.ascontiguousarray(indices[:, :, :32]))
    out, _ = compat.flash_mla_with_kvcache(T(q), T(kv), None, None, 512, None, None,
                                           is_fp8_kvcache=True, indices=half)
    same_bits(out, deca.mla_decode_sparse(T(q), T(kv), half))
    assert len(prepared) == 2
    _plan_cache.clear()
    assert not prepared


def test_flash_mla_metadata_schedules_once_per_step(rng):
    """FlashMLA's metadata: the first sparse call of a step schedules, the later layers (same
    indices and topk_length, other q) reuse it, and each layer's output is deca's own call's."""
    from test_mla import _sparse_case
    q, kv, indices = _sparse_case(rng, 3, 2, 16, 64, 16, num_blocks=6)
    lengths = T(np.array([64, 9, 0], np.int32))
    meta, splits = compat.get_mla_metadata()
    for layer in range(3):
        ql = T(q) if layer == 0 else T(rng.standard_normal(q.shape).astype(ref.BF16))
        try:
            out, lse = compat.flash_mla_with_kvcache(ql, T(kv), None, None, 512, meta, splits,
                                                     is_fp8_kvcache=True, indices=T(indices),
                                                     topk_length=lengths)
        except deca.Error as e:
            if DEV != "cpu" and "cuda" in str(e).lower():
                pytest.skip(f"mla_decode_sparse has no CUDA kernel in this build: {e}")
            raise
        want, want_lse = deca.mla_decode_sparse(ql, T(kv), T(indices), topk_length=lengths,
                                                return_lse=True)
        same_bits(out, want)
        same_bits(lse, flash_mla_lse(want_lse))
        # On CUDA the metadata holds a scheduled workspace from the first layer on.
        assert meta._schedule._done == (DEV != "cpu")


def test_torch_compile_flash_mla_with_metadata_matches_eager(rng):
    """Under torch.compile the compat call with FlashMLA metadata runs the deca op, which
    schedules for itself; the compiled step gives the eager step's bytes."""
    from test_mla import _sparse_case
    q, kv, indices = _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6)
    q2 = T(rng.standard_normal(q.shape).astype(ref.BF16))
    kvt, it = T(kv), T(indices)

    def step(a, b):
        meta, splits = compat.get_mla_metadata()
        o1, _ = compat.flash_mla_with_kvcache(a, kvt, None, None, 512, meta, splits,
                                              is_fp8_kvcache=True, indices=it)
        o2, _ = compat.flash_mla_with_kvcache(b, kvt, None, None, 512, meta, splits,
                                              is_fp8_kvcache=True, indices=it)
        return o1, o2

    try:
        want = step(T(q), q2)
    except deca.Error as e:
        if DEV != "cpu" and "cuda" in str(e).lower():
            pytest.skip(f"mla_decode_sparse has no CUDA kernel in this build: {e}")
        raise
    got = torch.compile(step, backend="aot_eager")(T(q), q2)
    for g, w in zip(got, want):
        same_bits(g, w)


@pytest.mark.parametrize("fp8", [False, True])
def test_flash_mla_dense_torch_metadata_per_step(rng, fp8):
    """Dense FlashMLA calls (a bf16 cache, or the 656-byte cache with is_fp8_kvcache) over three
    layers of one step with one metadata object: the first schedules, the others reuse it (on
    CUDA), each writes deca's own call's bytes; the empty request's LSE is +inf."""
    from test_mla import _dense_case, dense_cache
    q, kv, table, lens = _dense_case(rng, [70, 0, 129, 5], 2, 16, 64)
    cache = dense_cache(kv, "fp8_sparse", rng)[0] if fp8 else kv
    meta, splits = compat.get_mla_metadata(T(lens), 2 * 16, 1, is_fp8_kvcache=fp8)
    for layer in range(3):
        ql = T(q) if layer == 0 else T(rng.standard_normal(q.shape).astype(ref.BF16))
        out, lse = compat.flash_mla_with_kvcache(ql, T(cache), T(table), T(lens), 512, meta,
                                                 splits, causal=True, is_fp8_kvcache=fp8)
        want, want_lse = deca.mla_decode_dense(ql, T(cache), T(table), T(lens),
                                               return_lse=True)
        same_bits(out, want)
        assert torch.isposinf(lse[1]).all() and torch.isneginf(want_lse[1]).all()
        want_lse[1] = float("inf")
        same_bits(lse, want_lse.transpose(1, 2))
        assert meta._schedule._done == (DEV != "cpu")


def test_torch_compile_flash_mla_dense_matches_eager(rng):
    """Under torch.compile(fullgraph=True) the dense compat call is one deca op (whose kernels
    write the +inf LSE of rows without keys): the compiled call gives the eager call's bytes."""
    from test_mla import _dense_case
    q, kv, table, lens = (T(x) for x in _dense_case(rng, [40, 0, 17], 2, 8, 16))

    def attend(q, kv, table, lens):
        return compat.flash_mla_with_kvcache(q, kv, table, lens, 512, None, None, causal=True)

    want = attend(q, kv, table, lens)
    got = torch.compile(attend, fullgraph=True, backend="aot_eager")(q, kv, table, lens)
    for g, w in zip(got, want):
        same_bits(g, w)


@pytest.mark.parametrize("empty_row_lse", ["-inf", "+inf"])
@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "fp8_sparse"])
def test_opcheck_mla_decode_dense(rng, kv_format, empty_row_lse):
    """The registered op, with its string argument lse_of_empty_row (FlashMLA's "+inf" too): an
    empty request's LSE is that value, everything else deca's own call's bytes."""
    import deca.torch_ops  # noqa: F401
    from test_mla import _dense_case, dense_cache
    q, kv, table, lens = _dense_case(rng, [40, 17, 0], 1, 8, 16)
    cache, scale, _ = dense_cache(kv, kv_format, rng)
    out = torch.empty((3, 1, 8, 512), dtype=torch.bfloat16, device=DEV)
    lse = torch.empty((3, 1, 8), dtype=torch.float32, device=DEV)
    kv_t, fmt = T(cache), ""
    if kv_format == "fp8_e4m3":  # as uint8 bits (opcheck's schema test cannot compare float8)
        kv_t, fmt = kv_t.view(torch.uint8), "fp8_e4m3"
    args = (T(q), kv_t, T(table), T(lens), out, lse, 0.0, scale or 1.0, fmt, empty_row_lse)
    torch.library.opcheck(torch.ops.deca.mla_decode_dense.default, args)
    torch.ops.deca.mla_decode_dense(*args)  # opcheck ran on copies: out is written here
    want, want_lse = deca.mla_decode_dense(T(q), T(cache), T(table), T(lens), kv_scale=scale,
                                           return_lse=True)
    same_bits(out, want)
    assert torch.isneginf(want_lse[2]).all()
    want_lse[2] = float(empty_row_lse)
    same_bits(lse, want_lse)


@pytest.mark.skipif(DEV == "cpu", reason="needs a CUDA device")
def test_flash_attn_in_cuda_graph(rng):
    case, (q, k, v, lens, table) = _fa_inputs(rng)
    out = torch.empty_like(q)

    def step():
        out.copy_(compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens,
                                                 block_table=table, causal=True))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up: plan, workspace and kernel made outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    same_bits(out, deca.gqa_decode(q, k, v, table, lens))


def _fp8_inputs(rng):
    case, (_, k, v, lens, table) = _fa_inputs(rng, kv_dtype="fp8_e4m3")
    q8 = (torch.randn(case.q.shape, generator=torch.Generator().manual_seed(7)) * 8).to(
        torch.float8_e4m3fn).to(DEV)
    return q8, k, v, lens, table


@pytest.mark.parametrize("form", ["expanded", "per_request"])
def test_flash_attn_fp8_q_with_descales(rng, form):
    """FlashAttention-3 / vLLM: an fp8 q with q_descale (batch, nheads_k) beside an fp8 cache.
    expanded: vLLM's one scale expand()ed (batch stride 0), folded into per-head scales;
    per_request: rows that differ, one request at a time with its own rows."""
    q8, k, v, lens, table = _fp8_inputs(rng)
    batch, hkv = q8.shape[0], k.shape[2]
    if form == "expanded":
        qd, kd, vd = (torch.tensor([s], device=DEV).expand(batch, hkv) for s in (0.5, 0.05, 0.07))
    else:
        gen = torch.Generator().manual_seed(3)
        qd, kd, vd = ((torch.rand(batch, hkv, generator=gen) * 0.1 + 0.02).to(DEV)
                      for _ in range(3))
    out = compat.flash_attn_with_kvcache(q8, k, v, cache_seqlens=lens, block_table=table,
                                         q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16
    qb = q8.to(torch.bfloat16)
    for b in range(batch):
        want = deca.gqa_decode(qb[b:b + 1], k, v, table[b:b + 1], lens[b:b + 1],
                               k_scales=(qd[b] * kd[b]).contiguous(),
                               v_scales=vd[b].contiguous())
        if form == "per_request":
            same_bits(out[b:b + 1], want)
        else:
            torch.testing.assert_close(out[b:b + 1].float(), want.float(), rtol=2 ** -7,
                                       atol=1e-6)


def test_torch_compile_fp8_q_matches_eager(rng):
    q8, k, v, lens, table = _fp8_inputs(rng)
    batch, hkv = q8.shape[0], k.shape[2]
    qd = torch.full((batch, hkv), 0.5, device=DEV)
    kd = torch.full((1,), 0.05, device=DEV).expand(batch, hkv)

    def attend(q, k, v, lens, table):
        return compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                              q_descale=qd, k_descale=kd, v_descale=kd,
                                              rotary_seqlens=lens, return_softmax_lse=True)

    want, want_lse = attend(q8, k, v, lens, table)
    got, got_lse = torch.compile(attend, fullgraph=True, backend="aot_eager")(q8, k, v, lens,
                                                                              table)
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)


def test_flash_mla_lse_plus_inf_under_compile(rng):
    from test_mla import _sparse_case
    q, kv, indices = _sparse_case(rng, 2, 1, 16, 64, 16, num_blocks=6)
    indices[1] = -1
    qt, kvt, it = T(q), T(kv), T(indices)

    def step(a):
        return compat.flash_mla_with_kvcache(a, kvt, None, None, 512, None, None,
                                             is_fp8_kvcache=True, indices=it)

    try:
        want_out, want_lse = step(qt)
    except deca.Error as e:
        if DEV != "cpu" and "cuda" in str(e).lower():
            pytest.skip(f"mla_decode_sparse has no CUDA kernel in this build: {e}")
        raise
    assert torch.isposinf(want_lse[1]).all() and torch.isfinite(want_lse[0]).all()
    out, lse = torch.compile(step, backend="aot_eager")(qt)
    same_bits(out, want_out)
    same_bits(lse, want_lse)


@pytest.mark.parametrize("compiled", [False, True])
def test_flash_attn_append_rotary_torch_matches_numpy(rng, compiled):
    """k / v appended with rotary (deca's fused step) from torch tensors, eagerly and under
    torch.compile(fullgraph=True): the numpy call's cache bytes, and its output (bitwise on the
    CPU backend, within bf16 rounding on CUDA)."""
    from test_compat_fa_fused import _Case
    case = _Case(rng, cache_seqlens=[0, 7, 13], seqlen_new=2, rotary_dim=32)
    k_cache, v_cache = T(case.c.k), T(case.c.v)
    args = [T(x) for x in (case.q, case.k, case.v, case.cos, case.sin, case.cache_seqlens,
                           case.c.page_table)]
    want, want_lse = case.call(causal=True, rotary_interleaved=True)

    def step(q, k, v, cos, sin, lens, table):
        return compat.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos,
                                              rotary_sin=sin, cache_seqlens=lens,
                                              block_table=table, causal=True,
                                              rotary_interleaved=True, return_softmax_lse=True)

    run = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
    out, lse = run(*args)
    same_bits(k_cache.cpu(), T(case.c.k).cpu())
    same_bits(v_cache.cpu(), T(case.c.v).cpu())
    if DEV == "cpu":
        same_bits(out, T(want))
        torch.testing.assert_close(lse, torch.from_numpy(want_lse), rtol=1e-5, atol=1e-5)
    else:
        # The GPU kernel sums in another order than the reference: an output can round to the
        # neighbouring bf16 value, which near zero is a large relative step, so the bound is a
        # few units in the last place of the largest output.
        want32 = np.asarray(want, np.float32)
        torch.testing.assert_close(out.float().cpu(), torch.from_numpy(want32), rtol=2 ** -7,
                                   atol=2 ** -6 * float(np.abs(want32).max()))
        torch.testing.assert_close(lse.cpu(), torch.from_numpy(want_lse), rtol=1e-4, atol=1e-4)


def test_first_eager_call_registers_ops_when_deca_came_first(tmp_path):
    """deca.compat imported before torch: the first eager flash_attn_with_kvcache call on torch
    tensors registers torch.ops.deca, so a later torch.compile of the same call traces (in a
    fresh interpreter: this one has the ops already)."""
    import subprocess
    import sys
    script = tmp_path / "order.py"
    script.write_text(
        "import deca.compat as compat\n"
        "import torch\n"
        "from deca import _cached_ops\n"
        "assert not _cached_ops.TORCH_OPS_REGISTERED\n"
        "dev = 'cuda:0' if torch.cuda.is_available() else 'cpu'\n"
        "g = torch.Generator().manual_seed(1)\n"
        "q = torch.randn(2, 1, 4, 64, generator=g).to(torch.bfloat16).to(dev)\n"
        "k, v = (torch.randn(4, 16, 2, 64, generator=g).to(torch.bfloat16).to(dev) for _ in range(2))\n"
        "table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev)\n"
        "lens = torch.tensor([20, 7], dtype=torch.int32, device=dev)\n"
        "def step(q, lens):\n"
        "    return compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)\n"
        "want = step(q, lens)\n"
        "assert _cached_ops.TORCH_OPS_REGISTERED and hasattr(torch.ops.deca, 'gqa_decode')\n"
        "got = torch.compile(step, fullgraph=True, backend='aot_eager')(q, lens)\n"
        "assert torch.equal(got.view(torch.int16), want.view(torch.int16))\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
