#!/usr/bin/env bash
# One whole round on a GPU machine: build, GPU tests (C++ and Python), host costs, benchmarks;
# logs and JSON packed into OUTDIR/round.tgz (the device tool returns at most 8 files), with the
# short summary in OUTDIR/round.log.
#
#   tools/gpu_round.sh OUTDIR [bench presets...]      (default presets: the GQA table)
#
# Knobs (environment):
#   DECA_SKIP_TESTS=1 / DECA_SKIP_JIT=1 / DECA_SKIP_PYTHON=1 / DECA_SKIP_BENCH=1   leave a step out
#   DECA_SKIP_HOST_COST=1        the Python step without tools/py_host_cost.py
#   DECA_GTEST_FILTER=...        filter of the C++ GPU suite (the differential test runs in its own step)
#   DECA_GTEST_SHARDS=N          the suite in N parallel gtest shards (the compiles spread over the
#                                cores), then the timing tests alone (DECA_SKIP_TIMING=1: not them)
#   DECA_GTEST_TIMEOUT / DECA_PYTEST_TIMEOUT / DECA_BENCH_TIMEOUT   seconds per step (a round must
#                                fit the device call's limit)
#   DECA_PYTEST_ARGS="..."       extra pytest arguments, split at spaces (e.g. -x --maxfail=3)
#   DECA_PYTEST_K="..."          pytest's -k expression, passed as one argument (e.g. "cuda or compat")
#   DECA_BENCH_ARGS="..."        extra deca-bench arguments (e.g. --host-cost)
#   DECA_BENCH_VARIANTS="A=1 B=2,C=3"   run every preset once per variant: a comma-separated list of
#                                env assignments per variant (space between variants); the JSON
#                                and log of each carry the variant in their names
#                                The token `base` (alone or first: `base,A=1`) runs the base
#                                build's deca-bench (below); a variant listed twice runs twice
#                                (alternate them: "base default base default")
#   .ab/base.tgz                 a base tree for same-machine A/B (tools/ab_pack.sh COMMIT makes it
#                                here; carry ".ab" to the device): built into /tmp/deca-ab-build
#                                beside the round's own build, named by .ab/base.commit
#   DECA_BENCH_EXTRA="name:args;..."   further deca-bench runs (no --check), after the presets
#   DECA_NCU_CASES="l70-b99-4k/fp8 ..."  ncu counters for one launch per case (DECA_NCU_SKIP deca
#                                launches skipped first, default 2; DECA_NCU_LAUNCHES profiled, 1; DECA_NCU_KERNELS, regex:deca_(gqa|mla|combine): the library's kernels, not the bench's L2 flush)
#   DECA_SANITIZE=1              (last) compute-sanitizer over the C++ GPU suite: DECA_SANITIZE_TOOLS (default
#                                "memcheck racecheck initcheck synccheck"), all at once, each in
#                                DECA_SANITIZE_SHARDS gtest shards (default 3); DECA_SANITIZE_FILTER
#                                (default: all but the timing tests and the one-shot out-of-memory
#                                test, more than one call holds; `families`: one or a few tests of
#                                each kernel family a plan selects, which fits one call at 4 shards
#                                and 300 s), DECA_SANITIZE_TIMEOUT (s, 300)
#   DECA_JIT_STRESS=1            tools/jit_cache_stress.sh: processes sharing one JIT cache directory
#   DECA_DIFF=N                  the differential test (GPU against the CPU reference on N random
#                                configurations, tests/gpu/differential_test.cpp) after the GPU suite:
#                                default 1000 when the suite runs; 0 leaves it out; set, it runs even
#                                with DECA_SKIP_TESTS=1. DECA_DIFF_PROCS=P splits the cases over P
#                                processes (default 1; 4 for long runs), DECA_TEST_SEED picks the
#                                draws (default 1234), DECA_DIFF_TIMEOUT (s, 1200) per process.
#                                Under DECA_SANITIZE the suite's differential test draws
#                                DECA_SANITIZE_DIFF_CASES (16).
#   DECA_GIT_COMMIT=<sha>        the commit the JSON and logs name; pass it: the device's copy of the
#                                working tree may carry a .git from earlier (on 2026-12-02 it named
#                                the session's first commit for every round)
#
# The machine has the CUDA toolkit, CMake and ninja but maybe not GoogleTest, CLI11 or
# nlohmann-json: when .deps/ (made by tools/make_deps.sh on a machine that has them) is present,
# they are built / found from there. Nothing here changes the GPU's settings.
set -u -o pipefail
out=${1:-${OUT:-/tmp/deca-out}}
shift || true
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(gqa)
mkdir -p "$out"
logs=/tmp/deca-round
rm -rf "$logs"
mkdir -p "$logs"
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
# Every log line also repacks the archive, so a round stopped at the call's time limit still
# returns what it had.
pack() { cp "$out/round.log" "$logs/round.log" 2> /dev/null; tar czf "$out/round.tgz" -C "$logs" . 2> /dev/null; }
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/round.log"; pack; }
trap pack EXIT

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,memory.total,driver_version \
  --format=csv > "$logs/gpu.csv" 2>&1 || true
log "gpu: $(tail -1 "$logs/gpu.csv")"

prefix_args=()
if [ -d "$root/.deps" ]; then
  deps=/tmp/deca-deps
  if [ ! -f "$deps/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$deps/lib64/cmake/GTest/GTestConfig.cmake" ]; then
    log "building GoogleTest from .deps"
    cmake -S "$root/.deps/src/googletest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=$deps -DBUILD_GMOCK=ON > "$logs/deps.log" 2>&1 &&
      cmake --build /tmp/gtest-build -j "$jobs" >> "$logs/deps.log" 2>&1 &&
      cmake --install /tmp/gtest-build >> "$logs/deps.log" 2>&1 || log "GoogleTest build failed (deps.log)"
  fi
  prefix_args=(-DCMAKE_PREFIX_PATH="$deps;$root/.deps/prefix")
fi

build=/tmp/deca-build
log "configure"
cmake -S "$root" -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix_args[@]}" \
  > "$logs/configure.log" 2>&1 || { log "configure failed"; tail -30 "$logs/configure.log"; exit 1; }
log "build"
cmake --build $build -j "$jobs" --target deca_test_gpu deca_test_jit \
  > "$logs/build.log" 2>&1 || { log "build failed"; grep -E "error" "$logs/build.log" | head -30; exit 1; }
have_bench=1
cmake --build $build -j "$jobs" --target deca-bench >> "$logs/build.log" 2>&1 ||
  { have_bench=0; log "deca-bench did not build"; grep -E "error" "$logs/build.log" | head -10; }

# The A/B base (tools/ab_pack.sh): its own tree and build, its own JIT cache (a kernel of the
# same name may differ between the two trees).
base_bench=""
if [ -f "$root/.ab/base.tgz" ] && [ "${DECA_SKIP_BENCH:-0}" != 1 ]; then
  base_commit=$(cat "$root/.ab/base.commit" 2> /dev/null || echo base)
  log "A/B base $base_commit: build"
  rm -rf /tmp/deca-ab && mkdir -p /tmp/deca-ab && tar xzf "$root/.ab/base.tgz" -C /tmp/deca-ab
  if cmake -S /tmp/deca-ab/base -B /tmp/deca-ab-build -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix_args[@]}" \
      > "$logs/ab-build.log" 2>&1 && cmake --build /tmp/deca-ab-build -j "$jobs" --target deca-bench >> "$logs/ab-build.log" 2>&1; then
    base_bench=/tmp/deca-ab-build/bench/deca-bench
  else
    log "A/B base did not build (ab-build.log)"
  fi
fi

export DECA_CACHE_DIR=/tmp/deca-cache
export DECA_GIT_COMMIT=${DECA_GIT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
log "commit named in the results: $DECA_GIT_COMMIT"
if [ "${DECA_SKIP_TESTS:-0}" != 1 ]; then
  shards=${DECA_GTEST_SHARDS:-1}
  # The differential test has a step of its own (below).
  suite_filter=${DECA_GTEST_FILTER:-*}
  case $suite_filter in *-*) suite_filter="$suite_filter:Differential.*" ;; *) suite_filter="$suite_filter-Differential.*" ;; esac
  if [ "$shards" -le 1 ]; then
    log "GPU tests"
    timeout "${DECA_GTEST_TIMEOUT:-1800}" $build/tests/deca_test_gpu --gtest_output=json:"$logs/gpu_tests.json" --gtest_filter="$suite_filter" \
      > "$logs/gpu_tests.log" 2>&1
    log "gpu tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$logs/gpu_tests.log" | tr '\n' ' ')"
  else
    # Most of the suite's time is NVRTC compiling each specialization on first use, one after
    # another: gtest shards in parallel processes spread the compiles over the cores. The timing
    # tests run alone afterwards (they measure; sharing the GPU would skew them).
    sharded="$suite_filter:*Timing*"
    log "GPU tests: $shards shards in parallel, then the timing tests"
    pids=()
    for ((s = 0; s < shards; ++s)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s timeout "${DECA_GTEST_TIMEOUT:-1800}" \
        $build/tests/deca_test_gpu --gtest_filter="$sharded" > "$logs/gpu_tests_$s.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    : > "$logs/gpu_tests_timing.log"
    [ "${DECA_SKIP_TIMING:-0}" = 1 ] || timeout "${DECA_GTEST_TIMEOUT:-1800}" $build/tests/deca_test_gpu \
      --gtest_filter="*Timing*" > "$logs/gpu_tests_timing.log" 2>&1
    cat "$logs"/gpu_tests_[0-9]*.log "$logs/gpu_tests_timing.log" > "$logs/gpu_tests.log"
    for f in "$logs"/gpu_tests_[0-9]*.log "$logs/gpu_tests_timing.log"; do
      log "$(basename "$f"): $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')"
    done
    log "gpu tests: $(grep -cE '^\[       OK' "$logs/gpu_tests.log") OK, $(grep -cE '^\[  FAILED  \] .*\(' "$logs/gpu_tests.log") failed"
  fi
  grep -E "FAILED|^\[err\]" "$logs/gpu_tests.log" | tail -40
  if [ "${DECA_SKIP_JIT:-0}" != 1 ]; then
    log "JIT tests (compile + cached load times)"
    $build/tests/deca_test_jit > "$logs/jit_tests.log" 2>&1
    log "jit tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$logs/jit_tests.log" | tr '\n' ' ')"
    grep -E "FAILED" "$logs/jit_tests.log" | tail -10
  fi
fi
# The differential test: DECA_DIFF random configurations of every op, GPU against the CPU
# reference, in DECA_DIFF_PROCS processes that share the draws (each runs every P-th case); one
# "[differential] seed=..." line per process and their totals in round.log.
if [ "${DECA_SKIP_TESTS:-0}" != 1 ] || [ -n "${DECA_DIFF:-}" ]; then
  diff_cases=${DECA_DIFF:-1000}
  procs=${DECA_DIFF_PROCS:-1}
  if [ "$diff_cases" -gt 0 ]; then
    log "differential test: $diff_cases cases, $procs processes, DECA_TEST_SEED=${DECA_TEST_SEED:-1234}"
    if [ "$procs" -gt 1 ]; then
      # One process compiles every case's kernels into the disk cache; the shards then load them.
      DECA_DIFF_CASES=$diff_cases DECA_DIFF_PLAN_ONLY=1 timeout "${DECA_DIFF_TIMEOUT:-1200}" \
        $build/tests/deca_test_gpu --gtest_filter='Differential.*' > "$logs/differential_plan.log" 2>&1
      log "$(grep -h '^\[differential\] planned' "$logs/differential_plan.log")"
    fi
    pids=()
    for ((s = 0; s < procs; ++s)); do
      DECA_DIFF_CASES=$diff_cases DECA_DIFF_SHARD=$s/$procs timeout "${DECA_DIFF_TIMEOUT:-1200}" \
        $build/tests/deca_test_gpu --gtest_filter='Differential.*' > "$logs/differential_$s.log" 2>&1 &
      pids+=($!)
    done
    rcs=()
    for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
    cat "$logs"/differential_[0-9]*.log > "$logs/differential.log"
    grep -h '^\[differential\] seed=' "$logs"/differential_[0-9]*.log | tee -a "$out/round.log"
    log "differential total (process rc ${rcs[*]}): $(awk '/^\[differential\] seed=/ {
        for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] ~ /^(cases|mismatches|refusals|gpu_only|cpu_only|both)$/) t[kv[1]] += kv[2] }
        ++n } END { printf "%d processes, cases=%d mismatches=%d refusals=%d gpu_only=%d cpu_only=%d both=%d",
        n, t["cases"], t["mismatches"], t["refusals"], t["gpu_only"], t["cpu_only"], t["both"] }' "$logs"/differential_[0-9]*.log)"
    grep -hE '^\[  FAILED|^\[differential\] (case|.* worst)' "$logs"/differential_[0-9]*.log | head -40
  fi
fi
if [ "${DECA_SKIP_PYTHON:-0}" != 1 ]; then
  # The machine's own python3 (torch, cupy, jax) and its default compiler, as a user would build.
  log "python: pip install ."
  # A warm machine keeps the last call's /tmp/deca-py, and pip --target leaves an existing
  # package in place (with a warning only): install into an empty directory.
  rm -rf /tmp/deca-py
  (cd "$root" && python3 -m pip install -q --no-build-isolation --no-deps --root-user-action=ignore \
    --target /tmp/deca-py . ) > "$logs/pip.log" 2>&1 || { log "pip install failed"; tail -20 "$logs/pip.log"; }
  readelf -d /tmp/deca-py/deca/_C*.so 2> /dev/null | grep NEEDED > "$logs/module_needed.txt"
  log "module NEEDED: $(awk '{print $5}' "$logs/module_needed.txt" | tr '\n' ' ')"
  log "python tests"
  (cd "$root" && PYTHONPATH=/tmp/deca-py timeout "${DECA_PYTEST_TIMEOUT:-420}" python3 -m pytest tests/python -q -rs \
      -p no:cacheprovider ${DECA_PYTEST_K:+-k "$DECA_PYTEST_K"} ${DECA_PYTEST_ARGS:-}) > "$logs/pytest.log" 2>&1
  log "pytest rc=$? $(tail -1 "$logs/pytest.log")"
  grep -E "^FAILED|^ERROR" "$logs/pytest.log" | head -30
  if [ -f "$root/tools/py_host_cost.py" ] && [ "${DECA_SKIP_HOST_COST:-0}" != 1 ]; then
    (cd "$root" && PYTHONPATH=/tmp/deca-py timeout 120 python3 tools/py_host_cost.py) > "$logs/py_host_cost.log" 2>&1
    log "python host cost rc=$?"
    tail -15 "$logs/py_host_cost.log"
    # The same with torch tensors read through their attributes rather than DLPack's C exchange
    # table, side by side.
    (cd "$root" && DECA_PY_DLPACK_EXCHANGE=0 PYTHONPATH=/tmp/deca-py timeout 120 python3 tools/py_host_cost.py) \
        > "$logs/py_host_cost_attributes.log" 2>&1
    log "python host cost, attribute route rc=$?"
    tail -8 "$logs/py_host_cost_attributes.log"
  fi
fi
# Hardware counters for chosen cases (DECA_NCU_CASES="l70-b99-4k/fp8 ..."): one decode launch each.
# The default name filter leaves out the combine kernels: a split MLA case launches one beside its
# decode kernel, and the 90b58e5 round's profile of a dense case landed on it.
if [ -n "${DECA_NCU_CASES:-}" ] && [ $have_bench = 1 ] && command -v ncu > /dev/null; then
  for c in $DECA_NCU_CASES; do
    log "ncu $c"
    f="$logs/ncu_$(echo "$c" | tr '/' '_').log"
    ncu --clock-control none --kernel-name "${DECA_NCU_KERNELS:-regex:^deca_(gqa_decode|mla_sparse_decode|mla_dense_decode)}" --launch-skip "${DECA_NCU_SKIP:-2}" \
      --launch-count "${DECA_NCU_LAUNCHES:-1}" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section LaunchStats \
      $build/bench/deca-bench --preset "$c" --iters 1 --warmup 1 > "$f" 2>&1
    grep -E "deca_|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Compute \(SM\)" "$f" | head -20
  done
fi
if [ "${DECA_SKIP_BENCH:-0}" != 1 ] && [ $have_bench = 1 ]; then
  read -r -a variants <<< "${DECA_BENCH_VARIANTS:-default}"
  for p in "${presets[@]}"; do
    declare -A seen=()
    for v in "${variants[@]}"; do
      tag=$(echo "$p" | tr '/' '_')
      envs=()
      bin=$build/bench/deca-bench
      if [ "$v" != default ]; then
        IFS=, read -r -a envs <<< "$v"
        tag="$tag-$(echo "$v" | tr ',=' '_-')"
      fi
      if [ "${envs[0]:-}" = base ]; then
        [ -n "$base_bench" ] || { log "bench $p $v: no A/B base (.ab/base.tgz)"; continue; }
        bin=$base_bench
        envs=("${envs[@]:1}" "DECA_CACHE_DIR=/tmp/deca-ab-cache" "DECA_GIT_COMMIT=$base_commit")
      fi
      seen[$tag]=$((${seen[$tag]:-0} + 1))
      [ "${seen[$tag]}" -gt 1 ] && tag="$tag-${seen[$tag]}"
      log "bench $p ${v}"
      env "${envs[@]}" timeout "${DECA_BENCH_TIMEOUT:-600}" $bin --preset "$p" --check ${DECA_BENCH_ARGS:-} \
        --json "$logs/bench_$tag.json" > "$logs/bench_$tag.log" 2>&1
      log "bench $p rc=$?"
      grep -vE "^\s*$" "$logs/bench_$tag.log" | tail -30
    done
  done
fi
# Extra deca-bench runs without --check (DECA_BENCH_EXTRA="name:args;name:args"), e.g. the sweep
# behind the plot or --checked / --host-cost on a few cases: bench_<name>.json / .log.
if [ -n "${DECA_BENCH_EXTRA:-}" ] && [ $have_bench = 1 ]; then
  IFS=';' read -r -a extras <<< "$DECA_BENCH_EXTRA"
  for e in "${extras[@]}"; do
    name=${e%%:*}
    read -r -a eargs <<< "${e#*:}"
    log "bench $name: ${eargs[*]}"
    timeout "${DECA_BENCH_TIMEOUT:-600}" $build/bench/deca-bench "${eargs[@]}" --json "$logs/bench_$name.json" > "$logs/bench_$name.log" 2>&1
    log "bench $name rc=$?"
    grep -vE "^\s*$" "$logs/bench_$name.log" | grep -vE "^\[[0-9]+/" | tail -25
  done
fi
# The JIT cache under concurrent processes, with damaged entries planted (tools/jit_cache_stress.sh).
if [ "${DECA_JIT_STRESS:-0}" = 1 ] && [ $have_bench = 1 ]; then
  log "JIT cache stress"
  DECA_JIT_STRESS_DIR=$logs timeout "${DECA_JIT_STRESS_TIMEOUT:-300}" bash "$root/tools/jit_cache_stress.sh" $build > "$logs/jit_stress.log" 2>&1
  log "jit stress rc=$? $(tail -1 "$logs/jit_stress.log")"
fi
if [ "${DECA_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  # Every tool over the whole suite at once: each tool's run is split into DECA_SANITIZE_SHARDS
  # gtest shards, and all (tool, shard) processes share the GPU and the cores, so the four
  # tools over every kernel family fit one device call. The timing tests are left out (they
  # measure, they check nothing a sanitizer adds to).
  shards=${DECA_SANITIZE_SHARDS:-3}
  # The one-shot out-of-memory test provokes a failing cudaMalloc, which the tools report as an
  # API error; the differential test draws a handful of cases (DECA_SANITIZE_DIFF_CASES).
  filter=${DECA_SANITIZE_FILTER:--*Timing*:Concurrency.OneShotWorkspaceBeyondTheDeviceIsAnError}
  # The plans' kernel families, each by tests that finish under the tools within the limit (the
  # GQA split and fixed-split merges, skip, fused; MLA dense with and without TMA, sparse, MODEL1,
  # combine); MlaDenseGpu.MatchesCpuReference's long CPU reference outlasts a call under each tool.
  if [ "$filter" = families ]; then
    filter='Matrix/GqaGpuMatrix.*split*:Cases/GqaSkipGpu.*peaked_fp8_e4m3:Cases/GqaSkipGpu.*peaked_bf16'
    filter+=':Cases/GqaSkipGpu.*peaked_d64_group7_bf16:Fused/GqaFusedGpu.*/neox_*:GqaGpu.*:CombineGpu.*'
    filter+=':MlaDenseGpu.TmaRowsWherePlansTakeThem:MlaDenseGpu.CacheAsAStridedView:MlaSparseGpu.MatchesCpuReference'
    filter+=':MlaModel1Gpu.HeadsQLenPagesBothCaches:MlaCombineSplit.SparseBitwiseTheDefaultCombine'
    filter+=':MlaSm90Kernel.Heads128TwoHeadBlocks:MlaSm90Kernel.SplitPiecesWritePartials'
    filter+='-*widen_ldsm*:*two_term*:*path8*'
  fi
  log "compute-sanitizer: ${DECA_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck} x $shards shards, filter $filter"
  pids=()
  for tool in ${DECA_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    for ((s = 0; s < shards; ++s)); do
      DECA_DIFF_CASES=${DECA_SANITIZE_DIFF_CASES:-16} GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s timeout "${DECA_SANITIZE_TIMEOUT:-300}" \
        compute-sanitizer --tool $tool --error-exitcode 9 $build/tests/deca_test_gpu \
        --gtest_filter="$filter" > "$logs/sanitize_${tool}_$s.log" 2>&1 &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for tool in ${DECA_SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do
    for ((s = 0; s < shards; ++s)); do
      f="$logs/sanitize_${tool}_$s.log"
      log "$tool shard $s: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests from .* ran|^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')"
    done
  done
fi
log "done"
