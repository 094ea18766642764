"""deca.precompile_gqa_decode: compiles a GqaPlan's kernel into the disk cache without a GPU."""

import os
import subprocess
import sys

import pytest

import deca


def test_precompile_fills_the_cache_dir(tmp_path):
    # A fresh process: the kernel cache's directory is fixed at its first use in a process.
    code = ("import deca; print(deca.precompile_gqa_decode(64, 8, 128, 64, kv_dtype='fp8_e4m3', "
            "max_batch=128, max_seq_len=4096, checked=False, compute_capability=90))")
    env = dict(os.environ, DECA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip()
    # sm_90a takes the Hopper fp8 kernel ("_wgmma", 8 rows, "_st2": two stages for a grid of 1024
    # CTAs).
    assert name == "gqa_sm90_d128_g8_r8_p64_qbf16_kvfp8_e4m3_obf16_wgmma_st2", name
    entries = [p.name for p in tmp_path.iterdir()]
    assert [e for e in entries if e.startswith(name + "-") and e.endswith(".cubin")], entries


def test_precompile_errors():
    with pytest.raises(deca.Error, match=r"precompile_gqa_decode: compute_capability: .*got 75"):
        deca.precompile_gqa_decode(8, 2, 128, 16, max_seq_len=64, compute_capability=75)
    with pytest.raises(deca.Error, match=r"precompile_gqa_decode: config.device: .*got cpu"):
        deca.precompile_gqa_decode(8, 2, 128, 16, max_seq_len=64)
    with pytest.raises(deca.Error, match=r"precompile_gqa_decode: config.num_q_heads"):
        deca.precompile_gqa_decode(6, 4, 128, 16, max_seq_len=64, compute_capability=90)
    with pytest.raises(TypeError):
        deca.precompile_gqa_decode(8, 2, 128, 16, compute_capability=90, kv_type="fp8_e4m3")
