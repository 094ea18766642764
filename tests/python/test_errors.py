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


# --- issue 9: the classes the fuzzer found ---------------------------------------------------

def test_read_only_memory_behind_a_deca_tensor_is_not_an_output(tmp_path):
    ro = np.zeros((4, 8), ref.FP8)
    ro.flags.writeable = False
    _expect(r"quantize_fp8: out: expected a writable tensor", deca.quantize_fp8,
            np.ones((4, 8), np.float32), 0.5, out=deca.as_tensor(ro))
    assert not ro.view(np.uint8).any()
    path = tmp_path / "ro.bin"
    np.zeros(32, np.uint8).tofile(path)
    mm = np.memmap(path, np.uint8, "r", shape=(4, 8))
    _expect(r"quantize_fp8: out: expected a writable tensor", deca.quantize_fp8,
            np.ones((4, 8), np.float32), 0.5, out=deca.as_tensor(mm, dtype="fp8_e4m3"))
    # A writable array stays usable as an output through deca.as_tensor.
    rw = np.zeros((4, 8), ref.FP8)
    deca.quantize_fp8(np.ones((4, 8), np.float32), 0.5, out=deca.as_tensor(rw))
    assert (rw.astype(np.float32) == 2).all()


def test_out_sharing_bytes_with_an_index_input_is_refused(case):
    buf = np.zeros(4 * 8 * 64 * 2, np.uint8)
    pt = buf[:case.page_table.nbytes].view(np.int32).reshape(case.page_table.shape)
    pt[...] = case.page_table
    out = buf[:2 * 1 * 4 * 32 * 2].view(ref.BF16).reshape(2, 1, 4, 32)
    before = buf.copy()
    _expect(r"gqa_decode: out: expected memory that shares no byte with page_table", _run, case,
            page_table=pt, out=out)
    assert np.array_equal(buf, before)
    lens = buf[:8].view(np.int32)
    lens[...] = case.seq_lens
    _expect(r"gqa_decode: out: .*seq_lens", _run, case, seq_lens=lens,
            out=buf[:512].view(ref.BF16).reshape(2, 1, 4, 32))


def test_out_overlapping_q_or_lse_overlapping_out_is_refused(case):
    _expect(r"gqa_decode: out: .*with q", _run, case, out=case.q)
    out = np.zeros((2, 1, 4, 32), ref.BF16)
    _expect(r"gqa_decode: lse: .*with out", _run, case, out=out,
            lse=out.view(np.float32).reshape(-1)[:8].reshape(2, 1, 4))
    src = np.ones((4, 8), np.float32)
    _expect(r"quantize_int8: out: .*with src", deca.quantize_int8, src, 1.0,
            out=src.view(np.int8)[:, :8])


def test_stride_zero_outputs_of_the_quantisers_are_refused_at_once():
    src = np.lib.stride_tricks.as_strided(np.ones(8, np.float32), (2 ** 31 - 1, 8), (0, 4))
    out = np.lib.stride_tricks.as_strided(np.zeros(8, np.int8), (2 ** 31 - 1, 8), (0, 1),
                                          writeable=True)
    _expect(r"quantize_int8: out: expected strides that map every index", deca.quantize_int8,
            src, 1.0, out=out)
    po = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (2 ** 31 - 1, 1, 1, 1, 4),
                                         (0, 16, 16, 16, 4))
    pl = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (2 ** 31 - 1, 1, 1, 1),
                                         (0, 4, 4, 4))
    _expect(r"combine: partial_out: dim 0 \(num_splits\)", deca.combine, po, pl)


def test_dtype_keywords_must_match_out_and_deca_tensors(case, rng):
    po = rng.standard_normal((2, 1, 1, 2, 4)).astype(np.float32)
    pl = rng.standard_normal((2, 1, 1, 2)).astype(np.float32)
    _expect(r"combine: out: expected dtype int8", deca.combine, po, pl,
            out=np.zeros((1, 1, 2, 4), np.float32), out_dtype="int8")
    packed = deca.pack_mla_fp8(np.ones((1, 576), ref.BF16))
    _expect(r"unpack_mla_fp8: out: expected dtype fp16", deca.unpack_mla_fp8, packed,
            out=np.zeros((1, 576), np.float32), out_dtype="fp16")
    assert deca.unpack_mla_fp8(packed, out_dtype="bf16").dtype == ref.BF16
    _expect(r"gqa_decode: q: expected dtype fp16, got bf16 \(a deca.Tensor\)", _run, case,
            q=deca.as_tensor(case.q), q_dtype="fp16")


def test_max_seq_len_is_a_promise_the_request_must_keep(case):
    _expect(r"gqa_decode: seq_lens\[0\]: .*max_seq_len \(1\), got 20", _run, case, max_seq_len=1)


def test_nan_per_head_scales_are_refused(rng):
    c = PagedCase(rng, seq_lens=[5], hq=2, hkv=2, d=16, page=4, per_head=True)
    ks = c.k_scales.copy()
    ks[1] = np.nan
    out = np.full((1, 1, 2, 16), 3, ref.BF16)
    _expect(r"gqa_decode: k_scales\[1\]: expected a finite value, got nan", deca.gqa_decode,
            c.q, c.k, c.v, c.page_table, c.seq_lens, out, k_scales=ks, v_scales=c.v_scales)
    assert (out.astype(np.float32) == 3).all()


def test_batch_zero_is_a_no_op_everywhere(case):
    q = np.zeros((0, 1, 4, 32), ref.BF16)
    out = deca.gqa_decode(q, case.k, case.v, np.zeros((0, 3), np.int32), np.zeros(0, np.int32))
    assert out.shape == (0, 1, 4, 32)
    mq = np.zeros((0, 1, 2, 576), ref.BF16)
    kv = np.zeros((2, 4, 1, 576), ref.BF16)
    out, lse = deca.mla_decode_dense(mq, kv, np.zeros((0, 2), np.int32), np.zeros(0, np.int32),
                                     return_lse=True)
    assert out.shape == (0, 1, 2, 512) and lse.shape == (0, 1, 2)
    packed = deca.pack_mla_fp8(np.zeros((2, 4, 1, 576), ref.BF16))
    out = deca.mla_decode_sparse(mq, packed, np.zeros((0, 1, 4), np.int32))
    assert out.shape == (0, 1, 2, 512)
    assert deca.pack_mla_fp8(np.zeros((0, 576), ref.BF16)).shape == (0, 656)


def test_messages_name_the_callers_argument(case):
    _expect(r"gqa_decode: page_table: expected rank 2 \[batch, max_pages\], got rank 1", _run,
            case, page_table=case.page_table.reshape(-1))
    _expect(r"gqa_decode: page_table: expected dtype int32, got int64", _run, case,
            page_table=case.page_table.astype(np.int64))
    _expect(r"gqa_decode: q: dim 3 \(head_dim\)", _run, case, q=case.q[..., :16])
    _expect(r"gqa_decode: q: expected dtype bf16 \| fp16, got fp32", _run, case,
            q=case.q.astype(np.float32))
    _expect(r"gqa_decode: q: expected a tensor, got None", _run, case, q=None)
    _expect(r"gqa_decode: return_lse: expected True or False", _run, case, return_lse="yes")
    _expect(r"gqa_decode: window: expected an int32 value", _run, case, window=2 ** 31)
    _expect(r"quantize_fp8: out: expected dtype fp8_e4m3 .*got int8", deca.quantize_fp8,
            np.ones(4, np.float32), 1.0, out=np.zeros(4, np.int8))
    _expect(r"combine: out_dtype: expected a dtype name", deca.combine,
            np.zeros((1, 1, 1, 1, 4), np.float32), np.zeros((1, 1, 1, 1), np.float32),
            out_dtype=5)


def test_mla_one_shot_messages_name_the_tensors():
    q = np.zeros((1, 1, 2, 576), ref.BF16)
    packed = deca.pack_mla_fp8(np.zeros((1, 4, 1, 576), ref.BF16))
    _expect(r"mla_decode_sparse: indices: dim 2 \(topk\): expected 1\.\.", deca.mla_decode_sparse,
            q, packed, np.zeros((1, 1, 0), np.int32))
    _expect(r"mla_decode_dense: kv_cache: dim 1 \(page_size\): expected 1\.\.2147483647, got 0",
            deca.mla_decode_dense, q, np.zeros((1, 0, 1, 576), ref.BF16),
            np.zeros((1, 1), np.int32), np.ones(1, np.int32))
    _expect(r"mla_decode_dense: block_table: expected rank 2", deca.mla_decode_dense, q,
            np.zeros((1, 4, 1, 576), ref.BF16), np.zeros(1, np.int32), np.ones(1, np.int32))
