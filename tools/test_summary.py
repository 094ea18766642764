#!/usr/bin/env python3
"""The closing summary of tools/test.sh: one line per stage, skip reasons once, totals last.

    test_summary.py --logs DIR --stage NAME:SECONDS:STATUS[:KIND:JUNIT.xml] ...

STATUS is the stage's exit code, `skip` (left out on purpose) or `notrun` (an earlier stage it
needs failed). KIND is `ctest` or `pytest` for a stage whose runner wrote JUnit XML: its tests are
counted and its skipped tests grouped by reason, GPU-less skips apart. The last line is
`N passed, N failed, N skipped` over every counted test; a failed stage that counts no test (a
build, an install) adds one to `failed`, so the line never reads clean when something broke.
"""

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET

# Skip messages that mean "this machine has no (suitable) GPU".
NO_GPU = re.compile(r"GPU|CUDA device|CUDA driver|no CUDA|compute capability|cuda\.is_available",
                    re.IGNORECASE)
CTEST_SKIP = "SKIP_REGULAR_EXPRESSION_MATCHED"


def gtest_reason(output):
    """The message after gtest's `file:line: Skipped` line, else the output's first line."""
    lines = (output or "").splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines) and lines[i + 1].strip():
            return lines[i + 1].strip()
    return next((l.strip() for l in lines if l.strip()), "no reason given")


def read_junit(path, kind):
    """(passed, failed names, skip reasons by test) from a ctest or pytest JUnit file."""
    passed, failed, skipped = 0, [], {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        if kind == "pytest" and case.get("classname"):
            name = f"{case.get('classname')}::{name}"
        out = case.findtext("system-out") or ""
        skip = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif skip is not None and kind == "ctest" and skip.get("message") != CTEST_SKIP:
            failed.append(f"{name} (not run: {skip.get('message')})")  # ctest counts it failed
        elif skip is not None:
            skipped[name] = gtest_reason(out) if kind == "ctest" else skip.get("message", "")
        elif case.get("status") == "disabled":
            skipped[name] = "disabled"
        else:
            passed += 1
    return passed, failed, skipped


def clock(seconds):
    return f"{seconds // 60}:{seconds % 60:02d}"


def short(text, n=90):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--stage", action="append", default=[])
    args = ap.parse_args()

    total = collections.Counter()
    rows, other_skips, failures = [], [], []
    elapsed = 0
    for spec in args.stage:
        name, seconds, status, *junit = spec.split(":", 4)
        seconds = int(seconds)
        elapsed += seconds
        ok = status == "0"
        if status == "skip":
            result = "left out"
        elif status == "notrun":
            result = "not run (an earlier stage failed)"
        elif junit and junit[1] and _exists(junit[1]):
            kind, path = junit
            passed, failed, skipped = read_junit(path, kind)
            gpu = sum(1 for r in skipped.values() if NO_GPU.search(r))
            result = f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped"
            if gpu:
                result += f" ({gpu} for want of a GPU)"
            if not ok and not failed:
                result += f"; exit {status}"
                total["failed"] += 1
            total.update(passed=passed, failed=len(failed), skipped=len(skipped))
            failures += [f"{name}: {f}" for f in failed]
            by_reason = collections.defaultdict(list)
            for test, reason in skipped.items():
                if not NO_GPU.search(reason):
                    by_reason[reason].append(test)
            for reason, tests in sorted(by_reason.items()):
                more = f" and {len(tests) - 2} more" if len(tests) > 2 else ""
                other_skips.append(f"{name}: {len(tests)} x {short(reason, 70)} "
                                   f"({', '.join(tests[:2])}{more})")
        else:
            result = "ok" if ok else f"FAILED (exit {status})"
            if not ok:
                total["failed"] += 1
        rows.append((name, clock(seconds), result))

    width = max(len(r[0]) for r in rows) if rows else 10
    print("\n== tools/test.sh summary ==")
    for name, t, result in rows:
        print(f"  {name:<{width}}  {t:>6}  {result}")
    print(f"  {'total':<{width}}  {clock(elapsed):>6}")
    if other_skips:
        print("skipped for other reasons than a missing GPU:")
        for line in other_skips:
            print("  " + line)
    if failures:
        print("failed:")
        for line in failures[:40]:
            print("  " + line)
        if len(failures) > 40:
            print(f"  ... and {len(failures) - 40} more")
    print(f"logs: {args.logs}/")
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0


def _exists(path):
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
