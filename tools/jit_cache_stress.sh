#!/usr/bin/env bash
# The JIT cache under concurrent processes (issue 9 item 4): several deca-bench processes compile
# and load the same and different kernel specializations at once into one fresh cache directory in
# which a corrupted and a truncated entry were planted; then every process must have exited 0,
# every file left must be a whole entry (checked by the disk cache's own reader through
# deca_test_jit's DiskCacheVerify), the damaged entries must have been replaced, and no temp file
# may remain. Prints one verdict line; exits non-zero on failure.
#
#   tools/jit_cache_stress.sh [BUILD_DIR]          (default: build; needs deca-bench, deca_test_jit)
#
# Environment: DECA_JIT_STRESS_PROCS (default 8: half compile the same keys, half one key each of
# their own), DECA_JIT_STRESS_GPU (auto | 0 | 1; with a GPU, as many again run a small preset on
# it, loading and launching from the same cache), DECA_JIT_STRESS_JOBS (NVRTC threads per
# process, default 2), DECA_JIT_STRESS_DIR (where the work directory goes, default $TMPDIR or /tmp;
# it is removed on success and kept, with every process's log, on failure),
# DECA_JIT_STRESS_KEEP=1 keeps it on success too.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd) || exit 2
bench=$build/bench/deca-bench
jittest=$build/tests/deca_test_jit
procs=${DECA_JIT_STRESS_PROCS:-8}
jobs=${DECA_JIT_STRESS_JOBS:-2}
for b in "$bench" "$jittest"; do
  [ -x "$b" ] || { echo "jit_cache_stress: $b is missing (build deca-bench and deca_test_jit)"; exit 2; }
done
gpu=${DECA_JIT_STRESS_GPU:-auto}
if [ "$gpu" = auto ]; then
  gpu=0
  command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q GPU && gpu=1
fi
work=$(mktemp -d "${DECA_JIT_STRESS_DIR:-${TMPDIR:-/tmp}}/deca_jit_stress.XXXXXX")
cache=$work/cache
[ "${DECA_JIT_STRESS_KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
start=$(date +%s.%N)
reasons=()
verdict() {
  local secs
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local keys
  keys=$(find "$cache" -maxdepth 1 -name '*.cubin' 2> /dev/null | wc -l)
  if [ ${#reasons[@]} -eq 0 ]; then
    echo "jit_cache_stress: $nproc_total processes, $keys keys, corrupt+truncated planted: OK ($1, ${secs} s)"
    exit 0
  fi
  local IFS=';'
  echo "jit_cache_stress: $nproc_total processes, $keys keys, corrupt+truncated planted: FAIL (${reasons[*]}; ${secs} s; logs in $work)"
  trap - EXIT
  exit 1
}
nproc_total=0
export DECA_CACHE_DIR=$cache

# 1. Valid entries for the keys every "same" process needs: the small preset's GQA case with a
# bf16 and an fp8 cache (two specializations), for sm_90 (no GPU needed).
shared=small-gqa-b4-1k
"$bench" --precompile $shared --arch 90 --jobs "$jobs" > "$work/seed.log" 2>&1 ||
  { reasons+=("seeding --precompile $shared failed: $(tail -1 "$work/seed.log")"); verdict ""; }
mapfile -t seeded < <(find "$cache" -maxdepth 1 -name '*.cubin' | sort)
[ ${#seeded[@]} -ge 2 ] || { reasons+=("seeding left ${#seeded[@]} entries, expected 2"); verdict ""; }

# 2. Damage them in place: 16 bytes flipped in the middle of the first (inside the cubin payload:
# the header is 40 bytes, key and log a few hundred), the second cut to a third of its size.
corrupt=${seeded[0]} truncated=${seeded[1]}
size=$(stat -c %s "$corrupt")
off=$((size / 2))
cp "$corrupt" "$work/good_corrupt" && cp "$truncated" "$work/good_truncated"
dd if="$corrupt" of="$work/flip_in" bs=1 skip=$off count=16 status=none
# Each byte XOR 0xff: od gives the bytes, printf writes their complements back.
printf "$(od -An -v -tu1 "$work/flip_in" | tr -s ' ' '\n' | grep . |
  while read -r b; do printf '\\%03o' $((255 - b)); done)" |
  dd of="$corrupt" bs=1 seek=$off conv=notrunc status=none
truncate -s $(($(stat -c %s "$truncated") / 3)) "$truncated"
cp "$corrupt" "$work/damaged_corrupt" && cp "$truncated" "$work/damaged_truncated"
cmp -s "$corrupt" "$work/good_corrupt" && reasons+=("the corruption changed nothing")
# The checker must see both as damaged before the run (else it proves nothing afterwards).
DECA_JIT_VERIFY_DIR=$cache "$jittest" --gtest_filter='DiskCacheVerify.*' > "$work/verify_before.log" 2>&1
grep -q "0 valid, 2 damaged" "$work/verify_before.log" ||
  reasons+=("the checker did not see the planted damage: $(grep '\[verify\]' "$work/verify_before.log")")
[ ${#reasons[@]} -eq 0 ] || verdict ""

# 3. All at once. Same keys: --precompile of the shared case (its two entries are the damaged
# ones). Different keys: a shape of its own each (head_dim, group, page size, cache dtype), after
# an MLA-only preset that compiles nothing. With a GPU: processes planning and launching the
# shared case, loading the cubins from the same directory while they are being repaired.
shapes=("hq=8,hkv=1,d=64,p=16,kv=bf16" "hq=8,hkv=2,d=64,p=16,kv=fp8" "hq=16,hkv=2,d=128,p=16,kv=bf16"
  "hq=4,hkv=1,d=128,p=32,kv=fp8" "hq=8,hkv=1,d=64,p=32,kv=int8" "hq=16,hkv=4,d=64,p=64,kv=fp16"
  "hq=12,hkv=2,d=128,p=64,kv=fp8" "hq=8,hkv=4,d=128,p=16,kv=int8")
pids=() names=()
launch() {  # name, command...
  local name=$1
  shift
  "$@" > "$work/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
for ((i = 0; i < procs; ++i)); do
  if ((i % 2 == 0)); then
    launch "same$i" "$bench" --precompile $shared --arch 90 --jobs "$jobs"
  else
    launch "own$i" "$bench" --precompile small-mla-dense-b2-h16-1k --arch 90 --jobs "$jobs" \
      --shape "b=1,s=100,${shapes[$((i / 2 % ${#shapes[@]}))]}"
  fi
done
if [ "$gpu" = 1 ]; then
  for ((i = 0; i < procs / 2; ++i)); do
    launch "gpu$i" "$bench" --backend cuda --preset $shared --iters 1 --warmup 0
  done
fi
nproc_total=${#pids[@]}
failed=()
for k in "${!pids[@]}"; do
  wait "${pids[$k]}" || failed+=("${names[$k]} rc=$?")
done
[ ${#failed[@]} -eq 0 ] || reasons+=("${#failed[@]} processes failed: ${failed[*]}")
saw_damage=$(grep -l "is damaged" "$work"/same*.log "$work"/gpu*.log 2> /dev/null | wc -l)

# 4. Afterwards: every entry whole, the planted ones replaced, no temp file.
DECA_JIT_VERIFY_DIR=$cache "$jittest" --gtest_filter='DiskCacheVerify.*' > "$work/verify_after.log" 2>&1 ||
  reasons+=("checker: $(grep -E '\[verify\]|not a valid|temp file|unexpected' "$work/verify_after.log" | head -3 | tr '\n' ' ')")
valid=$(sed -n 's/.*: \([0-9]*\) valid,.*/\1/p' "$work/verify_after.log")
for f in corrupt truncated; do
  p=${!f}
  if [ ! -f "$p" ]; then
    reasons+=("the $f entry is gone")
  elif cmp -s "$p" "$work/damaged_$f"; then
    reasons+=("the $f entry was not replaced")
  fi
done
temps=$(find "$cache" -name '*.tmp.*' | wc -l)
[ "$temps" -eq 0 ] || reasons+=("$temps temp files left")
expected=$((2 + procs / 2))
keys=$(find "$cache" -maxdepth 1 -name '*.cubin' | wc -l)
[ "$keys" -ge "$expected" ] || reasons+=("$keys entries, expected at least $expected")
verdict "$((nproc_total - ${#failed[@]}))/$nproc_total exit 0, ${valid:-?} valid entries, 0 temp files, both damaged entries replaced, damage met by $saw_damage processes, gpu=$gpu"
