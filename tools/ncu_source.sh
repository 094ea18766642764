#!/usr/bin/env bash
# Per-instruction profile of one kernel of a deca-bench case on a GPU machine: builds deca-bench,
# runs ncu (full set, with warp-state samples per SASS instruction) on one launch, and writes the
# report plus its source page (SASS with stall samples, CSV) and details page, packed into
# OUTDIR/ncu.tgz (the device tool returns few files).
#
#   tools/ncu_source.sh OUTDIR KERNEL_REGEX CASE [CASE...]   e.g. regex:deca_mla_sparse_decode_sm90
#
# DECA_NCU_SKIP (default 3): launches of the kernel skipped first (warm-up); DECA_BENCH_ENVS: env
# assignments for deca-bench (comma separated). Nothing here changes the GPU's settings
# (--clock-control none).
set -u -o pipefail
final=$1 kernel=$2
shift 2
out=/tmp/deca-ncu
rm -rf "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
build=/tmp/deca-build
mkdir -p "$out" "$final"
trap 'tar czf "$final/ncu.tgz" -C "$out" . 2> /dev/null' EXIT
prefix_args=()
[ -d "$root/.deps" ] && prefix_args=(-DCMAKE_PREFIX_PATH="$root/.deps/prefix")
cmake -S "$root" -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDECA_BUILD_TESTS=OFF "${prefix_args[@]}" \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build $build -j "$(nproc)" --target deca-bench > "$out/build.log" 2>&1 ||
  { grep -E "error" "$out/build.log" | head -30; exit 1; }
export DECA_CACHE_DIR=/tmp/deca-cache
envs=()
[ -n "${DECA_BENCH_ENVS:-}" ] && IFS=, read -r -a envs <<< "$DECA_BENCH_ENVS"
for c in "$@"; do
  tag=$(echo "$c" | tr '/' '_')${DECA_NCU_TAG:+-$DECA_NCU_TAG}
  env "${envs[@]}" ncu --clock-control none --kernel-name "$kernel" --launch-skip "${DECA_NCU_SKIP:-3}" \
    --launch-count 1 --set full --import-source no -f -o "$out/$tag" \
    $build/bench/deca-bench --preset "$c" --iters 1 --warmup 1 > "$out/$tag.run.log" 2>&1
  echo "ncu $c rc=$?"
  ncu --import "$out/$tag.ncu-rep" --page source --print-source sass --csv > "$out/$tag.source.csv" 2>&1
  ncu --import "$out/$tag.ncu-rep" --page details --print-details all > "$out/$tag.details.txt" 2>&1
  grep -E "Duration|DRAM Throughput|L2 Hit Rate|Issued Warp Per" "$out/$tag.details.txt" | sort -u | head
  rm -f "$out/$tag.ncu-rep"
done
