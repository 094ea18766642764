"""FlashMLA's own MODEL1 code against deca on the CPU: its cache quantizer against
deca.pack_mla_fp8(format="model1") byte for byte, and its decode tests against deca.compat on the
CPU backend: its case generator (584-byte caches packed by its own quantizer, a second cache, ragged topk_length /
extra_topk_length, NaN in every token no counted index selects), its reference and its
tolerances, run by tools/peer_suites.py (--device cpu --model1) on a small selection of its
cases. FlashMLA's tests are not part of deca: this skips where they are not beside the checkout
(.peers/FlashMLA-9241ae3/tests, or DECA_FLASHMLA_TESTS) or torch is not installed."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import deca

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("DECA_FLASHMLA_TESTS",
                           ROOT / ".peers" / "FlashMLA-9241ae3" / "tests"))
# FlashMLA's MODEL1 cases of batch 4, 64 heads, one query token, topk 64 of 512 tokens at page
# 2: with and without topk_length, and each of its second caches (pages 2, 61, 64, 69, 576,
# extra_topk 64 to 2048) with and without extra_topk_length.
SELECT = "dqk512-b4-h64-sq1-sk512-topk64-page2]"


ABSENT = pytest.mark.skipif(not (PEER / "test_flash_mla_sparse_decoding.py").exists(),
                            reason=f"FlashMLA's tests are not at {PEER} (not part of deca)")


@ABSENT
def test_pack_writes_flashmlas_bytes():
    """Rows (448 e4m3 + 64 bf16) and the 7 scale bytes of every token as FlashMLA's
    quantize_k_cache writes them, tiles of zeros and of tiny values (its 2^-13 scale floor)
    included; the pad bytes and the page padding, which it leaves unwritten, are not compared.
    Both dequantizers then agree exactly."""
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("flashmla_tests_quant", PEER / "quant.py")
    quant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quant)
    layout = quant.FP8KVCacheLayout.MODEL1_FP8Sparse
    rng = np.random.default_rng(33)
    for blocks, page in [(3, 1), (2, 2), (2, 3), (2, 64), (1, 61)]:
        x = rng.standard_normal((blocks, page, 1, 512)).astype(np.float32)
        x[..., :448] *= np.repeat(2.0 ** rng.integers(-24, 6, (blocks, page, 1, 7)), 64, -1)
        x[0, 0, 0, 64:128] = 0.0
        bits = torch.from_numpy(x).to(torch.bfloat16)
        theirs = quant.quantize_k_cache(bits, layout).view(torch.uint8)
        ours = deca.pack_mla_fp8(bits.view(torch.int16).numpy().view(ml_dtypes.bfloat16),
                                 format="model1")
        padded = deca.mla_model1_page_bytes(page)
        flat_theirs = theirs.as_strided((blocks, page * 584), (padded, 1)).numpy()
        flat_ours = np.lib.stride_tricks.as_strided(ours, (blocks, page * 584), (padded, 1))
        rows = slice(0, page * 576)
        np.testing.assert_array_equal(flat_ours[:, rows], flat_theirs[:, rows])
        scales_ours = flat_ours[:, page * 576:].reshape(blocks, page, 8)[..., :7]
        scales_theirs = flat_theirs[:, page * 576:].reshape(blocks, page, 8)[..., :7]
        np.testing.assert_array_equal(scales_ours, scales_theirs)
        back = deca.unpack_mla_fp8(ours, out_dtype="bf16", format="model1")
        want = quant.dequantize_k_cache(theirs.view(torch.float8_e4m3fn), layout)
        np.testing.assert_array_equal(back.astype(np.float32), want.float().numpy())


@ABSENT
def test_flashmla_model1_cases_on_the_cpu():
    pytest.importorskip("torch")
    cmd = [sys.executable, str(ROOT / "tools" / "peer_suites.py"), "--flashmla", str(PEER),
           "--suite", "flashmla-sparse", "--model1", "--device", "cpu", "--", "-k", SELECT]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and " failed" not in run.stdout, tail
