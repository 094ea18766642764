"""How deca reads a tensor: dtype, shape, element strides, offset and device (deca.Tensor)."""

import numpy as np
import pytest

import deca
import numpy_reference as ref


@pytest.mark.parametrize("np_dtype,name", [
    (np.float16, "fp16"), (np.float32, "fp32"), (np.int8, "int8"), (np.uint8, "uint8"),
    (np.int32, "int32"), (np.uint32, "uint32"), (ref.BF16, "bf16"), (ref.FP8, "fp8_e4m3"),
])
def test_dtypes(np_dtype, name):
    t = deca.as_tensor(np.zeros((2, 3), np_dtype))
    assert isinstance(t, deca.Tensor)
    assert t.dtype == name and t.shape == (2, 3) and t.strides == (3, 1)
    assert t.device.kind == deca._C.DeviceKind.CPU


def test_strides_are_elements_and_offsets_are_kept():
    base = np.zeros((4, 6, 8), np.float32)
    view = base.transpose(2, 0, 1)[1:, :, 2:5]
    t = deca.Tensor(view)
    assert t.shape == (7, 4, 3)
    assert t.strides == (1, 48, 8)
    assert t.data_ptr == base.ctypes.data + (1 + 2 * 8) * 4
    assert t.nbytes == 7 * 4 * 3 * 4


def test_bits_with_declared_dtype():
    t = deca.Tensor(np.zeros(5, np.uint16), "fp16", "f: x")
    assert t.dtype == "fp16" and t.origin_dtype == "uint16"
    t = deca.Tensor(np.zeros(5, np.uint8), "fp8_e4m3", "f: x")
    assert t.dtype == "fp8_e4m3"
    with pytest.raises(deca.Error, match=r"f: x: expected dtype fp8_e4m3 \(or its bits as uint8\), got int8"):
        deca.Tensor(np.zeros(5, np.int8), "fp8_e4m3", "f: x")
    with pytest.raises(deca.Error, match=r"f: x: expected dtype int32, got uint32"):
        deca.Tensor(np.zeros(5, np.uint32), "int32", "f: x")


@pytest.mark.parametrize("bad,what", [(np.zeros(3, np.float64), "float64"),
                                      (np.zeros(3, bool), "bool"),
                                      (np.zeros(3, np.complex64), "complex64"),
                                      (np.zeros(3, np.int64), "int64")])
def test_unsupported_dtypes(bad, what):
    with pytest.raises(deca.Error, match=rf"f: x: expected dtype bf16, .*got {what}"):
        deca.Tensor(bad, None, "f: x")


def test_rank_limit():
    with pytest.raises(deca.Error, match=r"f: x: expected rank <= 6, got 7"):
        deca.Tensor(np.zeros((1,) * 7, np.float32), None, "f: x")


def test_scalar_keywords_take_numpy_scalars(rng):
    from cases import PagedCase, close
    case = PagedCase(rng, seq_lens=[11], hq=2, hkv=1, d=16, page=4, kv_dtype="int8",
                     k_scale=0.05, v_scale=0.04)
    out = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                          k_scale=np.float32(0.05), v_scale=np.float64(0.04),
                          window=np.int64(0))
    close(out, case.reference()[0], "bf16")
