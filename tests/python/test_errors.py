"""Bad arguments raise deca.Error (a ValueError) naming the argument, and write nothing."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase


@pytest.fixture
def case(rng):
    return PagedCase(rng, seq_lens=[20, 9], hq=4, hkv=2, d=32, page=8)


def _run(case, **kw):
    args = dict(q=case.q, k_cache=case.k, v_cache=case.v, page_table=case.page_table,
                seq_lens=case.seq_lens)
    args.update({k: v for k, v in kw.items() if k in args})
    rest = {k: v for k, v in kw.items() if k not in args}
    return deca.gqa_decode(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"),
                           args.pop("page_table"), args.pop("seq_lens"), **rest)


def _expect(match, fn, *a, **kw):
    with pytest.raises(deca.Error, match=match) as info:
        fn(*a, **kw)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_error_is_a_value_error():
    assert issubclass(deca.Error, ValueError)


def test_unsupported_dtype_names_the_argument(case):
    msg = _expect(r"gqa_decode: q: expected dtype .*got float64", _run, case,
                  q=case.q.astype(np.float64))
    assert "float64" in msg


def test_declared_dtype_must_match_real_dtype(case):
    _expect(r"gqa_decode: k_cache: expected dtype fp8_e4m3.*got bf16", _run, case,
            kv_dtype="fp8_e4m3")
    _expect(r"gqa_decode: q: expected dtype bf16 \(or its bits as uint16\), got float32", _run,
            case, q=case.q.astype(np.float32), q_dtype="bf16")


def test_raw_bits_need_a_dtype_keyword(case):
    _expect(r"gqa_decode: q: expected bf16 or fp16, got uint16", _run, case,
            q=case.q.view(np.uint16))
    _expect(r"gqa_decode: k_cache: .*kv_dtype=\"fp8_e4m3\"", _run, case,
            k_cache=case.k.astype(np.float32).astype(ref.FP8).view(np.uint8),
            v_cache=case.v.astype(np.float32).astype(ref.FP8).view(np.uint8))


def test_not_a_tensor(case):
    _expect(r"gqa_decode: seq_lens: expected a DLPack tensor .*got list", _run, case,
            seq_lens=[20, 9])


def test_wrong_rank(case):
    _expect(r"gqa_decode: q: expected rank 4", _run, case, q=case.q[0])


def test_bad_keyword_values(case):
    _expect(r"gqa_decode: layout: expected \"NHD\" or \"HND\", got 'NDH'", _run, case,
            layout="NDH")
    _expect(r"gqa_decode: split_mode", _run, case, split_mode="sometimes")
    _expect(r"gqa_decode: q_dtype: expected a dtype name .*got \"bfloat17\"", _run, case,
            q_dtype="bfloat17")


def test_wrong_index_dtype_from_the_api(case):
    _expect(r"page_table", _run, case, page_table=case.page_table.astype(np.int64))
    _expect(r"seq_lens", _run, case, seq_lens=case.seq_lens.astype(np.float32))


def test_seq_len_beyond_pages_writes_nothing(case):
    out = np.full(case.q.shape, 7.0, ref.BF16)
    lens = case.seq_lens.copy()
    lens[1] = case.page_table.shape[1] * 8 + 1
    _expect(r"seq_lens", _run, case, seq_lens=lens, out=out)
    assert (out.astype(np.float32) == 7.0).all()


def test_page_out_of_range_writes_nothing(case):
    out = np.full(case.q.shape, 7.0, ref.BF16)
    table = case.page_table.copy()
    table[0, 0] = 1 << 30
    _expect(r"page_table", _run, case, page_table=table, out=out)
    assert (out.astype(np.float32) == 7.0).all()


def test_wrong_output_shape_writes_nothing(case):
    out = np.full((2, 1, 4, 16), 7.0, ref.BF16)
    _expect(r"out", _run, case, out=out)
    assert (out.astype(np.float32) == 7.0).all()


def test_read_only_output(case):
    out = np.zeros(case.q.shape, ref.BF16)
    out.flags.writeable = False
    _expect(r"gqa_decode: out: expected a writable", _run, case, out=out)


def test_sinks_wrong_length(case):
    _expect(r"sinks", _run, case, sinks=np.zeros(3, np.float32))


def test_plan_config_errors():
    _expect(r"num_kv_heads|num_q_heads", deca.GqaPlan, 6, 4, 64, 16, max_seq_len=64)
    _expect(r"GqaPlan: kv_dtype", deca.GqaPlan, 4, 2, 64, 16, kv_dtype="e5m2", max_seq_len=64)
    _expect(r"GqaPlan: device", deca.GqaPlan, 4, 2, 64, 16, device="tpu", max_seq_len=64)


def test_plan_without_max_seq_len_says_what_to_pass():
    # A deca.Error (not a TypeError) that names the keyword and gives an example value.
    _expect(r"GqaPlan: max_seq_len: expected the longest KV length .* max_seq_len=32768",
            deca.GqaPlan, 4, 2, 64, 16, device="cpu")
    _expect(r"max_seq_len: expected > 0 .*got 0", deca.GqaPlan, 4, 2, 64, 16, max_seq_len=0)


def test_fixed_split_mode_needs_no_split_tokens(case):
    # The one-off call too: same bits as the default split on the CPU (one split there).
    np.testing.assert_array_equal(_run(case, split_mode="fixed").view(np.uint16),
                                  _run(case).view(np.uint16))
    plan = deca.GqaPlan(4, 2, 64, 16, max_seq_len=64, split_mode="fixed")
    assert plan.config.split_tokens == deca.gqa.DEFAULT_FIXED_SPLIT_TOKENS
    assert deca.GqaPlan(4, 2, 64, 16, max_seq_len=64).config.split_tokens == 0


def test_plan_run_checks_dtypes_against_the_plan(case):
    plan = deca.GqaPlan(4, 2, 32, 8, max_batch=2, max_seq_len=64)
    out = np.empty(case.q.shape, ref.BF16)
    _expect(r"gqa_decode: q: expected dtype bf16", plan.run, case.q.astype(np.float16),
            case.k, case.v, case.page_table, case.seq_lens, out)


def test_mla_errors(rng):
    q = rng.standard_normal((1, 1, 4, 576)).astype(ref.BF16)
    kv = np.zeros((2, 16, 1, 656), np.uint8)
    idx = np.full((1, 1, 8), 1000, np.int32)  # beyond 2 blocks * 16 tokens
    _expect(r"mla_decode_sparse: .*indices", deca.mla_decode_sparse, q, kv, idx)
    _expect(r"mla_decode_sparse: kv_cache: expected rank 4", deca.mla_decode_sparse, q, kv[0],
            idx)
    dense_kv = np.zeros((2, 16, 1, 512), ref.BF16)
    _expect(r"mla_decode_dense: .*kv_cache", deca.mla_decode_dense, q, dense_kv,
            np.zeros((1, 2), np.int32), np.array([5], np.int32))


def test_combine_errors(rng):
    po = np.zeros((2, 1, 1, 4, 8), np.float32)
    _expect(r"combine: .*partial_lse", deca.combine, po, np.zeros((2, 1, 1, 3), np.float32))


def test_quant_errors():
    _expect(r"quantize_fp8: .*scale", deca.quantize_fp8, np.ones(4, np.float32), 0.0)
    _expect(r"pack_mla_fp8: .*src", deca.pack_mla_fp8, np.ones((2, 100), ref.BF16))
