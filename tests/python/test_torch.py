"""The same calls with torch tensors (DLPack, torch.bfloat16, torch.float8_e4m3fn)."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase, close, close_lse

torch = pytest.importorskip("torch")


def _t(a):
    """numpy (ml_dtypes included) -> torch tensor with the same dtype and bits."""
    if a.dtype == ref.BF16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    if a.dtype == ref.FP8:
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(a))


def test_gqa_torch_bf16(rng):
    case = PagedCase(rng, seq_lens=[30, 7], hq=8, hkv=2, d=64, page=16, layout="HND")
    out, lse = deca.gqa_decode(_t(case.q), _t(case.k), _t(case.v), _t(case.page_table),
                               _t(case.seq_lens), layout="HND", return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    want, want_lse = case.reference()
    close(out.float().numpy(), want, "bf16")
    close_lse(lse.numpy(), want_lse)


def test_gqa_torch_fp8_cache(rng):
    case = PagedCase(rng, seq_lens=[25], hq=4, hkv=2, d=64, page=8, kv_dtype="fp8_e4m3",
                     k_scale=0.02, v_scale=0.02)
    out = deca.gqa_decode(_t(case.q), _t(case.k), _t(case.v), _t(case.page_table),
                          _t(case.seq_lens), k_scale=0.02, v_scale=0.02)
    close(out.float().numpy(), case.reference()[0], "bf16")


def test_torch_strided_cache_view(rng):
    case = PagedCase(rng, seq_lens=[25, 10], hq=4, hkv=2, d=32, page=8, shared_kv=True)
    kv = _t(np.stack([case.k, case.v], axis=1))  # [pages, 2, page, heads, d]
    out = deca.gqa_decode(_t(case.q), kv[:, 0], kv[:, 1], _t(case.page_table),
                          _t(case.seq_lens))
    close(out.float().numpy(), case.reference()[0], "bf16")


def test_mla_sparse_torch(rng):
    latent = rng.standard_normal((2, 16, 1, 576)).astype(ref.BF16)
    kv = deca.pack_mla_fp8(_t(latent))
    assert isinstance(kv, torch.Tensor) and kv.dtype == torch.uint8
    q = rng.standard_normal((1, 1, 4, 576)).astype(ref.BF16)
    idx = rng.integers(-1, 32, (1, 1, 16)).astype(np.int32)
    out = deca.mla_decode_sparse(_t(q), kv, _t(idx))
    want, _ = ref.mla_sparse(q.astype(np.float64), kv.numpy(), idx)
    close(out.float().numpy(), want, "bf16")


def test_torch_dtype_mismatch_is_deca_error(rng):
    case = PagedCase(rng, seq_lens=[5], hq=2, hkv=1, d=16, page=8)
    with pytest.raises(deca.Error, match="gqa_decode: q"):
        deca.gqa_decode(_t(case.q).double(), _t(case.k), _t(case.v), _t(case.page_table),
                        _t(case.seq_lens))


def _import_cases(device):
    """Tensors GqaPlan.run's fast import must read alike by either route: every dtype it names,
    ranks 1 to 6, strided, offset, expanded (stride 0), transposed and empty views."""
    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32, device=device).reshape(2, 3, 4, 5)
    cases = [base, base.to(torch.bfloat16), base.to(torch.float16), base.to(torch.int32),
             base.to(torch.int8), base.to(torch.uint8), base.to(torch.float8_e4m3fn),
             base[:, 1:, ::2], base.transpose(1, 3), base[1:], base[:, :1].expand(2, 7, 4, 5),
             base[:0], base.reshape(-1), base.reshape(1, 2, 3, 1, 4, 5), base.to(torch.bfloat16)[..., 1:4],
             base.to(torch.float8_e4m3fn).view(torch.uint8)]
    if hasattr(torch, "uint32"):
        cases.append(base.to(torch.int32).view(torch.uint32))
    return cases


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fast_import_routes_agree(device):
    """The C exchange route (DLPack 1.3's table on torch.Tensor) and the attribute route see the
    same pointer, shape, strides, dtype and device for every view."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from deca import _C
    for t in _import_cases(device):
        by_attributes = _C._torch_import_probe(t, "attributes")
        assert by_attributes[0] == t.data_ptr() and by_attributes[1] == tuple(t.shape)
        assert by_attributes[2] == t.stride() and by_attributes[4] == device
        by_exchange = _C._torch_import_probe(t, "exchange")
        if _C._torch_exchange_available():
            assert by_exchange == by_attributes, (t.dtype, t.shape, t.stride())
        else:
            assert by_exchange is None


def test_fast_import_exchange_route_switch():
    """torch >= 2.10 offers the exchange table; DECA_PY_DLPACK_EXCHANGE=0 turns it off."""
    import os
    import subprocess
    import sys
    code = "import torch, deca; from deca import _C; print(_C._torch_exchange_available())"
    env = dict(os.environ, DECA_PY_DLPACK_EXCHANGE="0")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "False"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    has_table = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    assert on.stdout.strip() == str(has_table)


def test_plan_run_through_either_route_writes_the_same(rng):
    """GqaPlan.run with torch tensors (strided cache, storage offsets) gives the same bytes with
    the exchange route on and off."""
    import os
    import subprocess
    import sys
    code = r"""
import sys, torch, deca
torch.manual_seed(0)
plan = deca.GqaPlan(8, 2, 64, 16, max_batch=2, max_seq_len=64, device="cpu")
q = torch.randn(3, 1, 8, 64).to(torch.bfloat16)[1:]
big = torch.randn(6, 16, 4, 64).to(torch.bfloat16)
k, v = big[:, :, 0:4:2], big[:, :, 1:4:2]
table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32)
lens = torch.tensor([40, 17], dtype=torch.int32)
out = torch.full((2, 1, 8, 64), float("nan")).to(torch.bfloat16)
plan.run(q, k, v, table, lens, out)
sys.stdout.write(out.view(torch.int16).numpy().tobytes().hex())
"""
    runs = []
    for value in ("1", "0"):
        env = dict(os.environ, DECA_PY_DLPACK_EXCHANGE=value)
        runs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert runs[0] == runs[1] and len(runs[0]) == 2 * 2 * 8 * 64 * 2


def _same_bytes_every_way(ways, out_shape, dev):
    """Runs each way(out, lse) into NaN-poisoned outputs; all must write the same bytes."""
    outs = []
    for way in ways:
        out = torch.full(out_shape, float("nan"), device=dev).to(torch.bfloat16)
        lse = torch.full(out_shape[:3], float("nan"), device=dev)
        way(out, lse)
        outs.append((out.view(torch.int16), lse.view(torch.int32)))
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])
    return outs[0]


def _stream(dev):
    return torch.cuda.current_stream().cuda_stream if dev != "cpu" else 0


def test_mla_sparse_plan_run_fast_path_matches_checked_imports(rng):
    """MlaPlan.run_sparse hands torch tensors (or deca.Tensors, as the one-off call does) to one
    C++ call; the checked imports of the same tensors give the same bytes (topk_length, sink,
    lse), and a wrong argument still raises the message naming it."""
    from deca import _C
    from deca._tensors import tensor
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    heads, topk, page, batch = 12, 128, 16, 3
    plan = deca.MlaPlan(heads, sparse=True, page_size=page, max_batch=batch, max_q_len=2,
                        max_seq_len=8 * page, topk=topk, lse=True, attn_sink=True,
                        topk_length=True, device=dev)
    q = torch.from_numpy(rng.standard_normal((batch, 2, heads, 576)).astype(np.float32)).to(dev).to(torch.bfloat16)
    kv = torch.from_numpy(rng.integers(0, 0x70, (8, page, 1, 656)).astype(np.uint8)).to(dev)
    kv.view(8 * page, 656)[:, 512:528] = torch.tensor([0x3c, 0, 0, 0], dtype=torch.uint8,
                                                      device=dev).repeat(4)  # scales 2^-7
    idx = torch.from_numpy(rng.integers(-1, 8 * page, (batch, 2, topk)).astype(np.int32)).to(dev)
    lens = torch.tensor([topk, 37, 0], dtype=torch.int32, device=dev)
    sink = torch.from_numpy(rng.normal(0, 1, heads).astype(np.float32)).to(dev)
    ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=dev)

    def imported(out, lse):
        return (tensor(q, "q"), tensor(kv, "kv"), tensor(idx, "i", "int32"),
                tensor(lens, "l", "int32"), tensor(sink, "s"), tensor(out, "o", writable=True),
                tensor(lse, "lse", writable=True), 0.0, tensor(ws, "ws", writable=True),
                _stream(dev), False)

    ways = [lambda out, lse: plan.run_sparse(q, kv, idx, out, topk_length=lens, attn_sink=sink,
                                             lse=lse, workspace=ws),
            lambda out, lse: _C.mla_decode_sparse_planned_fast(plan._plan, *imported(out, lse)),
            lambda out, lse: _C.mla_decode_sparse_planned(plan._plan, *imported(out, lse))]
    out, lse = _same_bytes_every_way(ways, (batch, 2, heads, 512), dev)
    with pytest.raises(deca.Error, match="mla_decode_sparse: indices"):
        plan.run_sparse(q, kv, idx.to(torch.int64), out.view(torch.bfloat16), topk_length=lens,
                        attn_sink=sink, lse=lse.view(torch.float32), workspace=ws)


def test_mla_dense_plan_run_fast_path_matches_checked_imports(rng):
    """MlaPlan.run_dense's fast path (torch tensors or deca.Tensors) and the checked imports
    write the same bytes, on CPU tensors (every machine; the CUDA runs are
    test_mla_dense_cuda.py's)."""
    from deca import _C
    from deca._tensors import tensor
    dev = "cpu"
    heads, page, batch = 8, 16, 2
    plan = deca.MlaPlan(heads, sparse=False, page_size=page, max_batch=batch, max_q_len=1,
                        max_seq_len=4 * page, lse=True, device=dev)
    q = torch.from_numpy(rng.standard_normal((batch, 1, heads, 576)).astype(np.float32)).to(dev).to(torch.bfloat16)
    kv = torch.from_numpy(rng.standard_normal((8, page, 1, 576)).astype(np.float32)).to(dev).to(torch.bfloat16)
    table = torch.tensor([[0, 2, 4, 6], [1, 3, 5, 7]], dtype=torch.int32, device=dev)
    lens = torch.tensor([50, 9], dtype=torch.int32, device=dev)
    ws = torch.zeros(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=dev)

    def imported(out, lse):
        return (tensor(q, "q"), tensor(kv, "kv"), tensor(table, "t", "int32"),
                tensor(lens, "l", "int32"), tensor(out, "o", writable=True),
                tensor(lse, "lse", writable=True), 0.0, 1.0, tensor(ws, "ws", writable=True),
                _stream(dev), False)

    ways = [lambda out, lse: plan.run_dense(q, kv, table, lens, out, lse=lse, workspace=ws),
            lambda out, lse: _C.mla_decode_dense_planned_fast(plan._plan, *imported(out, lse)),
            lambda out, lse: _C.mla_decode_dense_planned(plan._plan, *imported(out, lse))]
    out, lse = _same_bytes_every_way(ways, (batch, 1, heads, 512), dev)
    with pytest.raises(deca.Error, match="mla_decode_dense: block_table"):
        plan.run_dense(q, kv, table.to(torch.int64), lens, out.view(torch.bfloat16),
                       lse=lse.view(torch.float32), workspace=ws)
