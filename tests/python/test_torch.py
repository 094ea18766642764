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
