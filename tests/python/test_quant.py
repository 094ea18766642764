"""Quantisers: per-tensor fp8 / int8 and the MLA 656-byte token packer, checked against
ml_dtypes conversions and the documented byte layout."""

import numpy as np
import pytest

import deca
import numpy_reference as ref


def test_fp8_scale_and_quantize(rng):
    x = (rng.standard_normal((5, 16, 2, 64)) * 3).astype(np.float32)
    scale = deca.choose_fp8_scale(x)
    assert scale == pytest.approx(np.abs(x).max() / 448.0, rel=1e-6)
    q = deca.quantize_fp8(x, scale)
    assert q.dtype == ref.FP8 and q.shape == x.shape
    want = (x / np.float32(scale)).astype(ref.FP8)
    assert np.array_equal(q.view(np.uint8), want.view(np.uint8))


def test_fp8_quantize_from_bf16_into_uint8_out(rng):
    x = rng.standard_normal((3, 40)).astype(ref.BF16)
    out = np.zeros((3, 40), np.uint8)
    assert deca.quantize_fp8(x, 0.01, out) is out
    want = (x.astype(np.float32) / np.float32(0.01)).astype(ref.FP8)
    assert np.array_equal(out, want.view(np.uint8))


def test_int8_scale_and_quantize(rng):
    x = (rng.standard_normal((4, 8, 32)) * 5).astype(np.float32)
    scale = deca.choose_int8_scale(x)
    assert scale == pytest.approx(np.abs(x).max() / 127.0, rel=1e-6)
    q = deca.quantize_int8(x, scale)
    assert q.dtype == np.int8
    want = np.clip(np.rint(x / np.float32(scale)), -127, 127).astype(np.int8)
    assert np.array_equal(q, want)


def test_all_zero_scales_are_one():
    z = np.zeros((4, 4), np.float32)
    assert deca.choose_fp8_scale(z) == 1.0 and deca.choose_int8_scale(z) == 1.0


def test_pack_mla_fp8_layout(rng):
    x = rng.standard_normal((3, 576))
    x[0, :128] *= 1000.0
    x[1, 128:256] *= 1e-3
    xb = x.astype(ref.BF16)
    packed = deca.pack_mla_fp8(xb)
    assert packed.shape == (3, 656) and packed.dtype == np.uint8
    for t in range(3):
        scales = packed[t, 512:528].view(np.float32)
        for g in range(4):
            amax = np.abs(xb[t, g * 128:(g + 1) * 128].astype(np.float64)).max()
            s = float(scales[g])
            # The smallest power of two that brings the group's max within e4m3's range.
            assert s == 2.0 ** np.round(np.log2(s))
            assert amax / s <= 448.0 < amax / (s / 2)
            want = (xb[t, g * 128:(g + 1) * 128].astype(np.float32) / np.float32(s)).astype(
                ref.FP8)
            assert np.array_equal(packed[t, g * 128:(g + 1) * 128], want.view(np.uint8))
        assert np.array_equal(packed[t, 528:].view(np.uint16), xb[t, 512:].view(np.uint16))


def test_unpack_inverts_pack(rng):
    x = rng.standard_normal((2, 5, 576)).astype(ref.BF16)
    packed = deca.pack_mla_fp8(x)
    back = deca.unpack_mla_fp8(packed)
    assert back.shape == (2, 5, 576) and back.dtype == np.float32
    want = np.array([[ref.unpack_fp8_token(tok) for tok in row] for row in packed])
    np.testing.assert_array_equal(back.astype(np.float64), want)
    # fp8 keeps 4 significant bits: within 1/16 relative (plus the scaled subnormal step).
    np.testing.assert_allclose(back[..., :512], x[..., :512].astype(np.float32), rtol=2 ** -4,
                               atol=2 ** -9 * 2.0 ** np.ceil(np.log2(8 / 448)))
    bf = deca.unpack_mla_fp8(packed, out_dtype="bf16")
    assert np.array_equal(bf.astype(np.float32), back)


@pytest.mark.parametrize("sigma", [1e-3, 1.0, 300.0])
def test_quantize_mla_fp8_e4m3(rng, sigma):
    """One power-of-two scale for the whole cache (the smallest with max|x| / scale <= 448),
    codes = ml_dtypes' e4m3 rounding of x / scale; into a given uint8 out as well."""
    x = (rng.standard_normal((3, 16, 1, 576)) * sigma).astype(ref.BF16)
    q, scale = deca.quantize_mla_fp8_e4m3(x)
    assert q.dtype == ref.FP8 and q.shape == x.shape
    amax = np.abs(x.astype(np.float64)).max()
    assert scale == 2.0 ** np.ceil(np.log2(amax / 448.0))
    assert amax / scale <= 448.0 < amax / (scale / 2)
    want = (x.astype(np.float64) / scale).astype(np.float32).astype(ref.FP8)
    assert np.array_equal(q.view(np.uint8), want.view(np.uint8))
    bits = np.full(x.shape, 0x55, np.uint8)
    out, again = deca.quantize_mla_fp8_e4m3(x, bits)
    assert out is bits and again == scale and np.array_equal(bits, q.view(np.uint8))


def test_quantize_mla_fp8_e4m3_errors():
    with pytest.raises(deca.Error, match=r"quantize_mla_fp8_e4m3: src: expected shape "
                                         r"\[\.\.\., 576\]"):
        deca.quantize_mla_fp8_e4m3(np.zeros((2, 512), ref.BF16))
    x = np.zeros((2, 576), ref.BF16)
    x[1, 3] = np.nan
    out = np.full((2, 576), 0x55, np.uint8)
    with pytest.raises(deca.Error, match=r"quantize_mla_fp8_e4m3: src: expected finite values"):
        deca.quantize_mla_fp8_e4m3(x, out)
    assert np.all(out == 0x55)
    assert deca.quantize_mla_fp8_e4m3(np.zeros((1, 576), ref.BF16))[1] == 1.0
