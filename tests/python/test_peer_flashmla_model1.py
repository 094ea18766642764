"""FlashMLA's own MODEL1 decode tests against deca.compat on the CPU backend: its case
generator (584-byte caches packed by its own quantizer, a second cache, ragged topk_length /
extra_topk_length, NaN in every token no counted index selects), its reference and its
tolerances, run by tools/peer_suites.py (--device cpu --model1) on a small selection of its
cases. FlashMLA's tests are not part of deca: this skips where they are not beside the checkout
(.peers/FlashMLA-9241ae3/tests, or DECA_FLASHMLA_TESTS) or torch is not installed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("DECA_FLASHMLA_TESTS",
                           ROOT / ".peers" / "FlashMLA-9241ae3" / "tests"))
# FlashMLA's MODEL1 cases of batch 4, 64 heads, one query token, topk 64 of 512 tokens at page
# 2: with and without topk_length, and each of its second caches (pages 2, 61, 64, 69, 576,
# extra_topk 64 to 2048) with and without extra_topk_length.
SELECT = "dqk512-b4-h64-sq1-sk512-topk64-page2]"


@pytest.mark.skipif(not (PEER / "test_flash_mla_sparse_decoding.py").exists(),
                    reason=f"FlashMLA's tests are not at {PEER} (not part of deca)")
def test_flashmla_model1_cases_on_the_cpu():
    pytest.importorskip("torch")
    cmd = [sys.executable, str(ROOT / "tools" / "peer_suites.py"), "--flashmla", str(PEER),
           "--suite", "flashmla-sparse", "--model1", "--device", "cpu", "--", "-k", SELECT]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and " failed" not in run.stdout, tail
