#!/usr/bin/env bash
# Builds deca and runs every test, then prints one summary: each stage, its time, passed / failed
# / skipped counts and how many tests were skipped for want of a GPU; the last line is
# `N passed, N failed, N skipped`. Stages: configure + build, the CTest suites (GoogleTest per
# source folder, the GPU suite skipping itself without a GPU, the installed-package builds), the
# host suites again under AddressSanitizer + UBSan, pip install of the Python binding, its pytest
# suite, and tools/check_static_libstdcxx.sh (the module with libstdc++ linked statically).
# The runners' full output goes to build/test-logs/ (ctest.log, ctest-asan.log, pytest.log,
# static-libstdcxx.log, with JUnit XML beside them); builds print as they go. Exits non-zero when
# anything failed.
#
#   bash tools/test.sh            (DECA_JOBS=N: build parallelism; DECA_SKIP_ASAN=1: no ASan stage)
set -uo pipefail
cd "$(dirname "$0")/.."

t0=$SECONDS
# install_deps.sh runs under `set -e`: a failure there ends this script with its message.
DECA_DEPS=all source tools/install_deps.sh
set +e
deps_seconds=$((SECONDS - t0))

logs=$PWD/build/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.xml
jobs=${DECA_JOBS:-$(nproc)}
stages=("install dependencies:$deps_seconds:0")
status=0

# run_stage NAME STATUS_IF_SKIPPED KIND JUNIT CMD...: runs CMD (unless STATUS_IF_SKIPPED is set),
# records "name:seconds:status[:kind:junit]" for the summary and returns CMD's status.
run_stage() {
  local name=$1 preset=$2 kind=$3 junit=$4
  shift 4
  if [ -n "$preset" ]; then
    stages+=("$name:0:$preset")
    return 1
  fi
  echo "==> $name"
  local start=$SECONDS rc=0
  "$@" || rc=$?
  stages+=("$name:$((SECONDS - start)):$rc${kind:+:$kind:$junit}")
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

# ctest into a log: its "did not run" list (~870 GPU tests on a machine without one) stays out of
# the terminal; failures and its closing line are shown, the summary counts from the JUnit file.
run_ctest() {
  local preset=$1 log=$2 rc=0
  ctest --preset "$preset" --output-junit "$logs/$(basename "$log" .log).xml" > "$log" 2>&1 || rc=$?
  sed -n '/The following tests FAILED:/,/^[^\t ]/p' "$log" | grep -v '^Errors while running CTest'
  grep -E '^[0-9]+% tests passed' "$log" || tail -n 20 "$log"
  echo "    (full output: $log)"
  return "$rc"
}

build_default() {
  cmake --preset default && cmake --build --preset default --parallel "$jobs"
}
build_asan_and_test() {
  cmake --preset asan > /dev/null && cmake --build --preset asan --parallel "$jobs" &&
    run_ctest asan "$logs/ctest-asan.log"
}
pytest_suite() {
  "$DECA_PYTHON" -m pytest tests/python -q -rfE -p no:cacheprovider \
    --junitxml="$logs/pytest.xml" 2>&1 | tee "$logs/pytest.log"
}
static_check() {
  echo "    (log: $logs/static-libstdcxx.log)"
  bash tools/check_static_libstdcxx.sh > "$logs/static-libstdcxx.log" 2>&1
}

if run_stage "configure + build" "" "" "" build_default; then
  run_stage "ctest" "" ctest "$logs/ctest.xml" run_ctest default "$logs/ctest.log"
else
  run_stage "ctest" notrun "" ""
fi
# The host suites (api, cpu, plan) under AddressSanitizer + UBSan (CMakePresets.json "asan"):
# out-of-bounds reads, overflows and leaks fail CI.
run_stage "asan build + ctest" "$([ "${DECA_SKIP_ASAN:-0}" = 1 ] && echo skip)" ctest \
  "$logs/ctest-asan.xml" build_asan_and_test
if run_stage "pip install" "" "" "" \
    "$DECA_PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation .; then
  run_stage "pytest" "" pytest "$logs/pytest.xml" pytest_suite
else
  run_stage "pytest" notrun "" ""
fi
# The module again with libstdc++ linked in: its names and messages keep their digits.
run_stage "static-libstdc++ check" "" "" "" static_check

"$DECA_PYTHON" tools/test_summary.py --logs "${logs#"$PWD"/}" "${stages[@]/#/--stage=}"
exit $status
