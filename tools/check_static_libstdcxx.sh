#!/usr/bin/env bash
# Builds the Python module with libstdc++ and libgcc linked into it (-static-libstdc++
# -static-libgcc, as some default compilers and manylinux-style wheel builds do) and runs
# tests/python/test_static_format.py against it: kernel names and error messages must keep every
# digit. Under g++ 12 such a module's iostream formatting silently dropped numbers (issue 6).
# Called by tools/test.sh (after install_deps.sh set DECA_PYTHON); standalone:
#   bash tools/check_static_libstdcxx.sh        (DECA_JOBS=N, DECA_STATIC_BUILD_DIR=dir)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${DECA_PYTHON:-}" ] || DECA_DEPS=all source tools/install_deps.sh

build=${DECA_STATIC_BUILD_DIR:-build-static-runtime}
jobs=${DECA_JOBS:-$(nproc)}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDECA_BUILD_TESTS=OFF -DDECA_BUILD_BENCH=OFF \
  -DDECA_BUILD_PYTHON=ON -DDECA_PYTHON_STATIC_RUNTIME=ON -DPython_EXECUTABLE="$DECA_PYTHON" > /dev/null
cmake --build "$build" --parallel "$jobs" --target _C

module=$(ls "$build"/python/deca/_C*.so)
# The check means something only if libstdc++ really is inside: no libstdc++.so needed.
if readelf -d "$module" | grep -q 'NEEDED.*libstdc++'; then
  echo "check_static_libstdcxx: $module still needs libstdc++.so: the static link did not happen" >&2
  exit 1
fi
echo "check_static_libstdcxx: $module has libstdc++ linked in (no libstdc++.so in its NEEDED list)"

PYTHONPATH="$PWD/$build/python" DECA_STATIC_MODULE_DIR="$PWD/$build/python" \
  DECA_CACHE_DIR="$PWD/$build/kernel_cache" \
  "$DECA_PYTHON" -m pytest -q -p no:cacheprovider tests/python/test_static_format.py
