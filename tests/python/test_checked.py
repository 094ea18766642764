"""Checked mode (issue 9) from Python: the checked= keyword on every entry point (validated,
defaulting to deca.checked_by_default(), which the test session turns on through DECA_CHECKED=1
in conftest.py), plan.check() on the CPU (a no-op: the CPU checks every index on the host), and
on a CUDA device (torch) a bad page id planted in device memory: GqaPlan.check and the one-off
gqa_decode raise the deca.Error naming the entry, the other requests stay correct."""

import numpy as np
import pytest

import deca
import numpy_reference as ref
from cases import PagedCase


def test_default_follows_the_environment(monkeypatch):
    assert deca.checked_by_default() is True  # conftest.py: DECA_CHECKED=1
    monkeypatch.setenv("DECA_CHECKED", "0")
    assert deca.checked_by_default() is False
    assert deca.GqaPlan(8, 2, 64, 16, max_seq_len=64).checked is False
    monkeypatch.setenv("DECA_CHECKED", "1")
    assert deca.GqaPlan(8, 2, 64, 16, max_seq_len=64).checked is True


def test_keyword_sets_the_plan_flag():
    assert deca.GqaPlan(8, 2, 64, 16, max_seq_len=64, checked=False).checked is False
    assert deca.GqaPlan(8, 2, 64, 16, max_seq_len=64, checked=True).checked is True
    assert deca.MlaPlan(16, sparse=True, topk=64, checked=False).checked is False
    assert deca.MlaPlan(16, sparse=True, topk=64, checked=True).checked is True


@pytest.mark.parametrize("make", [
    lambda: deca.GqaPlan(8, 2, 64, 16, max_seq_len=64, checked="yes"),
    lambda: deca.MlaPlan(16, sparse=True, topk=64, checked=1),
])
def test_keyword_must_be_a_bool(make):
    with pytest.raises(deca.Error, match=r"checked: expected True or False, got"):
        make()


def test_cpu_plans_need_no_workspace_and_check_nothing(rng):
    case = PagedCase(rng, seq_lens=[20, 7])
    plan = deca.GqaPlan(8, 2, 64, 16, max_seq_len=64, max_batch=2, checked=True)
    assert plan.workspace_bytes == 0 and plan.kernel_name == ""
    out = np.zeros(case.q.shape, case.q.dtype)
    plan.run(case.q, case.k, case.v, case.page_table, case.seq_lens, out)
    plan.check(None)  # nothing recorded on the CPU
    # The CPU refuses a bad page id before the run, checked or not (the host reads it).
    case.page_table[1, 0] = 10 ** 6
    with pytest.raises(deca.Error, match=r"gqa_decode: page_table\[1\]\[0\]"):
        deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens, checked=False)
    with pytest.raises(deca.Error, match=r"gqa_decode: checked: expected True or False"):
        deca.gqa_decode(case.q, case.k, case.v, case.page_table, case.seq_lens, checked="no")


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def _cuda(torch, a):
    if a.dtype == ref.BF16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to("cuda:0")
    return torch.from_numpy(np.ascontiguousarray(a)).to("cuda:0")


def test_gpu_bad_page_id_is_reported_after_the_run(rng):
    torch = _torch_cuda()
    case = PagedCase(rng, seq_lens=[40, 77, 33])
    want, _ = ref.gqa_decode(case.q64, case.k64, case.v64, case.page_table, case.seq_lens)
    num_pages = case.k.shape[0]
    bad = case.page_table.copy()
    bad[1, 2] = 1 << 30
    q, k, v = (_cuda(torch, a) for a in (case.q, case.k, case.v))
    pt, lens = _cuda(torch, bad), _cuda(torch, case.seq_lens)
    plan = deca.GqaPlan(8, 2, 64, 16, max_seq_len=128, max_batch=3, device="cuda:0",
                        checked=True)
    assert plan.kernel_name.endswith("_chk")
    ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device="cuda:0")
    out = torch.full(tuple(case.q.shape), float("nan"), dtype=torch.bfloat16, device="cuda:0")
    plan.run(q, k, v, pt, lens, out, workspace=ws)
    with pytest.raises(deca.Error) as e:
        plan.check(ws)
    assert str(e.value) == (f"gqa_decode: page_table[1][2]: expected a page id in [0, "
                            f"{num_pages}), got {1 << 30} (found by the checked GPU run)")
    plan.check(ws)  # cleared
    got = out.float().cpu().numpy()
    assert not np.isnan(got).any()
    for b in (0, 2):
        err = np.linalg.norm(got[b] - want[b]) / np.linalg.norm(want[b])
        assert err < 1e-2
    with pytest.raises(deca.Error, match=r"gqa_decode: page_table\[1\]\[2\]: expected a page id"):
        deca.gqa_decode(q, k, v, pt, lens, checked=True)
