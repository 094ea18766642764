#!/usr/bin/env python3
"""Compare the machine code of the kernels in two deca kernel-cache directories.

A refactoring that must not change the kept kernels (a file split, a variant deleted beside them)
is checked by compiling the same plans at both commits into two cache directories and comparing
their SASS kernel by kernel:

    DECA_CACHE_DIR=/tmp/before build-before/bench/deca-bench --precompile all --arch 90
    DECA_CACHE_DIR=/tmp/after  build/bench/deca-bench --precompile all --arch 90
    python3 tools/sass_diff.py /tmp/before /tmp/after [--map OLD=NEW ...]

Entries are matched by kernel name (the cache file's name without its hash); --map pairs a kernel
whose name changed. The SASS is taken with cuobjdump (CUDA toolkit, or PATH), with addresses,
encodings and the embedded source path's line info dropped, so only instructions and operands
count. Prints one line per kernel (same / DIFFERENT / only before / only after) and exits 1 when a
matched pair differs.
"""
import argparse
import difflib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

HEADER = 40  # magic (8), version (4), key size (4), log size (8), cubin size (8), checksum (8)


def read_entry(path):
    data = open(path, "rb").read()
    if len(data) < HEADER or data[:7] != b"DECACUB":
        raise ValueError(f"{path}: not a deca kernel-cache entry")
    key_size, log_size, cubin_size = struct.unpack_from("<IQQ", data, 12)
    start = HEADER + key_size + log_size
    cubin = data[start:start + cubin_size]
    if len(cubin) != cubin_size:
        raise ValueError(f"{path}: truncated entry")
    return cubin


def kernels_in(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".cubin"):
            continue
        kernel = name[: -len(".cubin")].rsplit("-", 1)[0]
        out[kernel] = os.path.join(directory, name)
    return out


def find_tool():
    for candidate in (shutil.which("cuobjdump"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("sass_diff: cuobjdump not found (CUDA toolkit bin/, or PATH; PyPI's "
             "nvidia-cuda-cuobjdump wheel carries one)")


ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
ENCODING = re.compile(r"/\* 0x[0-9a-f]+ \*/")


def sass(tool, cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-sass", f.name], check=True, capture_output=True, text=True).stdout
    lines = []
    for line in text.splitlines():
        line = ENCODING.sub("", ADDRESS.sub("", line)).strip()
        if not line or line.startswith(("Fatbin", "code for", "arch =", "host =", "compile_size",
                                         "identifier", ".section", "//--")):
            continue
        lines.append(line)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--map", action="append", default=[], metavar="OLD=NEW",
                    help="pair a kernel of BEFORE with a differently named one of AFTER")
    ap.add_argument("--show", type=int, default=20, help="diff lines printed per differing kernel")
    args = ap.parse_args()
    tool = find_tool()
    before, after = kernels_in(args.before), kernels_in(args.after)
    renames = dict(m.split("=", 1) for m in args.map)
    same = differ = 0
    seen_after = set()
    for old in sorted(before):
        new = renames.get(old, old)
        if new not in after:
            print(f"only before  {old}")
            continue
        seen_after.add(new)
        a, b = sass(tool, read_entry(before[old])), sass(tool, read_entry(after[new]))
        label = old if old == new else f"{old} -> {new}"
        if a == b:
            same += 1
            print(f"same         {label} ({len(a)} lines)")
        else:
            differ += 1
            print(f"DIFFERENT    {label}")
            for line in list(difflib.unified_diff(a, b, lineterm="", n=1))[: args.show]:
                print("    " + line)
    for new in sorted(set(after) - seen_after):
        print(f"only after   {new}")
    print(f"{same} same, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
