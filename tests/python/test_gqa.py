"""deca.gqa_decode and deca.GqaPlan against the numpy reference (numpy_reference.py)."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase, close, close_lse, tree_mask

# (name, PagedCase arguments, gqa_decode keywords)
CASES = [
    ("bf16-nhd-g4", dict(seq_lens=[37, 64, 1], hq=8, hkv=2, d=128, page=16), {}),
    ("fp16-hnd-mha", dict(seq_lens=[20, 5], hq=4, hkv=4, d=64, page=8, layout="HND",
                          q_dtype="fp16", kv_dtype="fp16"), {}),
    ("bf16-mqa-page1", dict(seq_lens=[7, 3], hq=8, hkv=1, d=32, page=1), {}),
    ("bf16-page-odd", dict(seq_lens=[16, 17, 15], hq=6, hkv=3, d=16, page=16, layout="HND"), {}),
    ("fp8-kv-scaled", dict(seq_lens=[40, 23], hq=8, hkv=2, d=64, page=16,
                           kv_dtype="fp8_e4m3", k_scale=0.02, v_scale=0.03),
     dict(k_scale=0.02, v_scale=0.03)),
    ("int8-kv-per-head", dict(seq_lens=[33, 9], hq=8, hkv=2, d=64, page=8, layout="HND",
                              kv_dtype="int8", k_scale=0.03, v_scale=0.02, per_head=True), {}),
    ("fp8-kv-per-head-fp16q", dict(seq_lens=[19], hq=4, hkv=2, d=48, page=4, q_dtype="fp16",
                                   kv_dtype="fp8_e4m3", k_scale=0.01, v_scale=0.01,
                                   per_head=True), {}),
    ("shared-kv-views", dict(seq_lens=[30, 12], hq=4, hkv=2, d=64, page=16, shared_kv=True), {}),
    ("speculative-q4", dict(seq_lens=[30, 4], q_len=4, hq=8, hkv=2, d=64, page=16), {}),
    ("window", dict(seq_lens=[50, 9], q_len=3, hq=4, hkv=2, d=64, page=16), dict(window=8)),
    ("bf16-g64", dict(seq_lens=[45, 2], hq=64, hkv=1, d=16, page=32), {}),
    ("fp16-d256-page256", dict(seq_lens=[300], q_len=2, hq=4, hkv=2, d=256, page=256,
                               layout="HND", q_dtype="fp16", kv_dtype="fp16"), {}),
    ("softcap-scale", dict(seq_lens=[25], hq=4, hkv=1, d=64, page=16),
     dict(softcap=1.5, softmax_scale=0.3)),
]


def _scale_kw(case):
    if case.k_scales is None:
        return {}
    return dict(k_scales=case.k_scales, v_scales=case.v_scales)


@pytest.mark.parametrize("name,build,kw", CASES, ids=[c[0] for c in CASES])
def test_gqa_matches_numpy(rng, name, build, kw):
    case = PagedCase(rng, **build)
    out, lse = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                               layout=case.layout, return_lse=True, **_scale_kw(case), **kw)
    want, want_lse = case.reference(**{k: v for k, v in kw.items()
                                       if k not in ("k_scale", "v_scale")})
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    close(out, want, build.get("q_dtype", "bf16"))
    close_lse(lse, want_lse)


def test_tree_mask_sinks_softcap_window(rng):
    case = PagedCase(rng, seq_lens=[40, 6, 21], q_len=6, hq=8, hkv=2, d=64, page=16)
    mask = tree_mask(rng, 3, 6)
    sinks = rng.normal(0.0, 2.0, 8).astype(np.float32)
    kw = dict(tree_mask=mask, sinks=sinks, softcap=20.0, window=12)
    out, lse = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                               return_lse=True, **kw)
    want, want_lse = case.reference(**kw)
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_tree_mask_two_words(rng):
    # 33 drafts: the mask needs a second 32-bit word per row.
    case = PagedCase(rng, seq_lens=[50, 33], q_len=33, hq=2, hkv=1, d=16, page=16)
    mask = tree_mask(rng, 2, 33)
    out = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                          tree_mask=mask)
    want, _ = case.reference(tree_mask=mask)
    close(out, want, "bf16")


def test_sink_of_minus_infinity_is_no_sink(rng):
    case = PagedCase(rng, seq_lens=[18, 30], hq=4, hkv=2, d=32, page=8)
    plain = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens)
    sunk = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                           sinks=np.full(4, -np.inf, np.float32))
    assert np.array_equal(plain.view(np.uint16), sunk.view(np.uint16))


def test_fp8_output_with_scale(rng):
    case = PagedCase(rng, seq_lens=[26, 11], hq=4, hkv=2, d=64, page=16)
    out_scale = 0.01
    out = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                          out_dtype="fp8_e4m3", out_scale=out_scale)
    assert out.dtype == ref.FP8
    want, _ = case.reference()
    close(out.astype(np.float64) * out_scale, want, "fp8_e4m3", out_scale)


def test_fp16_output_from_bf16(rng):
    case = PagedCase(rng, seq_lens=[26], hq=4, hkv=2, d=64, page=16)
    out = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                          out_dtype="fp16")
    assert out.dtype == np.float16
    close(out, case.reference()[0], "fp16")


def test_caller_output_and_lse_are_written_in_place(rng):
    case = PagedCase(rng, seq_lens=[12, 20], hq=4, hkv=2, d=32, page=8)
    out = np.full(case.q.shape, np.nan, ref.BF16)
    lse = np.full(case.q.shape[:3], np.nan, np.float32)
    res_out, res_lse = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                                       out, lse=lse)
    assert res_out is out and res_lse is lse
    want, want_lse = case.reference()
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_strided_output_view(rng):
    case = PagedCase(rng, seq_lens=[12, 20], hq=4, hkv=2, d=32, page=8)
    big = np.full((2, 1, 4, 64), np.nan, ref.BF16)
    out = big[..., 16:48]  # non-contiguous heads
    deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens, out)
    close(out, case.reference()[0], "bf16")
    assert np.isnan(big[..., :16].astype(np.float32)).all()
    assert np.isnan(big[..., 48:].astype(np.float32)).all()


def test_raw_bits_equal_ml_dtypes(rng):
    case = PagedCase(rng, seq_lens=[21, 40], hq=4, hkv=2, d=64, page=16, kv_dtype="fp8_e4m3",
                     k_scale=0.02, v_scale=0.02)
    kw = dict(k_scale=0.02, v_scale=0.02)
    typed = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens, **kw)
    bits = deca.gqa_decode(case.q.view(np.uint16), case.k.view(np.uint8),
                           case.v.view(np.uint8), case.page_table, case.seq_lens,
                           q_dtype="bf16", kv_dtype="fp8_e4m3", **kw)
    assert bits.dtype == ref.BF16
    assert np.array_equal(typed.view(np.uint16), bits.view(np.uint16))


def test_plan_run_matches_one_off(rng):
    case = PagedCase(rng, seq_lens=[35, 8], q_len=2, hq=8, hkv=2, d=64, page=16,
                     kv_dtype="int8", k_scale=0.03, v_scale=0.03)
    plan = deca.GqaPlan(8, 2, 64, 16, q_dtype="bf16", kv_dtype="int8", max_batch=4,
                        max_q_len=2, max_seq_len=64, lse=True)
    assert plan.workspace_bytes == 0 and plan.num_splits >= 1
    assert isinstance(plan.kernel_name, str)
    out = np.empty(case.q.shape, ref.BF16)
    lse = np.empty(case.q.shape[:3], np.float32)
    assert plan.run(case.q, case.k, case.v, case.page_table, case.seq_lens, out, lse=lse,
                    k_scale=0.03, v_scale=0.03) is out
    one = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                          k_scale=0.03, v_scale=0.03)
    assert np.array_equal(out.view(np.uint16), one.view(np.uint16))
    want, want_lse = case.reference()
    close(out, want, "bf16")
    close_lse(lse, want_lse)


def test_plan_run_takes_raw_bits_without_keywords(rng):
    case = PagedCase(rng, seq_lens=[10], hq=4, hkv=2, d=32, page=8, kv_dtype="fp8_e4m3",
                     k_scale=0.05, v_scale=0.05)
    plan = deca.GqaPlan(4, 2, 32, 8, kv_dtype="fp8_e4m3", max_seq_len=16)
    out = np.empty(case.q.shape, np.uint16)
    plan.run(case.q.view(np.uint16), case.k.view(np.uint8), case.v.view(np.uint8),
             case.page_table, case.seq_lens, out, k_scale=0.05, v_scale=0.05)
    close(out.view(ref.BF16), case.reference()[0], "bf16")


def test_fixed_split_mode_gives_same_result(rng):
    case = PagedCase(rng, seq_lens=[70, 3], hq=4, hkv=2, d=32, page=16)
    a = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens)
    b = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens,
                        split_mode="fixed", split_tokens=32)
    close(b, case.reference()[0], "bf16")
    close(a, case.reference()[0], "bf16")


def test_read_only_inputs_are_accepted(rng):
    case = PagedCase(rng, seq_lens=[9], hq=2, hkv=1, d=16, page=4)
    for arr in (case.q, case.k, case.v, case.page_table, case.seq_lens):
        arr.flags.writeable = False
    out = deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens)
    close(out, case.reference()[0], "bf16")


def test_version():
    assert deca.version() == deca.__version__
    assert deca.version().count(".") == 2
