#!/usr/bin/env bash
# Builds deca and runs every test: the CTest suites (GoogleTest per source folder, the GPU suite
# skipping itself without a GPU, the installed-package consumer build), then the Python binding
# (pip install .) and its pytest suite, then tools/check_static_libstdcxx.sh (the module with
# libstdc++ linked statically). Exits non-zero when anything fails; the runners' summary
# lines come last.
#
#   bash tools/test.sh            (DECA_JOBS=N to choose the build parallelism)
set -euo pipefail
cd "$(dirname "$0")/.."
DECA_DEPS=all source tools/install_deps.sh

jobs=${DECA_JOBS:-$(nproc)}
cmake --preset default
cmake --build --preset default --parallel "$jobs"

status=0
ctest --preset default || status=1

"$DECA_PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation . || status=1
"$DECA_PYTHON" -m pytest tests/python -q || status=1
# The module again with libstdc++ linked in (issue 6): its names and messages keep their digits.
bash tools/check_static_libstdcxx.sh || status=1
exit $status
