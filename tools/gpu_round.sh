#!/usr/bin/env bash
# One whole round on a GPU machine: build, GPU tests, benchmarks; logs and JSON into $1 (or $OUT).
#
#   tools/gpu_round.sh OUTDIR [bench presets...]      (default presets: the GQA table)
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
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/round.log"; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,memory.total,driver_version \
  --format=csv > "$out/gpu.csv" 2>&1 || true
log "gpu: $(tail -1 "$out/gpu.csv")"

prefix_args=()
if [ -d "$root/.deps" ]; then
  deps=/tmp/deca-deps
  if [ ! -f "$deps/lib/cmake/GTest/GTestConfig.cmake" ] && [ ! -f "$deps/lib64/cmake/GTest/GTestConfig.cmake" ]; then
    log "building GoogleTest from .deps"
    cmake -S "$root/.deps/src/googletest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=$deps -DBUILD_GMOCK=ON > "$out/deps.log" 2>&1 &&
      cmake --build /tmp/gtest-build -j "$jobs" >> "$out/deps.log" 2>&1 &&
      cmake --install /tmp/gtest-build >> "$out/deps.log" 2>&1 || log "GoogleTest build failed (deps.log)"
  fi
  prefix_args=(-DCMAKE_PREFIX_PATH="$deps;$root/.deps/prefix")
fi

build=/tmp/deca-build
log "configure"
cmake -S "$root" -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix_args[@]}" \
  > "$out/configure.log" 2>&1 || { log "configure failed"; tail -30 "$out/configure.log"; exit 1; }
log "build"
cmake --build $build -j "$jobs" --target deca_test_gpu deca_test_jit \
  > "$out/build.log" 2>&1 || { log "build failed"; grep -E "error" "$out/build.log" | head -30; exit 1; }
have_bench=1
cmake --build $build -j "$jobs" --target deca-bench >> "$out/build.log" 2>&1 ||
  { have_bench=0; log "deca-bench did not build"; grep -E "error" "$out/build.log" | head -10; }

export DECA_CACHE_DIR=/tmp/deca-cache
export DECA_GIT_COMMIT=${DECA_GIT_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "${DECA_SKIP_TESTS:-0}" != 1 ]; then
  log "GPU tests"
  $build/tests/deca_test_gpu --gtest_output=json:"$out/gpu_tests.json" ${DECA_GTEST_FILTER:+--gtest_filter=$DECA_GTEST_FILTER} \
    > "$out/gpu_tests.log" 2>&1
  log "gpu tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests.log" | tr '\n' ' ')"
  grep -E "^\[gpu\]|FAILED" "$out/gpu_tests.log" | tail -80
  if [ "${DECA_SKIP_JIT:-0}" != 1 ]; then
    log "JIT tests (compile + cached load times)"
    $build/tests/deca_test_jit > "$out/jit_tests.log" 2>&1
    log "jit tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/jit_tests.log" | tr '\n' ' ')"
  fi
fi
# Hardware counters for chosen cases (DECA_NCU_CASES="l70-b99-4k/fp8 ..."): one decode launch each.
if [ -n "${DECA_NCU_CASES:-}" ] && [ $have_bench = 1 ] && command -v ncu > /dev/null; then
  for c in $DECA_NCU_CASES; do
    log "ncu $c"
    ncu --clock-control none --kernel-name deca_gqa_decode --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section LaunchStats \
      $build/bench/deca-bench --preset "$c" --iters 1 --warmup 1 \
      > "$out/ncu_$(echo "$c" | tr '/' '_').log" 2>&1
    grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|Block Limit|Compute \(SM\)" \
      "$out/ncu_$(echo "$c" | tr '/' '_').log" | head -40
  done
fi
if [ "${DECA_SKIP_BENCH:-0}" != 1 ] && [ $have_bench = 1 ]; then
  for p in "${presets[@]}"; do
    log "bench $p"
    $build/bench/deca-bench --preset "$p" --check --json "$out/bench_$p.json" > "$out/bench_$p.log" 2>&1
    log "bench $p rc=$?"
    tail -40 "$out/bench_$p.log"
  done
fi
log "done"
