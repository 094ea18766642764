"""The Python API on CUDA tensors (torch; one cupy case) against the numpy reference: the GQA
features tests/gpu/gqa_gpu_test.cpp covers, odd shapes, GqaPlan.run under CUDA-graph capture and
replay, fixed-split batch invariance, outputs poisoned with NaN before each call. Fresh random
data per test (DECA_TEST_SEED replays it). Skips without torch and a CUDA device."""

import math

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase, to_cuda as cuda, to_host as host, tree_mask

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

DEV = "cuda:0"
# Relative L2 error bounds of the GPU kernels against the float64 reference (as the C++ GPU
# suite's): products run in 16-bit with fp32 accumulation, P is rounded before PV.
REL_L2 = {"bf16": 1e-2, "fp16": 4e-3, "fp8_e4m3": 6e-2}


def nan_like(shape, dtype):
    t = torch.empty(shape, dtype=dtype, device=DEV)
    if dtype == torch.float8_e4m3fn:
        t.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    else:
        t.fill_(float("nan"))
    return t


def check(out, want, out_dtype="bf16", lse=None, want_lse=None, lse_tol=2e-3, scale=1.0):
    got = host(out) * scale
    assert not np.isnan(got).any(), "an output element was not written (NaN poison left)"
    denom = max(np.linalg.norm(want), 1e-30)
    rel = np.linalg.norm(got - want) / denom
    assert rel <= REL_L2[out_dtype], f"relative L2 error {rel:.3g}"
    if lse is not None:
        g = host(lse)
        assert np.array_equal(np.isneginf(g), np.isneginf(want_lse))
        fin = np.isfinite(want_lse)
        assert np.abs(g[fin] - want_lse[fin]).max(initial=0) <= lse_tol


def run_case(case, *, out_dtype=None, lse=True, plan_kw=None, run_kw=None, ref_kw=None,
             lse_tol=2e-3):
    """GqaPlan + run on CUDA tensors (poisoned outputs), checked against the reference."""
    batch, q_len, hq, d = case.q.shape
    kv_dtype = {ref.BF16: "bf16", np.dtype(np.float16): "fp16", ref.FP8: "fp8_e4m3",
                np.dtype(np.int8): "int8"}[case.k.dtype]
    q_dtype = "fp16" if case.q.dtype == np.float16 else "bf16"
    out_dtype = out_dtype or q_dtype
    page = case.k.shape[1] if case.layout == "NHD" else case.k.shape[2]
    hkv = case.k.shape[2] if case.layout == "NHD" else case.k.shape[1]
    plan_kw, run_kw, ref_kw = dict(plan_kw or {}), dict(run_kw or {}), dict(ref_kw or {})
    plan = deca.GqaPlan(hq, hkv, d, page, layout=case.layout, q_dtype=q_dtype,
                        kv_dtype=kv_dtype, out_dtype=out_dtype, max_batch=batch,
                        max_q_len=q_len, max_seq_len=plan_kw.pop("max_seq_len", 1 << 15),
                        lse=lse, device=DEV,
                        per_head_kv_scale=case.k_scales is not None, **plan_kw)
    ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
              "fp8_e4m3": torch.float8_e4m3fn}[out_dtype]
    out = nan_like((batch, q_len, hq, d), tdtype)
    lse_t = nan_like((batch, q_len, hq), torch.float32) if lse else None
    scales = (dict(k_scales=cuda(case.k_scales), v_scales=cuda(case.v_scales))
              if case.k_scales is not None else dict(k_scale=case.k_scale, v_scale=case.v_scale))
    plan.run(cuda(case.q), cuda(case.k), cuda(case.v), cuda(case.page_table),
             cuda(case.seq_lens), out, workspace=ws, lse=lse_t, **scales, **run_kw)
    torch.cuda.synchronize()
    want, want_lse = case.reference(**ref_kw)
    out_scale = run_kw.get("out_scale", 1.0)
    check(out, want, out_dtype, lse_t, want_lse if lse else None, lse_tol, scale=out_scale)
    return plan, out, lse_t


# --- every dtype and layout ------------------------------------------------------------------

@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16", "fp8_e4m3", "int8"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_dtypes_and_layouts(rng, kv_dtype, layout):
    q_dtype = "fp16" if kv_dtype == "fp16" else "bf16"
    scale = 1.0 if kv_dtype in ("bf16", "fp16") else (0.02 if kv_dtype == "fp8_e4m3" else 0.03)
    case = PagedCase(rng, seq_lens=[300, 1, 0, 77], hq=16, hkv=4, d=128, page=16, layout=layout,
                     q_dtype=q_dtype, kv_dtype=kv_dtype, k_scale=scale, v_scale=scale)
    run_case(case)


# --- odd shapes ----------------------------------------------------------------------------

@pytest.mark.parametrize("d", [64, 80, 96, 128, 192, 256])
def test_head_dims(rng, d):
    run_case(PagedCase(rng, seq_lens=[130, 17], hq=8, hkv=2, d=d, page=16))


@pytest.mark.parametrize("hq,hkv", [(6, 2), (12, 4), (7, 1), (40, 8), (5, 5)])
def test_group_sizes_not_powers_of_two(rng, hq, hkv):
    run_case(PagedCase(rng, seq_lens=[200, 3], hq=hq, hkv=hkv, d=64, page=16))


@pytest.mark.parametrize("page", [1, 3, 12, 24, 100])
def test_page_sizes_not_powers_of_two(rng, page):
    run_case(PagedCase(rng, seq_lens=[150, 7, 1], hq=8, hkv=2, d=64, page=page))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_kv_strided_views_of_one_allocation(rng, layout):
    run_case(PagedCase(rng, seq_lens=[99, 33], hq=8, hkv=2, d=128, page=16, layout=layout,
                       shared_kv=True))


def test_empty_requests(rng):
    case = PagedCase(rng, seq_lens=[0, 0, 5, 0], hq=8, hkv=2, d=64, page=16)
    _, out, lse = run_case(case)
    assert (host(out)[[0, 1, 3]] == 0).all() and np.isneginf(host(lse)[[0, 1, 3]]).all()


# --- features ------------------------------------------------------------------------------

def test_window_sinks_softcap(rng):
    case = PagedCase(rng, seq_lens=[1000, 100, 5], hq=64, hkv=8, d=64, page=16)
    sinks = rng.normal(0.0, 1.0, 64).astype(np.float32)
    run_case(case, plan_kw=dict(window=128, sinks=True, softcap=30.0),
             run_kw=dict(sinks=cuda(sinks)),
             ref_kw=dict(window=128, sinks=sinks, softcap=30.0))


def test_window_of_one(rng):
    case = PagedCase(rng, seq_lens=[50, 1], hq=8, hkv=1, d=64, page=16)
    run_case(case, plan_kw=dict(window=1), ref_kw=dict(window=1))


def test_per_head_scales(rng):
    case = PagedCase(rng, seq_lens=[400, 40], hq=16, hkv=4, d=128, page=32, kv_dtype="int8",
                     k_scale=0.03, v_scale=0.03, per_head=True)
    run_case(case, lse=False)


@pytest.mark.parametrize("q_len", [2, 4, 8])
def test_causal_and_tree_mask(rng, q_len):
    case = PagedCase(rng, seq_lens=[500, q_len, q_len + 3], q_len=q_len, hq=32, hkv=8, d=128,
                     page=64)
    run_case(case)
    mask = tree_mask(rng, 3, q_len)
    run_case(case, plan_kw=dict(tree_mask=True, window=64),
             run_kw=dict(tree_mask=cuda(mask)), ref_kw=dict(tree_mask=mask, window=64))


def test_fp8_output(rng):
    case = PagedCase(rng, seq_lens=[200, 9], hq=8, hkv=2, d=128, page=16)
    run_case(case, out_dtype="fp8_e4m3", run_kw=dict(out_scale=0.5))


def test_long_request_splits(rng):
    case = PagedCase(rng, seq_lens=[20000, 1, 0, 64], hq=64, hkv=8, d=128, page=64,
                     kv_dtype="fp8_e4m3", k_scale=0.02, v_scale=0.02)
    plan, _, _ = run_case(case)
    assert plan.num_splits > 1


def test_fixed_split(rng):
    case = PagedCase(rng, seq_lens=[3000, 10, 1500], hq=8, hkv=1, d=128, page=16)
    plan, _, _ = run_case(case, plan_kw=dict(split_mode="fixed"))
    assert plan.split_tokens > 0


def test_beams(rng):
    case = PagedCase(rng, seq_lens=[130, 130, 17, 17], hq=32, hkv=4, d=128, page=16)
    case.page_table[1] = case.page_table[0]  # beams of a request share their pages
    case.page_table[3] = case.page_table[2]
    run_case(case, plan_kw=dict(beam_width=2))


# --- determinism, batch invariance, graphs ---------------------------------------------------

def test_fixed_split_is_batch_invariant(rng):
    """A request alone and inside a batch gives the same bits with split_mode="fixed"."""
    case = PagedCase(rng, seq_lens=[5000, 40, 2600, 1], hq=32, hkv=8, d=128, page=16)
    outs = []
    for rows in ([0, 1, 2, 3], [2]):
        plan = deca.GqaPlan(32, 8, 128, 16, max_batch=4, max_seq_len=8192,
                            split_mode="fixed", split_tokens=512, device=DEV)
        ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
        out = nan_like((len(rows), 1, 32, 128), torch.bfloat16)
        plan.run(cuda(case.q[rows]), cuda(case.k), cuda(case.v), cuda(case.page_table[rows]),
                 cuda(case.seq_lens[rows]), out, workspace=ws)
        outs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(outs[0][2].view(torch.int16), outs[1][0].view(torch.int16))


def test_run_to_run_bitwise(rng):
    case = PagedCase(rng, seq_lens=[9000, 3], hq=64, hkv=8, d=128, page=64)
    plan = deca.GqaPlan(64, 8, 128, 64, max_batch=2, max_seq_len=16384, lse=True, device=DEV)
    ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
    args = [cuda(x) for x in (case.q, case.k, case.v, case.page_table, case.seq_lens)]
    first = None
    for _ in range(3):
        out = nan_like((2, 1, 64, 128), torch.bfloat16)
        lse = nan_like((2, 1, 64), torch.float32)
        plan.run(*args, out, workspace=ws, lse=lse)
        if first is None:
            first = (out, lse)
        else:
            assert torch.equal(out.view(torch.int16), first[0].view(torch.int16))
            assert torch.equal(lse.view(torch.int32), first[1].view(torch.int32))


def test_graph_capture_and_replay_with_new_lengths_and_pages(rng):
    """GqaPlan.run captured once; each replay reads new q, seq_lens and page tables copied into
    the same buffers, and matches the reference."""
    hq, hkv, d, page, batch, max_pages, num_pages = 16, 4, 128, 16, 3, 40, 120
    plan = deca.GqaPlan(hq, hkv, d, page, max_batch=batch, max_seq_len=max_pages * page,
                        lse=True, device=DEV)
    ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
    k_np = rng.standard_normal((num_pages, page, hkv, d)).astype(ref.BF16)
    v_np = rng.standard_normal((num_pages, page, hkv, d)).astype(ref.BF16)
    k, v = cuda(k_np), cuda(v_np)
    q = torch.empty((batch, 1, hq, d), dtype=torch.bfloat16, device=DEV)
    table = torch.zeros((batch, max_pages), dtype=torch.int32, device=DEV)
    lens = torch.zeros(batch, dtype=torch.int32, device=DEV)
    out = torch.empty((batch, 1, hq, d), dtype=torch.bfloat16, device=DEV)
    lse = torch.empty((batch, 1, hq), dtype=torch.float32, device=DEV)

    def load(seq_lens):
        q_np = rng.standard_normal((batch, 1, hq, d)).astype(ref.BF16)
        pages = np.stack([rng.permutation(num_pages)[:max_pages] for _ in range(batch)])
        pages = pages.astype(np.int32)
        q.copy_(cuda(q_np))
        table.copy_(torch.from_numpy(pages))
        lens.copy_(torch.from_numpy(np.asarray(seq_lens, np.int32)))
        return q_np, pages

    load([600, 5, 300])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run(q, k, v, table, lens, out, workspace=ws, lse=lse)  # warm-up: JIT load
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, table, lens, out, workspace=ws, lse=lse)
    for seq_lens in ([600, 5, 300], [17, 640, 0], [1, 1, 1], [256, 257, 255]):
        q_np, pages = load(seq_lens)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = ref.gqa_decode(q_np.astype(np.float64), k_np.astype(np.float64),
                                        v_np.astype(np.float64), pages,
                                        np.asarray(seq_lens, np.int32))
        check(out, want, "bf16", lse, want_lse)


def test_one_off_gqa_decode_allocates_torch_outputs(rng):
    case = PagedCase(rng, seq_lens=[70, 3], hq=8, hkv=2, d=64, page=16)
    out, lse = deca.gqa_decode(cuda(case.q), cuda(case.k), cuda(case.v), cuda(case.page_table),
                               cuda(case.seq_lens), return_lse=True)
    assert out.is_cuda and out.dtype == torch.bfloat16
    want, want_lse = case.reference()
    check(out, want, "bf16", lse, want_lse)


def test_one_off_calls_keep_a_workspace_per_stream(rng):
    """The one-off call plans once per shape, and runs on two streams at once never share a
    workspace (each stream gets its own, made at its first call there)."""
    from deca import gqa
    case = PagedCase(rng, seq_lens=[3000, 70], hq=8, hkv=2, d=64, page=16)
    args = [cuda(x) for x in (case.q, case.k, case.v, case.page_table, case.seq_lens)]
    want, want_lse = case.reference()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = []
    for _ in range(2):
        for s in streams:
            with torch.cuda.stream(s):
                results.append(deca.gqa_decode(*args, return_lse=True))
    torch.cuda.synchronize()
    for out, lse in results:
        check(out, want, "bf16", lse, want_lse)

    def this_shape(p):
        c = p.plan.config
        return p.want_lse and (c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size,
                               c.max_batch) == (8, 2, 64, 16, 2)
    prepared = [p for p in gqa._ONEOFF.values() if this_shape(p)]
    assert prepared
    handles = {int(s.cuda_stream) for s in streams}
    assert any(handles <= set(p.workspaces.by_stream) or not p.plan.workspace_bytes
               for p in prepared)


def test_fp8_torch_tensors_and_plan_run_fast_path(rng):
    """float8_e4m3fn tensors, and the error message of a wrong argument still names it."""
    case = PagedCase(rng, seq_lens=[64, 9], hq=8, hkv=2, d=64, page=16, kv_dtype="fp8_e4m3",
                     k_scale=0.02, v_scale=0.02)
    run_case(case)
    plan = deca.GqaPlan(8, 2, 64, 16, kv_dtype="fp8_e4m3", max_batch=2, max_seq_len=64,
                        device=DEV)
    ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=DEV)
    out = torch.empty((2, 1, 8, 64), dtype=torch.bfloat16, device=DEV)
    with pytest.raises(deca.Error, match=r"gqa_decode: seq_lens"):
        plan.run(cuda(case.q), cuda(case.k), cuda(case.v), cuda(case.page_table),
                 cuda(case.seq_lens.astype(np.int64)), out, workspace=ws)


def test_cupy_arrays(rng):
    cupy = pytest.importorskip("cupy")
    case = PagedCase(rng, seq_lens=[50, 20], hq=8, hkv=2, d=64, page=16, q_dtype="fp16",
                     kv_dtype="fp16")
    c = {name: cupy.asarray(getattr(case, name)) for name in
         ("q", "k", "v", "page_table", "seq_lens")}
    out = cupy.full(case.q.shape, cupy.nan, dtype=cupy.float16)
    lse = cupy.full(case.q.shape[:3], cupy.nan, dtype=cupy.float32)
    deca.gqa_decode(c["q"], c["k"], c["v"], c["page_table"], c["seq_lens"], out, lse=lse)
    cupy.cuda.get_current_stream().synchronize()
    want, want_lse = case.reference()
    got = cupy.asnumpy(out).astype(np.float64)
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= REL_L2["fp16"]
    g = cupy.asnumpy(lse)
    fin = np.isfinite(want_lse)
    assert np.abs(g[fin] - want_lse[fin]).max() <= 2e-3


# --- MLA through the public API (sparse FP8 needs the GPU kernel merged; dense too) -----------

def test_mla_sparse_cuda(rng):
    from test_mla import _sparse_case
    q, kv, indices = _sparse_case(rng, 2, 1, 16, 128, 64, num_blocks=4)
    try:
        out, lse = deca.mla_decode_sparse(cuda(q), cuda(kv), cuda(indices), return_lse=True)
    except deca.Error as e:
        if "CUDA" in str(e) or "cuda" in str(e):
            pytest.skip(f"mla_decode_sparse has no CUDA kernel in this build: {e}")
        raise
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices)
    check(out, want, "bf16", lse, want_lse, lse_tol=1e-2)


def use_checked_kernel(monkeypatch, checked):
    """`checked` "portable": a checked plan on the portable kernel's checked build
    (DECA_MLA_KERNEL=portable); True: a checked plan on the device's own kernel (on Hopper the
    sm90 kernels' checked builds). Returns the plan's `checked`."""
    if checked == "portable":
        monkeypatch.setenv("DECA_MLA_KERNEL", "portable")
        return True
    return checked


@pytest.mark.parametrize("checked", [False, True, "portable"])
@pytest.mark.parametrize("heads,q_len,topk,page", [(1, 3, 100, 48), (3, 1, 200, 7),
                                                   (127, 3, 100, 64), (24, 4, 70, 1)])
def test_mla_sparse_cuda_odd_shapes(rng, monkeypatch, heads, q_len, topk, page, checked):
    """Head counts that are no multiple of 64 (one, three, 127 in a cluster of two CTAs), q_len 3
    and 4, topk no multiple of 64 (a partial last block), page sizes that are not powers of two, q
    as a strided view (heads 640 elements apart), ragged topk_length with an empty request, a
    sink; NaN-poisoned outputs and workspace; the sm90 kernel (checked=False), its checked build
    (checked=True) and the portable kernel's ("portable": DECA_MLA_KERNEL=portable) against the
    numpy reference."""
    checked = use_checked_kernel(monkeypatch, checked)
    from test_mla import _sparse_case
    batch = 3
    q, kv, indices = _sparse_case(rng, batch, q_len, heads, topk, page,
                                  num_blocks=max(4, 4 * topk // page + 2))
    lengths = np.array([topk, topk // 2 + 1, 0], np.int32)
    # Indices past topk_length must not be read: point them at the poisoned tokens.
    indices[1, :, lengths[1]:] = rng.integers(0, 10, (q_len, topk - lengths[1]))
    sink = rng.normal(0.0, 1.5, heads).astype(np.float32)
    wide = np.zeros((batch, q_len, heads, 640), ref.BF16)
    wide[..., :576] = q
    q_view = cuda(wide)[..., :576]
    assert not q_view.is_contiguous()
    plan = deca.MlaPlan(heads, sparse=True, page_size=page, max_batch=batch, max_q_len=q_len,
                        topk=topk, topk_length=True, attn_sink=True, checked=checked,
                        device="cuda:0")
    out = nan_like((batch, q_len, heads, 512), torch.bfloat16)
    lse = nan_like((batch, q_len, heads), torch.float32)
    ws = torch.full((plan.workspace_bytes,), 0xFF, dtype=torch.uint8, device=DEV)
    plan.run_sparse(q_view, cuda(kv), cuda(indices), out, topk_length=cuda(lengths),
                    attn_sink=cuda(sink), lse=lse, workspace=ws)
    torch.cuda.synchronize()
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices, lengths, sink)
    check(out, want, "bf16", lse, want_lse, lse_tol=1e-2)
    assert np.all(host(out)[2] == 0.0)  # the empty request: zeros and LSE -inf
    assert np.all(np.isneginf(host(lse)[2]))


@pytest.mark.parametrize("checked", [False, True, "portable"])
@pytest.mark.parametrize("layout", ["layer", "slot"])
@pytest.mark.parametrize("heads,page", [(16, 64), (128, 1)])
def test_mla_sparse_cuda_kv_strided_view(rng, monkeypatch, heads, page, layout, checked):
    """The FP8 cache as a strided view of a larger allocation (one layer of an interleaved
    [blocks, layers, page, 1, 656], or every second record of a slot): the poison around it
    (e4m3 NaN, huge scales) must never be read. 16 heads (no cluster) and 128 (a cluster of two
    CTAs), the sm90 kernel, its checked build and the portable checked kernel (as above), against
    the numpy reference."""
    checked = use_checked_kernel(monkeypatch, checked)
    from test_mla import _sparse_case, strided_kv
    batch, q_len, topk = 2, 2, 128
    q, kv, indices = _sparse_case(rng, batch, q_len, heads, topk, page,
                                  num_blocks=max(4, 2 * topk // page + 2))
    big, _ = strided_kv(kv, layout)
    big_dev = cuda(big)
    kv_dev = big_dev[:, 1] if layout == "layer" else big_dev[:, :, 1:2]
    assert not kv_dev.is_contiguous() and kv_dev.shape == kv.shape
    plan = deca.MlaPlan(heads, sparse=True, page_size=page, max_batch=batch, max_q_len=q_len,
                        topk=topk, checked=checked, device="cuda:0")
    out = nan_like((batch, q_len, heads, 512), torch.bfloat16)
    lse = nan_like((batch, q_len, heads), torch.float32)
    ws = torch.full((plan.workspace_bytes,), 0xFF, dtype=torch.uint8, device=DEV)
    plan.run_sparse(cuda(q), kv_dev, cuda(indices), out, lse=lse, workspace=ws)
    torch.cuda.synchronize()
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, indices)
    check(out, want, "bf16", lse, want_lse, lse_tol=1e-2)


def test_mla_sparse_schedule_reused_by_the_next_layer(rng):
    """MlaPlan.run_sparse(reuse_schedule=True): the second layer of a step runs on the first's
    schedule (same indices and topk_length) and writes what its own scheduled run writes; a
    schedule made for another batch computes nothing (NaN), and a checked plan says why."""
    from test_mla import _sparse_case
    batch, heads, topk, page = 4, 16, 128, 64
    q1, kv, indices = _sparse_case(rng, batch, 1, heads, topk, page, num_blocks=4)
    q2 = rng.standard_normal(q1.shape).astype(ref.BF16)
    lengths = cuda(np.array([topk, 70, 0, 3], np.int32))
    for checked in (False, True):
        plan = deca.MlaPlan(heads, sparse=True, page_size=page, max_batch=batch, topk=topk,
                            topk_length=True, lse=False, checked=checked, device="cuda:0")
        ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device="cuda:0")
        own = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device="cuda:0")
        out = [torch.zeros(batch, 1, heads, 512, dtype=torch.bfloat16, device="cuda:0")
               for _ in range(3)]
        args = dict(topk_length=lengths)
        plan.run_sparse(cuda(q1), cuda(kv), cuda(indices), out[0], workspace=ws, **args)
        plan.run_sparse(cuda(q2), cuda(kv), cuda(indices), out[1], workspace=ws,
                        reuse_schedule=True, **args)
        plan.run_sparse(cuda(q2), cuda(kv), cuda(indices), out[2], workspace=own, **args)
        plan.check(ws)
        assert torch.equal(out[1].view(torch.int16), out[2].view(torch.int16))
        assert not torch.equal(out[0].view(torch.int16), out[1].view(torch.int16))
        # The same workspace reused for batch 2: nothing computed, NaN out.
        half = torch.zeros(2, 1, heads, 512, dtype=torch.bfloat16, device="cuda:0")
        plan.run_sparse(cuda(q2[:2]), cuda(kv), cuda(indices[:2]), half, workspace=ws,
                        reuse_schedule=True, topk_length=lengths[:2])
        assert torch.isnan(half.float()).all()
        if checked:
            with pytest.raises(deca.Error, match="reuse_schedule: expected the workspace to hold "
                                                 "the schedule of this call's shape, got one of "
                                                 "batch 4, q_len 1, topk 128"):
                plan.check(ws)
        else:
            plan.check(ws)  # unchecked plans record nothing
