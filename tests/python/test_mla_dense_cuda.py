"""Dense MLA decode on CUDA tensors (torch) against the numpy reference over the values each
cache format stores: bf16, e4m3 with one scale, the 656-byte token read densely. Head counts 1
to 128, q_len 1 to 4, page sizes 1 to 256, ragged lengths with an empty request and one below
q_len, NaN-poisoned unused cache slots and outputs; checked plans naming a bad block id and a bad
length; the schedule reused by the next layer; CUDA-graph replay with new lengths. Skips without
torch and a CUDA device."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import to_cuda as cuda, to_host as host
from test_mla import _dense_case, dense_cache

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

DEV = "cuda:0"
# Relative L2 (RMS) error of the kernels' bf16 output against the float64 reference on the same
# stored cache, for every format (the 8-bit ones compute on the same bf16-exact values), and the
# LSE bound of the C++ GPU suite.
REL_L2 = 4e-3
LSE_TOL = 2e-3


def nan_outputs(batch, q_len, heads):
    out = torch.full((batch, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    lse = torch.full((batch, q_len, heads), float("nan"), dtype=torch.float32, device=DEV)
    return out, lse


def check(out, lse, want, want_lse):
    got = host(out)
    assert not np.isnan(got).any(), "an output element was not written (NaN poison left)"
    rel = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert rel <= REL_L2, f"relative L2 error {rel:.3g}"
    g = host(lse)
    assert np.array_equal(np.isneginf(g), np.isneginf(want_lse)), "rows without keys differ"
    fin = np.isfinite(want_lse)
    assert np.abs(g[fin] - want_lse[fin]).max(initial=0) <= LSE_TOL


def plan_for(heads, page, batch, q_len, max_seq_len, kv_format, checked=False, lse=True):
    return deca.MlaPlan(heads, kv_format=kv_format, page_size=page, max_batch=batch,
                        max_q_len=q_len, max_seq_len=max_seq_len, lse=lse, checked=checked,
                        device=DEV)


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "fp8_sparse"])
@pytest.mark.parametrize("heads,q_len,page,seqlens", [
    (128, 1, 64, [700, 1, 64, 0, 65]),
    (64, 2, 16, [300, 2, 17]),
    (16, 4, 256, [1000, 255, 257, 4]),
    (1, 3, 1, [40, 3]),
    (24, 2, 128, [129, 1]),   # a length below q_len: the first row sees no key
    (100, 4, 64, [200, 63]),
    (64, 2, 576, [1200, 575, 577]),  # once plans take any page size
])
def test_dense_cuda_matches_numpy(rng, kv_format, heads, q_len, page, seqlens, checked):
    try:
        deca.MlaPlan(heads, page_size=page, max_seq_len=1)
    except deca.Error as e:
        pytest.skip(f"page size {page}: {e}")
    q, kv, table, lens = _dense_case(rng, seqlens, q_len, heads, page)
    cache, scale, real = dense_cache(kv, kv_format, rng)
    batch = len(seqlens)
    plan = plan_for(heads, page, batch, q_len, table.shape[1] * page, kv_format, checked)
    assert (plan.kernel_name.find("_chk") >= 0) == checked, plan.kernel_name
    out, lse = nan_outputs(batch, q_len, heads)
    ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    plan.run_dense(cuda(q), cuda(cache), cuda(table), cuda(lens), out, lse=lse, kv_scale=scale,
                   workspace=ws)
    torch.cuda.synchronize()
    plan.check(ws)  # valid inputs: nothing recorded
    want, want_lse = ref.mla_dense(q.astype(np.float64), real, table, lens)
    check(out, lse, want, want_lse)
    assert np.all(host(out)[lens == 0] == 0.0)


def test_dense_cuda_one_off_call_and_131072_tokens(rng):
    """deca.mla_decode_dense on CUDA tensors (plan and workspace per call): one request of
    131072 tokens beside a short one, e4m3 cache."""
    q, kv, table, lens = _dense_case(rng, [131072, 5], 1, 8, 64)
    cache, scale, real = dense_cache(kv, "fp8_e4m3", rng)
    out, lse = deca.mla_decode_dense(cuda(q), cuda(cache), cuda(table), cuda(lens),
                                     kv_scale=scale, return_lse=True)
    torch.cuda.synchronize()
    want, want_lse = ref.mla_dense(q.astype(np.float64), real, table, lens)
    check(out, lse, want, want_lse)


@pytest.mark.parametrize("which", ["block", "length"])
def test_dense_cuda_checked_reports_bad_entries(rng, which):
    q, kv, table, lens = _dense_case(rng, [100, 40], 1, 16, 16)
    plan = plan_for(16, 16, 2, 1, 128, "bf16", checked=True)
    if which == "block":
        table[1, 1] = kv.shape[0]  # one past the pool, on a column request 1 reads
        expect = (rf"mla_decode_dense: block_table\[1\]\[1\]: expected a block id in \[0, "
                  rf"{kv.shape[0]}\) \(kv_cache's num_blocks\), got {kv.shape[0]} \(found by "
                  rf"the checked GPU run\)")
    else:
        lens[0] = 129
        expect = (r"mla_decode_dense: cache_seqlens\[0\]: expected a length in \[0, 128\] "
                  r"\(min\(plan.config.max_seq_len, block_table's columns \* page_size\)\), got 129 "
                  r"\(found by the checked GPU run\)")
    out, lse = nan_outputs(2, 1, 16)
    ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    plan.run_dense(cuda(q), cuda(kv), cuda(table), cuda(lens), out, lse=lse, workspace=ws)
    with pytest.raises(deca.Error, match=expect):
        plan.check(ws)
    plan.check(ws)  # the record was cleared


def test_dense_cuda_schedule_reused_by_the_next_layer(rng):
    """run_dense(reuse_schedule=True): the second layer (same lengths, other q and cache) runs on
    the first layer's schedule and writes what its own scheduled run writes."""
    heads, page = 64, 64
    q1, kv1, table, lens = _dense_case(rng, [900, 3, 0, 2000], 2, heads, page)
    q2 = rng.standard_normal(q1.shape).astype(ref.BF16)
    kv2 = rng.standard_normal(kv1.shape).astype(ref.BF16)
    kv2[np.isnan(kv1.astype(np.float32))] = np.nan
    plan = plan_for(heads, page, 4, 2, table.shape[1] * page, "bf16")
    ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    own = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    outs = [nan_outputs(4, 2, heads) for _ in range(3)]
    args = (cuda(table), cuda(lens))
    plan.run_dense(cuda(q1), cuda(kv1), *args, outs[0][0], lse=outs[0][1], workspace=ws)
    plan.run_dense(cuda(q2), cuda(kv2), *args, outs[1][0], lse=outs[1][1], workspace=ws,
                   reuse_schedule=True)
    plan.run_dense(cuda(q2), cuda(kv2), *args, outs[2][0], lse=outs[2][1], workspace=own)
    torch.cuda.synchronize()
    assert torch.equal(outs[1][0].view(torch.int16), outs[2][0].view(torch.int16))
    assert torch.equal(outs[1][1].view(torch.int32), outs[2][1].view(torch.int32))
    want, want_lse = ref.mla_dense(q2.astype(np.float64), kv2.astype(np.float64), table, lens)
    check(outs[1][0], outs[1][1], want, want_lse)


def test_dense_cuda_graph_replay_with_new_lengths(rng):
    """A captured run replays with the lengths found in device memory at replay time."""
    heads, page = 128, 64
    q, kv, table, lens = _dense_case(rng, [1500, 700, 64, 9], 1, heads, page)
    plan = plan_for(heads, page, 4, 1, table.shape[1] * page, "bf16")
    ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    qt, kvt, tt, lt = cuda(q), cuda(kv), cuda(table), cuda(lens)
    out, lse = nan_outputs(4, 1, heads)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run_dense(qt, kvt, tt, lt, out, lse=lse, workspace=ws)  # loads the kernels
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run_dense(qt, kvt, tt, lt, out, lse=lse, workspace=ws)
    new = np.array([1499, 1, 0, 8], np.int32)  # shorter or equal: only owned slots are read
    lt.copy_(cuda(new))
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want, want_lse = ref.mla_dense(q.astype(np.float64), kv.astype(np.float64), table, new)
    check(out, lse, want, want_lse)


def test_dense_cuda_run_to_run_bitwise(rng):
    q, kv, table, lens = _dense_case(rng, [3000, 2, 700], 2, 128, 64)
    cache, _, _ = dense_cache(kv, "fp8_sparse", rng)
    plan = plan_for(128, 64, 3, 2, table.shape[1] * 64, "fp8_sparse")
    ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    runs = []
    for _ in range(2):
        out, lse = nan_outputs(3, 2, 128)
        plan.run_dense(cuda(q), cuda(cache), cuda(table), cuda(lens), out, lse=lse, workspace=ws)
        runs.append((out, lse))
    torch.cuda.synchronize()
    assert torch.equal(runs[0][0].view(torch.int16), runs[1][0].view(torch.int16))
    assert torch.equal(runs[0][1].view(torch.int32), runs[1][1].view(torch.int32))
