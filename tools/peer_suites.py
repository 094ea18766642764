#!/usr/bin/env python3
"""Runs peers' own test suites against deca.compat: their data, references and tolerances, with
deca behind the peers' module names.

    python tools/peer_suites.py --flashmla DIR --fa3 DIR [--suite NAME ...] [--model1]
                                [--wheels DIR] [-- PYTEST_ARGS ...]

On a GPU machine with torch and deca installed (no network needed). The peers' files are not part
of deca: copy them beside it (e.g. into .peers/, which git ignores) and pass their folders:
* --flashmla: FlashMLA's tests/ folder (9241ae3, its last Hopper version): suites flashmla-sparse
  (test_flash_mla_sparse_decoding.py) and flashmla-dense (test_flash_mla_dense_decoding.py),
  with lib.py, ref.py, quant.py and kernelkit/ beside them;
* --fa3: FlashAttention's hopper/ folder: suite fa3-kvcache (test_flash_attn.py's
  test_flash_attn_kvcache on its decode-shaped subset), with test_util.py and padding.py.
tools/peer_shims/ provides `flash_mla` and `flash_attn_interface` (deca.compat's functions under
the peers' names), a pytest plugin that turns each peer file into pytest cases and selects what
deca is meant to pass (tools/peer_shims/deca_peer_plugin.py says which and why), and stand-ins
for `rich` and `triton` where those are not installed (imported, never used, by FlashMLA's
scripts) and for `flash_attn.layers.rotary.apply_rotary_emb` (the rotary reference
FlashAttention's kv-cache test imports from FlashAttention-2's package). FlashAttention's test
needs einops: where it is not installed, --wheels names a folder holding its wheel (pure Python,
imported from the wheel file).

Every suite runs in its own pytest process with DECA_CHECKED=0 (the compat calls never read a
checked plan's record, and the checked kernels read a length they refuse as 0). Prints each
suite's pytest summary and exits non-zero if any suite failed. Examples:
    python tools/peer_suites.py --flashmla .peers/FlashMLA/tests --fa3 .peers/flash-attention/hopper
    python tools/peer_suites.py --flashmla .peers/FlashMLA/tests --suite flashmla-sparse -- -x -k b4
"""

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIMS = os.path.join(HERE, "peer_shims")

# suite -> (peer option, test file, pytest node suffix, extra environment)
SUITES = {
    "flashmla-sparse": ("flashmla", "test_flash_mla_sparse_decoding.py", "", {}),
    "flashmla-dense": ("flashmla", "test_flash_mla_dense_decoding.py", "", {}),
    "fa3-kvcache": ("fa3", "test_flash_attn.py", "::test_flash_attn_kvcache",
                    {"FLASH_ATTENTION_DISABLE_LOCAL": "TRUE"}),
}


def stubs_dir(tmp):
    """A folder with a stand-in for each of rich / triton / flash_attn that is not installed
    (never one that is: the stand-ins must not shadow a real package)."""
    folder = os.path.join(tmp, "stubs")
    os.makedirs(folder, exist_ok=True)
    for name in ("rich", "triton", "flash_attn"):
        if importlib.util.find_spec(name) is None:
            os.symlink(os.path.join(SHIMS, "stubs", name), os.path.join(folder, name))
    return folder


def einops_path(wheels):
    if importlib.util.find_spec("einops") is not None:
        return []
    found = sorted(glob.glob(os.path.join(wheels or "", "einops-*.whl")))
    if not found:
        sys.exit("peer_suites: FlashAttention's test needs einops: install it, or pass --wheels "
                 "with a folder holding einops-*.whl")
    return [found[-1]]


def run_suite(name, folder, args, tmp):
    _, test_file, node, extra_env = SUITES[name]
    path = os.path.join(folder, test_file)
    if not os.path.exists(path):
        sys.exit(f"peer_suites: {name}: expected {path}")
    env = dict(os.environ)
    paths = [SHIMS, stubs_dir(tmp), folder]
    if name == "fa3-kvcache":
        paths += einops_path(args.wheels)
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra_env)
    env["DECA_PEER_SUITE"] = name
    env["DECA_PEER_MODEL1"] = "1" if args.model1 else "0"
    env["DECA_PEER_DEVICE"] = args.device
    env["DECA_CHECKED"] = "0"
    ini = os.path.join(tmp, "pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")  # the peers' folders hold no pytest config; deca's is not theirs
    cmd = [sys.executable, "-m", "pytest", path + node, "-p", "deca_peer_plugin",
           "-p", "no:cacheprovider", "-c", ini, "--rootdir", folder, "-q", "-rs",
           "--disable-warnings"] + args.pytest_args
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    return subprocess.call(cmd, cwd=folder, env=env)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashmla", help="FlashMLA's tests/ folder (9241ae3)")
    ap.add_argument("--fa3", help="FlashAttention's hopper/ folder")
    ap.add_argument("--suite", action="append", choices=sorted(SUITES),
                    help="suites to run (default: every suite whose folder is given)")
    ap.add_argument("--model1", action="store_true",
                    help="also run FlashMLA's MODEL1 cases (d_qk 512, a second cache)")
    ap.add_argument("--wheels", help="a folder holding einops-*.whl, where einops is missing")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run of the FlashMLA suites on deca's CPU backend, to check "
                         "the runner where no GPU is (slow: pick small cases with -k)")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = ap.parse_args()
    folders = {"flashmla": args.flashmla, "fa3": args.fa3}
    suites = args.suite or [s for s, (opt, *_) in SUITES.items() if folders[opt]]
    if not suites:
        ap.error("give --flashmla and / or --fa3")
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in suites:
            folder = folders[SUITES[name][0]]
            if not folder:
                ap.error(f"--suite {name} needs --{SUITES[name][0]}")
            if args.device == "cpu" and name == "fa3-kvcache":
                ap.error("--device cpu: FlashAttention's test makes its tensors on \"cuda\"")
            rc = run_suite(name, os.path.abspath(folder), args, tmp)
            # 5: pytest collected nothing (every case deselected): not a failure of deca's.
            if rc not in (0, 5):
                failed.append(f"{name} (pytest exit {rc})")
    print("peer_suites: " + ("failed: " + ", ".join(failed) if failed else "every suite passed"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
