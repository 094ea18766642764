"""deca.compat checks what engines pass, in the engines' own names: the FlashInfer wrapper's run()
against what its plan() promised, the dtype spellings plan() and deca's keywords accept, and
each compat call's errors (the compat function, the caller's argument, the one expected value,
a hint at the likely mistake). Every check holds on a repeated call of a shape too, where the
call goes through its prepared fast path first."""

import ml_dtypes
import numpy as np
import pytest

import deca
import deca.compat as compat
import numpy_reference as ref
from cases import PagedCase, csr_pages
from test_mla import _sparse_case

RUN = "BatchDecodeWithPagedKVCacheWrapper.run"
PLAN = "BatchDecodeWithPagedKVCacheWrapper.plan"
FA = "flash_attn_with_kvcache"
MLA = "flash_mla_with_kvcache"


def _expect(match, fn, *a, **kw):
    with pytest.raises(deca.Error, match=match) as info:
        fn(*a, **kw)
    return str(info.value)


# --- FlashInfer: run() against plan() -------------------------------------------------------------

@pytest.fixture
def planned(rng):
    """A wrapper planned for 8 / 2 heads, head_dim 64, page 16, bf16, and its case."""
    case = PagedCase(rng, seq_lens=[20, 9], hq=8, hkv=2, d=64, page=16)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16, q_data_type="bfloat16")
    return w, case


def test_flashinfer_run_takes_what_plan_promised(planned):
    w, case = planned
    out = w.run(case.q[:, 0], (case.k, case.v))
    np.testing.assert_array_equal(out.view(np.uint16),
                                  deca.gqa_decode(case.q, case.k, case.v, case.page_table,
                                                  case.seq_lens)[:, 0].view(np.uint16))


def test_flashinfer_run_refuses_other_heads(planned, rng):
    w, case = planned
    q16 = rng.standard_normal((2, 16, 64)).astype(ref.BF16)
    _expect(rf"{RUN}: q: dim 1 \(num_qo_heads\): expected 8 \(plan\(\)'s num_qo_heads\), "
            r"got 16", w.run, q16, (case.k, case.v))
    _expect(rf"{RUN}: q: dim 2 \(head_dim\): expected 64 \(plan\(\)'s head_dim\), got 32",
            w.run, case.q[:, 0, :, :32], (case.k, case.v))
    _expect(rf"{RUN}: q: dim 0 \(batch\): expected 2", w.run, case.q[:1, 0], (case.k, case.v))


def test_flashinfer_run_refuses_another_page_size_and_kv_heads(planned):
    w, case = planned
    k32 = np.zeros((3, 32, 2, 64), ref.BF16)  # pages of 32
    _expect(rf"{RUN}: paged_kv_cache\[0\]: expected .* page_size 16 and num_kv_heads 2 "
            r"\(plan\(\)'s\), got \[3, 32, 2, 64\]", w.run, case.q[:, 0], (k32, k32))
    _expect(rf"{RUN}: paged_kv_cache\[0\]: expected .* num_kv_heads 2 \(plan\(\)'s\), got "
            r"\[3, 16, 4, 64\]", w.run, case.q[:, 0], (np.zeros((3, 16, 4, 64), ref.BF16),) * 2)
    combined = np.stack([k32, k32], axis=1)
    _expect(rf"{RUN}: paged_kv_cache\[:, 0\]: expected", w.run, case.q[:, 0], combined)


def test_flashinfer_run_names_an_hnd_cache_passed_as_nhd(rng):
    case = PagedCase(rng, seq_lens=[20, 9], hq=8, hkv=2, d=64, page=4, layout="HND")
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))  # NHD by default
    w.plan(*csr_pages(case, 4), 8, 2, 64, 4, q_data_type="bf16")
    msg = _expect(rf"{RUN}: paged_kv_cache\[0\]: expected .*NHD", w.run, case.q[:, 0],
                  (case.k, case.v))
    assert 'kv_layout="HND"' in msg


def test_flashinfer_run_refuses_another_dtype(planned):
    w, case = planned
    _expect(rf"{RUN}: q: expected ml_dtypes.bfloat16 \(plan\(\)'s q_data_type\), got "
            r"numpy.float16", w.run, case.q[:, 0].astype(np.float16), (case.k, case.v))
    fp8 = case.k.astype(np.float32).astype(ref.FP8)
    _expect(rf"{RUN}: paged_kv_cache\[0\]: expected ml_dtypes.bfloat16 \(plan\(\)'s "
            r"kv_data_type", w.run, case.q[:, 0], (fp8, fp8))


def test_flashinfer_default_q_data_type_is_float16(rng):
    """FlashInfer's default q_data_type is float16: a bf16 q then is a mistake to name."""
    case = PagedCase(rng, seq_lens=[20, 9], hq=8, hkv=2, d=64, page=16)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8))
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16)
    msg = _expect(rf"{RUN}: q: expected numpy.float16 \(plan\(\)'s q_data_type\), got "
                  r"ml_dtypes.bfloat16", w.run, case.q[:, 0], (case.k, case.v))
    assert "q_data_type=ml_dtypes.bfloat16" in msg


def test_flashinfer_replan_checks_against_the_new_plan(planned, rng):
    w, case = planned
    w.run(case.q[:, 0], (case.k, case.v))
    other = PagedCase(rng, seq_lens=[5, 30, 7], hq=4, hkv=1, d=32, page=8)
    w.plan(*csr_pages(other, 8), 4, 1, 32, 8, q_data_type=np.dtype(ml_dtypes.bfloat16))
    out = w.run(other.q[:, 0], (other.k, other.v))
    want = deca.gqa_decode(other.q, other.k, other.v, other.page_table, other.seq_lens)
    np.testing.assert_array_equal(out.view(np.uint16), want[:, 0].view(np.uint16))
    _expect(rf"{RUN}: q: dim 0 \(batch\): expected 3", w.run, case.q[:, 0], (case.k, case.v))


@pytest.mark.parametrize("spelling,want", [
    ("bfloat16", "bf16"), ("bf16", "bf16"), ("torch.bfloat16", "bf16"),
    (ml_dtypes.bfloat16, "bf16"), (np.dtype(ml_dtypes.bfloat16), "bf16"),
    ("float16", "fp16"), ("half", "fp16"), ("fp16", "fp16"), (np.float16, "fp16"),
    (np.dtype("float16"), "fp16"),
])
def test_flashinfer_plan_takes_every_q_dtype_spelling(planned, spelling, want):
    w, case = planned
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16, q_data_type=spelling)
    assert w._planned.q_dtype == want


@pytest.mark.parametrize("spelling", ["fp8", "e4m3", "fp8_e4m3", "float8_e4m3fn", "FP8",
                                      ml_dtypes.float8_e4m3fn,
                                      np.dtype(ml_dtypes.float8_e4m3fn)])
def test_flashinfer_plan_takes_every_fp8_spelling(planned, spelling):
    w, case = planned
    w.plan(*csr_pages(case, 16), 8, 2, 64, 16, q_data_type="bf16", kv_data_type=spelling)
    assert w._planned.kv_dtype == "fp8_e4m3"


def test_flashinfer_plan_names_a_dtype_it_cannot_read(planned):
    w, case = planned
    msg = _expect(rf"{PLAN}: kv_data_type: expected a dtype deca reads", w.plan,
                  *csr_pages(case, 16), 8, 2, 64, 16, kv_data_type="float8_e5m2")
    assert "did you mean fp8_e4m3" in msg
    _expect(rf"{PLAN}: q_data_type: expected torch.float16 or torch.bfloat16", w.plan,
            *csr_pages(case, 16), 8, 2, 64, 16, q_data_type="fp8")
    _expect(rf"{PLAN}: head_dim: expected an int >= 1, got 0", w.plan, *csr_pages(case, 16), 8, 2,
            0, 16)


# --- deca's own dtype keywords: the CLI's "fp8" and the array libraries' names -------------------

def test_fp8_keyword_spellings_are_deca_names(rng):
    case = PagedCase(rng, seq_lens=[20, 9], hq=4, hkv=2, d=32, page=8, kv_dtype="fp8_e4m3",
                     k_scale=0.05, v_scale=0.05)
    k8, v8 = case.k.view(np.uint8), case.v.view(np.uint8)
    want = deca.gqa_decode(case.q, k8, v8, case.page_table, case.seq_lens,
                           kv_dtype="fp8_e4m3", k_scale=0.05, v_scale=0.05)
    for spelling in ("fp8", "e4m3", "float8_e4m3fn", "FP8_E4M3"):
        got = deca.gqa_decode(case.q, k8, v8, case.page_table, case.seq_lens,
                              kv_dtype=spelling, k_scale=0.05, v_scale=0.05)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert deca.GqaPlan(4, 2, 32, 8, kv_dtype="fp8", q_dtype="bfloat16",
                        max_seq_len=64).config.kv_dtype == "fp8_e4m3"
    assert deca.as_tensor(k8, dtype="fp8").dtype == "fp8_e4m3"
    msg = _expect(r"GqaPlan: kv_dtype: expected a dtype name .*got \"e5m2\"", deca.GqaPlan, 4,
                  2, 32, 8, kv_dtype="e5m2", max_seq_len=64)
    assert "fp8_e4m3" in msg


# --- flash_attn_with_kvcache --------------------------------------------------------------------

@pytest.fixture
def fa_case(rng):
    return PagedCase(rng, seq_lens=[20, 9], hq=4, hkv=2, d=32, page=8)


def _fa(case, repeat, **kw):
    args = dict(cache_seqlens=case.seq_lens, block_table=case.page_table, causal=True)
    args.update(kw)
    if repeat:  # the shape is prepared: the call goes through its fast path first
        compat.flash_attn_with_kvcache(case.q, case.k, case.v, cache_seqlens=case.seq_lens,
                                       block_table=case.page_table, causal=True)
    return compat.flash_attn_with_kvcache(case.q, case.k, case.v, **args)


@pytest.mark.parametrize("repeat", [False, True])
def test_flash_attn_int64_indices_name_the_argument(fa_case, repeat):
    c = fa_case
    _expect(rf"{FA}: block_table: expected numpy.int32, got numpy.int64 \(convert with "
            r"block_table.astype\(numpy.int32\)\)", _fa, c, repeat,
            block_table=c.page_table.astype(np.int64))
    _expect(rf"{FA}: page_table: expected numpy.int32, got numpy.int64", _fa, c, repeat,
            block_table=None, page_table=c.page_table.astype(np.int64))
    _expect(rf"{FA}: cache_seqlens: expected numpy.int32, got numpy.int64 \(convert with "
            r"cache_seqlens.astype\(numpy.int32\)\)", _fa, c, repeat,
            cache_seqlens=c.seq_lens.astype(np.int64))


def test_flash_attn_q_dtype_and_shapes(fa_case):
    c = fa_case
    _expect(rf"{FA}: q: expected ml_dtypes.bfloat16 or numpy.float16 or "
            r"ml_dtypes.float8_e4m3fn, got numpy.float32",
            compat.flash_attn_with_kvcache, c.q.astype(np.float32), c.k, c.v,
            cache_seqlens=c.seq_lens, block_table=c.page_table)
    _expect(rf"{FA}: q: dim 3 \(headdim\): expected k_cache's headdim 32, got 16",
            compat.flash_attn_with_kvcache, c.q[..., :16], c.k, c.v,
            cache_seqlens=c.seq_lens, block_table=c.page_table)
    _expect(rf"{FA}: v_cache: expected k_cache's shape", compat.flash_attn_with_kvcache, c.q,
            c.k, c.v[:, :4], cache_seqlens=c.seq_lens, block_table=c.page_table)
    _expect(rf"{FA}: block_table: expected 2 rows \(q's batch\), got 1", _fa, c, True,
            block_table=c.page_table[:1])


def test_flash_attn_names_an_hnd_cache(rng):
    c = PagedCase(rng, seq_lens=[20, 9], hq=4, hkv=2, d=32, page=3, layout="HND")
    msg = _expect(rf"{FA}: q: dim 2 \(nheads\): expected a multiple of k_cache's nheads_k",
                  compat.flash_attn_with_kvcache, c.q, c.k, c.v, cache_seqlens=c.seq_lens,
                  block_table=c.page_table)
    assert "HND" in msg and "transpose(1, 2)" in msg


def test_flash_attn_data_errors_name_the_callers_argument(fa_case):
    c = fa_case
    lens = c.seq_lens.copy()
    lens[1] = c.page_table.shape[1] * 8 + 1
    for repeat in (False, True):
        _expect(rf"{FA}: cache_seqlens\[1\]: expected <= max_pages \* page_size", _fa, c,
                repeat, cache_seqlens=lens)
    table = c.page_table.copy()
    table[0, 0] = 1 << 20
    _expect(rf"{FA}: block_table\[0\]\[0\]: expected a page id", _fa, c, True,
            block_table=table)


# --- flash_mla_with_kvcache ---------------------------------------------------------------------

@pytest.fixture
def mla_case(rng):
    return _sparse_case(rng, 2, 1, 4, 64, 16, num_blocks=6)


def _mla(q, kv, indices, repeat=False, **kw):
    meta, _ = compat.get_mla_metadata()
    if repeat:
        compat.flash_mla_with_kvcache(q, kv, None, None, 512, meta, is_fp8_kvcache=True,
                                      indices=indices)
    args = dict(is_fp8_kvcache=True, indices=indices)
    args.update(kw)
    return compat.flash_mla_with_kvcache(q, kv, None, None, 512, meta, **args)


@pytest.mark.parametrize("repeat", [False, True])
def test_flash_mla_int64_indices_and_lengths(mla_case, repeat):
    q, kv, indices = mla_case
    _expect(rf"{MLA}: indices: expected numpy.int32, got numpy.int64 \(convert with "
            r"indices.astype\(numpy.int32\)\)", _mla, q, kv, indices.astype(np.int64), repeat)
    _expect(rf"{MLA}: topk_length: expected numpy.int32, got numpy.int64", _mla, q, kv,
            indices, repeat, topk_length=np.array([64, 3], np.int64))


def test_flash_mla_bf16_cache_to_sparse_names_the_packing(rng, mla_case):
    q, kv, indices = mla_case
    bf16 = rng.standard_normal((6, 16, 1, 576)).astype(ref.BF16)
    msg = _expect(rf"{MLA}: k_cache: expected numpy.uint8 or ml_dtypes.float8_e4m3fn "
                  r"\[num_blocks, page_block_size, 1, 656\], got ml_dtypes.bfloat16 "
                  r"\[6, 16, 1, 576\]", _mla, q, bf16, indices)
    assert "656-byte" in msg and "deca.pack_mla_fp8" in msg
    _expect(rf"{MLA}: k_cache: expected \[num_blocks, page_block_size, 1, 656\], got "
            r"\[6, 16, 1, 576\]", _mla, q, kv[..., :576], indices)


def test_flash_mla_out_of_range_index_names_the_argument(mla_case):
    q, kv, indices = mla_case
    bad = indices.copy()
    bad[1, 0, 5] = 6 * 16
    for repeat in (False, True):
        _expect(rf"{MLA}: indices\[1\]\[0\]\[5\]: expected -1 \(skip\) or a token id", _mla, q,
                kv, bad, repeat)


def test_flash_mla_q_and_sink(mla_case):
    q, kv, indices = mla_case
    _expect(rf"{MLA}: q: expected ml_dtypes.bfloat16, got numpy.float32", _mla,
            q.astype(np.float32), kv, indices)
    _expect(rf"{MLA}: attn_sink: expected \[h_q\] = \[4\], got \[3\]", _mla, q, kv, indices,
            True, attn_sink=np.zeros(3, np.float32))
