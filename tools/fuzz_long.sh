#!/usr/bin/env bash
# Runs the fuzz suite (tests/python/test_fuzz.py) for a long time: a large example count per op,
# a fresh random seed unless DECA_FUZZ_SEED is given, failures counted instead of stopping the
# run. Prints inputs tried, crashes, hangs, silent acceptances and wrong results, and keeps the
# first failing specs (replayable: put one into fuzz_cases.run_case) in the JSON report.
#
#   bash tools/fuzz_long.sh [examples per op, default 200000]   (after tools/test.sh)
#   DECA_FUZZ_REPORT=path to keep the report elsewhere than build/fuzz_report.json
set -euo pipefail
cd "$(dirname "$0")/.."
python=${DECA_PYTHON:-.venv/bin/python}
export DECA_FUZZ_EXAMPLES=${1:-200000}
export DECA_FUZZ_SEED=${DECA_FUZZ_SEED:-$RANDOM$RANDOM}
export DECA_FUZZ_KEEP_GOING=1
export DECA_FUZZ_REPORT=${DECA_FUZZ_REPORT:-build/fuzz_report.json}
mkdir -p "$(dirname "$DECA_FUZZ_REPORT")"
echo "fuzz_long: $DECA_FUZZ_EXAMPLES examples per op, seed $DECA_FUZZ_SEED"
start=$(date +%s)
status=0
"$python" -m pytest tests/python/test_fuzz.py -q -p no:cacheprovider || status=$?
"$python" - "$DECA_FUZZ_REPORT" "$start" <<'PY'
import json, sys, time
report = json.load(open(sys.argv[1]))
c = report["counts"]
print(f"fuzz_long: {c['inputs']} inputs in {time.time() - int(sys.argv[2]):.0f} s: "
      f"{c['crashes']} crashes, {c['hangs']} hangs, {c['silent']} silent acceptances, "
      f"{c['wrong']} wrong results ({c['ok']} ok, {c['refused']} refused with nothing written)")
for f in report["failures"][:10]:
    print(f"  {f['kind']}: {f['message']}\n    spec: {f['spec']}")
sys.exit(1 if c["crashes"] + c["hangs"] + c["silent"] + c["wrong"] else 0)
PY
exit $status
