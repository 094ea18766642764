"""DeepSeek V4's MODEL1 sparse MLA decode on CUDA tensors (torch) against the float64 numpy
reference: deca.mla_decode_sparse with one and two caches (pages 2 to 256, heads 1 to 128, q_len 1
to 4, ragged lengths with an empty request in either cache, duplicates, +-inf sinks, unselected
tokens and pad bytes poisoned, padded blocks), checked and unchecked plans; and
deca.compat.flash_mla_with_kvcache on the GPU against the same call on the CPU (FlashMLA's names,
its +inf LSE for a row without keys). Skips without torch and a CUDA device."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import to_cuda as cuda, to_host as host
from deca import compat
from test_mla_model1 import model1_case

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_mla_dense_cuda import LSE_TOL, REL_L2, check, nan_outputs  # noqa: E402

DEV = "cuda:0"


def cuda_cache(view):
    """A MODEL1 cache view (numpy, blocks of the padded page size) -> the same bytes and strides
    on the GPU."""
    blocks, stride = view.shape[0], view.strides[0]
    flat = np.lib.stride_tricks.as_strided(view, (blocks * stride,), (1,))
    t = torch.from_numpy(np.array(flat)).to(DEV)
    return torch.as_strided(t, view.shape, view.strides)


def cuda_extra(second):
    if second is None:
        return {}
    return dict(extra_kv_cache=cuda_cache(second[0]), extra_indices=cuda(second[1]),
                extra_topk_length=cuda(second[2]))


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("heads,q_len,page,extra,pad", [
    (128, 2, 256, (64, 20, 96), 0),   # FlashMLA's production pages: 256 + 64
    (64, 1, 64, (2, 200, 70), 576),   # 64 + 2, padded blocks
    (16, 4, 2, (256, 1, 130), 0),
    (1, 3, 64, None, 0),              # no second cache
    (100, 2, 7, (5, 40, 64), 0),      # odd pages, a cluster with 36 heads in its second CTA
])
def test_model1_on_cuda(rng, heads, q_len, page, extra, pad, checked):
    blocks = max(3, -(-128 // page))
    q, kv, idx, lengths, second, sink = model1_case(
        rng, batch=3, q_len=q_len, heads=heads, page=page, blocks=blocks, topk=70, extra=extra,
        ragged=True, sink=True, pad=pad)
    want, want_lse = ref.mla_sparse(q.astype(np.float64), kv, idx, lengths, sink, extra=second)
    out, lse = nan_outputs(3, q_len, heads)
    deca.mla_decode_sparse(cuda(q), cuda_cache(kv), cuda(idx), out, topk_length=cuda(lengths),
                           attn_sink=cuda(sink), lse=lse, checked=checked, **cuda_extra(second))
    torch.cuda.synchronize()
    check(out, lse, want, want_lse)


def test_flash_mla_compat_model1_on_cuda_matches_the_cpu(rng):
    q, kv, idx, lengths, second, sink = model1_case(rng, batch=4, q_len=2, heads=64,
                                                    extra=(2, 30, 8), ragged=True, sink=True)
    fp8 = torch.float8_e4m3fn
    meta, splits = compat.get_mla_metadata()
    out_c, lse_c = compat.flash_mla_with_kvcache(
        q, kv.view(ref.FP8), None, None, 512, meta, splits, is_fp8_kvcache=True, indices=idx,
        attn_sink=sink, extra_k_cache=second[0].view(ref.FP8), extra_indices_in_kvcache=second[1],
        topk_length=lengths, extra_topk_length=second[2])
    meta, splits = compat.get_mla_metadata()
    out_g, lse_g = compat.flash_mla_with_kvcache(
        cuda(q), cuda_cache(kv).view(fp8), None, None, 512, meta, splits, is_fp8_kvcache=True,
        indices=cuda(idx), attn_sink=cuda(sink), extra_k_cache=cuda_cache(second[0]).view(fp8),
        extra_indices_in_kvcache=cuda(second[1]), topk_length=cuda(lengths),
        extra_topk_length=cuda(second[2]))
    torch.cuda.synchronize()
    assert tuple(out_g.shape) == (4, 2, 64, 512) and tuple(lse_g.shape) == (4, 64, 2)
    want = np.asarray(out_c).astype(np.float64)
    got = host(out_g)
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - want) <= REL_L2 * max(np.linalg.norm(want), 1e-30)
    g, w = host(lse_g), np.asarray(lse_c, np.float64)
    # FlashMLA's convention on both: +inf for a row without a valid key.
    assert np.array_equal(np.isposinf(g), np.isposinf(w))
    fin = np.isfinite(w)
    assert np.abs(g[fin] - w[fin]).max(initial=0) <= LSE_TOL
