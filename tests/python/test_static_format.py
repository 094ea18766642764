"""Exact strings of the names and messages the library formats with numbers in them.

Issue 6: with libstdc++ linked statically into the module (some default compilers, manylinux-style
wheels), iostream formatting dropped digits silently under g++ 12 and crashed under g++ 13. The
library formats numbers with std::to_chars / std::to_string instead; these strings pin that down.
tools/check_static_libstdcxx.sh runs this file against a module linked with -static-libstdc++
-static-libgcc (DECA_STATIC_MODULE_DIR names it); the main suite runs it against the usual one.
"""

import os

import ml_dtypes
import numpy as np
import pytest

import deca

BF16 = ml_dtypes.bfloat16


def test_the_module_under_test_is_the_one_asked_for():
    where = os.environ.get("DECA_STATIC_MODULE_DIR")
    if where is None:
        pytest.skip("DECA_STATIC_MODULE_DIR unset: the installed module is the one under test")
    assert os.path.realpath(deca._C.__file__).startswith(os.path.realpath(where)), deca._C.__file__


def test_kernel_name():
    # Built from integers (head_dim, group, rows, page size): every digit must be there.
    name = deca.precompile_gqa_decode(64, 8, 128, 32, kv_dtype="fp8_e4m3", max_batch=128,
                                      max_seq_len=4096, checked=False, compute_capability=90)
    # sm_90a: the Hopper fp8 kernel, 8 rows, two stages for a grid of 1024 CTAs (128 x 8 kv heads).
    assert name == "gqa_sm90_d128_g8_r8_p32_qbf16_kvfp8_e4m3_obf16_wgmma_st2"


def test_tensor_repr():
    t = deca.as_tensor(np.zeros((2, 3, 1234567), np.float32))
    assert repr(t) == "deca.Tensor([2, 3, 1234567] fp32 on cpu)"


def test_config_messages():
    with pytest.raises(deca.Error) as e:
        deca.GqaPlan(8, 2, 100, 16, max_seq_len=64)
    assert str(e.value) == ("plan_gqa_decode: config.head_dim: expected a multiple of 16 in "
                            "16..256, got 100")
    with pytest.raises(deca.Error) as e:
        deca.GqaPlan(8, 2, 128, 16, max_seq_len=64, softcap=-0.5)
    assert str(e.value) == ("plan_gqa_decode: config.softcap: expected a finite value >= 0 "
                            "(0 = no soft-cap), got -0.5")


class Case:
    def __init__(self):
        self.q = np.zeros((2, 1, 4, 32), BF16)
        self.k = np.zeros((3, 8, 2, 32), BF16)
        self.v = np.zeros((3, 8, 2, 32), BF16)
        self.page_table = np.array([[0, 1], [2, 0]], np.int32)
        self.seq_lens = np.array([9, 5], np.int32)

    def message(self, **kw):
        args = dict(q=self.q, k=self.k, v=self.v, page_table=self.page_table,
                    seq_lens=self.seq_lens)
        args.update({k: kw.pop(k) for k in list(kw) if k in args})
        with pytest.raises(deca.Error) as e:
            deca.gqa_decode(args["q"], args["k"], args["v"], args["page_table"],
                            args["seq_lens"], **kw)
        return str(e.value)


def test_argument_messages():
    c = Case()
    assert c.message(k_scale=float("nan")) == "gqa_decode: k_scale: expected a finite value, got nan"
    assert c.message(softmax_scale=-0.25) == ("gqa_decode: softmax_scale: expected a finite value "
                                             ">= 0 (0 = 1 / sqrt(head_dim)), got -0.25")
    assert c.message(seq_lens=np.array([9, 70000], np.int32)) == (
        "gqa_decode: seq_lens[1]: expected <= max_pages * page_size = 2 * 8 = 16 (the pages "
        "page_table provides), got 70000")
    one = np.zeros((1, 1, 4, 32), BF16)
    overlapping = np.lib.stride_tricks.as_strided(one, shape=(2, 1, 4, 32),
                                                  strides=(0,) + one.strides[1:])
    assert c.message(out=overlapping) == (
        "gqa_decode: out: expected strides that map every index to its own element (an output "
        "must not overlap), got shape [2, 1, 4, 32], stride 0 of dim 0")


def test_planned_run_message():
    c = Case()
    plan = deca.GqaPlan(4, 2, 32, 8, max_batch=4, max_seq_len=64)
    with pytest.raises(deca.Error) as e:
        plan.run(c.q, c.k, c.v, c.page_table, c.seq_lens, np.zeros_like(c.q),
                 lse=np.zeros((2, 1, 4), np.float32))
    assert str(e.value) == ("gqa_decode: lse: expected absent (plan.config.lse is false), got "
                            "[2, 1, 4] fp32 on cpu")
