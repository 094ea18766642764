"""pytest plugin for tools/peer_suites.py: turns the peers' own test files into pytest cases
against deca.compat, without changing a line of them.

DECA_PEER_SUITE names the suite:
* flashmla-sparse: FlashMLA's tests/test_flash_mla_sparse_decoding.py, a script whose
  test_flash_mla(p) runs one case of its gen_testcase() and returns whether FlashMLA's own
  reference and tolerances accept the output and LSE. Each generated case becomes a pytest case
  (seed = its index in gen_testcase(), as the script's counter gives when every case runs;
  num_runs 0: timing is deca-bench's job, and FlashMLA's timer looks for its own kernel names).
  MODEL1 cases (d_qk 512, extra cache) are skipped unless DECA_PEER_MODEL1=1.
* flashmla-dense: FlashMLA's tests/test_flash_mla_dense_decoding.py; its main() builds the case
  list, which is recorded (test_flash_mla swapped for a recorder while main() runs) and run case
  by case. Cases deca cannot take (kv heads > 1: MLA has one latent head) are skipped with the
  reason, and all of them while deca's dense MLA decode has no CUDA kernel.
* fa3-kvcache: FlashAttention-3's hopper/test_flash_attn.py::test_flash_attn_kvcache on the
  decode-shaped subset: K/V appends with and without rotary (deca's fused decode step) where
  seqlen_new == seqlen_q and the queries are causal (or one), no local window or chunked
  attention (FLASH_ATTENTION_DISABLE_LOCAL, set by the runner), no leftpad, no batch index, no
  varlen q, seqlen_q <= 64; the other cases are deselected, the count per reason printed at the
  end. The test's rotary reference (flash_attn.layers.rotary.apply_rotary_emb, FlashAttention-2's
  Triton kernel) is deca's stand-in in stubs/flash_attn where the package is missing.
"""

import dataclasses
import os

import pytest

SUITE = os.environ.get("DECA_PEER_SUITE", "")
DEVICE = os.environ.get("DECA_PEER_DEVICE", "cuda")
MODEL1 = os.environ.get("DECA_PEER_MODEL1", "0") == "1"


def pytest_configure(config):
    if SUITE.startswith("flashmla"):
        # What the scripts' main() sets before their cases: the data generators rely on it.
        import torch
        torch.set_default_dtype(torch.bfloat16)
        if DEVICE == "cpu":
            _cuda_as_cpu(torch)
        else:
            torch.set_default_device("cuda:0")
            torch.cuda.set_device(0)
        torch.set_float32_matmul_precision("high")


def _cuda_as_cpu(torch):
    """A dry run of the FlashMLA scripts on deca's CPU backend (slow: small cases only): the
    scripts' CUDA calls become no-ops and .cuda() leaves a tensor where it is."""
    torch.set_default_device("cpu")
    for name in ("synchronize", "empty_cache", "set_device", "manual_seed_all", "manual_seed"):
        setattr(torch.cuda, name, lambda *a, **k: None)
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.Tensor.cuda = lambda self, *a, **k: self


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ != "test_flash_mla":
        return
    if SUITE == "flashmla-sparse":
        metafunc.parametrize("p", _sparse_cases(metafunc.module))
    elif SUITE == "flashmla-dense":
        metafunc.parametrize("t", _dense_cases(metafunc.module))


def _sparse_cases(module):
    params = []
    for i, raw in enumerate(module.gen_testcase()):
        raw = dataclasses.replace(raw, num_runs=0, seed=i, check_correctness=True)
        marks = []
        if raw.d_qk != 576 and not MODEL1:
            marks.append(pytest.mark.skip(reason="MODEL1 (d_qk 512, 584-byte tokens, extra "
                                                 "cache): selected by peer_suites.py --model1"))
        ident = (f"{i:03d}-dqk{raw.d_qk}-b{raw.b}-h{raw.h_q}-sq{raw.s_q}-sk{raw.s_kv}-"
                 f"topk{raw.topk}-page{raw.block_size}")
        params.append(pytest.param(raw.to_test_param(), id=ident, marks=marks))
    return params


def _dense_on_cuda():
    import deca
    try:
        deca.MlaPlan(16, sparse=False, page_size=64, max_seq_len=64,
                     device="cpu" if DEVICE == "cpu" else "cuda:0")
        return True
    except deca.Error:
        return False


def _dense_cases(module):
    import torch
    recorded = []
    run = module.test_flash_mla
    module.test_flash_mla = recorded.append
    try:
        module.main(torch.bfloat16)
    finally:
        module.test_flash_mla = run
        if DEVICE == "cpu":
            torch.set_default_device("cpu")  # main() set cuda:0
    on_cuda = _dense_on_cuda()  # (on the device the run uses)
    params = []
    for i, t in enumerate(recorded):
        t = dataclasses.replace(t, test_performance=False)
        marks = []
        if not on_cuda:
            marks.append(pytest.mark.skip(reason="dense MLA decode has no CUDA kernel in this "
                                                 "deca build"))
        elif t.h_kv != 1:
            marks.append(pytest.mark.skip(reason=f"h_kv {t.h_kv}: MLA has one latent head "
                                                 f"(deca.compat takes num_heads_k 1)"))
        ident = (f"{i:04d}-b{t.b}-sq{t.s_q}-sk{t.s_k}-h{t.h_q}-hkv{t.h_kv}-"
                 f"{'varlen' if t.is_varlen else 'fixed'}-{'causal' if t.is_causal else 'full'}")
        params.append(pytest.param(t, id=ident, marks=marks))
    return params


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """FlashMLA's sparse test returns its verdict instead of asserting it."""
    if SUITE != "flashmla-sparse" or pyfuncitem.function.__name__ != "test_flash_mla":
        return None
    result = pyfuncitem.obj(p=pyfuncitem.funcargs["p"])
    assert result.is_correct, "FlashMLA's check_is_allclose refused out or lse (printed above)"
    return True


# The subset of test_flash_attn_kvcache deca runs: parameter -> the values it keeps, and why the
# others go.
_FA3_KEEP = {
    "has_leftpad": ((False,), "cache_leftpad: deca's requests start at key 0"),
    "has_batch_idx": ((False,), "cache_batch_idx: deca reads request b's pages from row b"),
    "varlen_q": ((False,), "varlen q / k_new (cu_seqlens_q, cu_seqlens_k_new): deca's decode "
                           "takes [batch, seqlen_q] queries"),
}


def _fa3_dropped(params):
    """Why deca does not run this case of test_flash_attn_kvcache (None: it runs)."""
    for name, (values, reason) in _FA3_KEEP.items():
        if name in params and params[name] not in values:
            return reason
    if params.get("seqlen_q", 1) > 64:
        return "seqlen_q > 64: a prefill, not a decode step"
    if params.get("local", False):
        return "local windows with look-ahead (FLASH_ATTENTION_DISABLE_LOCAL)"
    new_kv = params.get("new_kv", False)
    if new_kv and not params.get("seqlen_new_eq_seqlen_q", True):
        return "seqlen_new != seqlen_q: deca's fused step appends one key per query"
    if new_kv and not params.get("causal", True) and params.get("seqlen_q", 1) > 1 and \
            params.get("rotary_fraction", 0.0) > 0:
        return ("non-causal seqlen_q > 1 with rotary: FlashAttention rotates every query at one "
                "position, deca's fused step each at its own")
    if params.get("rotary_fraction", 0.0) == 0.0 and params.get("rotary_interleaved", False):
        return "rotary_interleaved without rotary: the same case as rotary_interleaved False"
    if not new_kv and not params.get("seqlen_new_eq_seqlen_q", True):
        return "seqlen_new without k / v: the same case as seqlen_new_eq_seqlen_q True"
    return None


def pytest_collection_modifyitems(config, items):
    if SUITE != "fa3-kvcache":
        return
    kept, dropped = [], []
    reasons = config._deca_dropped = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        reason = ("not test_flash_attn_kvcache" if item.originalname != "test_flash_attn_kvcache"
                  else _fa3_dropped(params))
        if reason is not None:
            dropped.append(item)
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for reason, count in sorted(getattr(config, "_deca_dropped", {}).items()):
        terminalreporter.write_line(f"deselected {count}: {reason}")
