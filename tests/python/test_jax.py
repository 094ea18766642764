"""jax arrays through DLPack: native bf16 (kDLBfloat) and fp8 e4m3fn (kDLFloat8_e4m3fn = 10),
the dtype codes numpy cannot produce."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase, close, close_lse

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def _j(a):
    # On the host device: these cases check the CPU backend's numpy outputs. jax arrays are
    # immutable, so deca cannot allocate a jax output on a GPU (it says so); a machine with a GPU
    # would otherwise place jnp.asarray on it.
    cpu = jax.devices("cpu")[0]
    return jax.device_put(jnp.asarray(a), cpu)  # ml_dtypes bf16 / fp8 stay jnp.bfloat16 / float8_e4m3fn


def test_jax_bf16_and_native_fp8_cache(rng):
    case = PagedCase(rng, seq_lens=[29, 8], hq=8, hkv=2, d=64, page=8, layout="HND",
                     kv_dtype="fp8_e4m3", k_scale=0.02, v_scale=0.03)
    q, k = _j(case.q), _j(case.k)
    assert q.dtype == jnp.bfloat16 and k.dtype == jnp.float8_e4m3fn
    t = deca.Tensor(k)
    assert (t.dtype, t.origin_dtype) == ("fp8_e4m3", "float8_e4m3fn")
    out, lse = deca.gqa_decode(q, k, _j(case.v), _j(case.page_table), _j(case.seq_lens),
                               layout="HND", k_scale=0.02, v_scale=0.03, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == ref.BF16  # CPU: numpy output
    want, want_lse = case.reference()
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_jax_kv_dtype_keyword_must_match(rng):
    case = PagedCase(rng, seq_lens=[9], hq=2, hkv=1, d=16, page=8)
    with pytest.raises(deca.Error, match=r"gqa_decode: k_cache: expected dtype int8, got bfloat16"):
        deca.gqa_decode(_j(case.q), _j(case.k), _j(case.v), _j(case.page_table),
                        _j(case.seq_lens), kv_dtype="int8")


def test_jax_mla_dense(rng):
    q = rng.standard_normal((1, 1, 4, 576)).astype(ref.BF16)
    kv = rng.standard_normal((2, 16, 1, 576)).astype(ref.BF16)
    table = np.array([[1, 0]], np.int32)
    lens = np.array([20], np.int32)
    out = deca.mla_decode_dense(_j(q), _j(kv), _j(table), _j(lens))
    want, _ = ref.mla_dense(q.astype(np.float64), kv.astype(np.float64), table, lens)
    close(out, want, "bf16")


def test_jax_arrays_cannot_be_outputs(rng):
    case = PagedCase(rng, seq_lens=[9], hq=2, hkv=1, d=16, page=8)
    with pytest.raises(deca.Error, match=r"gqa_decode: out: expected a writable"):
        deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                        _j(np.zeros(case.q.shape, ref.BF16)))
