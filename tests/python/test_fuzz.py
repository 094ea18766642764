"""Fuzzing every op through the Python API, with crash isolation (fuzz_cases.py has the property).

hypothesis generates case specs here; each runs in a worker process, so a segfault shows up as a
crash and a case that runs past DECA_FUZZ_TIMEOUT seconds as a hang, not as a dead test session.
Budget: DECA_FUZZ_EXAMPLES examples per op (default 200, seeded by DECA_FUZZ_SEED, default 0, so
CI replays the same inputs). tools/fuzz_long.sh runs it for hours with DECA_FUZZ_KEEP_GOING=1:
failures are counted (and the first few printed) instead of stopping the run, and the totals are
written to DECA_FUZZ_REPORT.
"""

import concurrent.futures as cf
import json
import multiprocessing
import os

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import fuzz_cases

EXAMPLES = int(os.environ.get("DECA_FUZZ_EXAMPLES", "200"))
SEED = int(os.environ.get("DECA_FUZZ_SEED", "0"))
TIMEOUT = float(os.environ.get("DECA_FUZZ_TIMEOUT", "30"))
KEEP_GOING = os.environ.get("DECA_FUZZ_KEEP_GOING") == "1"
REPORT = os.environ.get("DECA_FUZZ_REPORT")

COUNTS = {"inputs": 0, "ok": 0, "refused": 0, "crashes": 0, "hangs": 0, "silent": 0,
          "wrong": 0}
FAILURES = []


class Pool:
    """One worker process at a time, replaced when a case kills it or runs too long."""

    def __init__(self):
        self._ctx = multiprocessing.get_context("spawn")
        self._pool = None

    def _fresh(self):
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(1, mp_context=self._ctx)
        return self._pool

    def _discard(self):
        pool, self._pool = self._pool, None
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, spec, timeout=TIMEOUT):
        future = self._fresh().submit(fuzz_cases.worker, spec)
        try:
            return future.result(timeout=timeout)
        except cf.process.BrokenProcessPool:
            self._discard()
            return "crashes", "the worker process died"
        except cf.TimeoutError:
            self._discard()
            return "hangs", f"no result within {timeout} s"

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _write_report():
    if REPORT:
        with open(REPORT + ".tmp", "w") as f:
            json.dump({"counts": COUNTS, "failures": FAILURES[:50]}, f, indent=1)
        os.replace(REPORT + ".tmp", REPORT)


@pytest.fixture(scope="module")
def pool():
    p = Pool()
    yield p
    p.close()
    _write_report()


def specs(op):
    return st.fixed_dictionaries({
        "op": st.just(op),
        "batch": st.integers(0, 3),
        "q_len": st.integers(1, 3),
        "hkv": st.integers(1, 2),
        "group": st.integers(1, 3),
        "d": st.sampled_from([16, 32]),
        "page": st.sampled_from([1, 4, 8]),
        "layout": st.sampled_from(["NHD", "HND"]),
        "kv_dtype": st.sampled_from(["bf16", "fp16", "fp8_e4m3", "int8"]),
        "per_head": st.booleans(),
        "lse": st.booleans(),
        "topk": st.integers(1, 6),
        "mutation": st.sampled_from(fuzz_cases.VALID + fuzz_cases.INVALID),
        "pick": st.integers(0, 7),
        "seed": st.integers(0, 2 ** 32 - 1),
    })


def _check(pool, spec):
    kind, message = pool.run(spec)
    COUNTS["inputs"] += 1
    COUNTS[kind] += 1
    if COUNTS["inputs"] % 1000 == 0:
        _write_report()  # a long run stopped early still leaves its counts
    if kind in ("ok", "refused"):
        return
    FAILURES.append({"kind": kind, "message": message, "spec": spec})
    if not KEEP_GOING:
        pytest.fail(f"{kind}: {message}\nspec: {spec}")


def _fuzz_test(op):
    @seed(SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(spec=specs(op))
    def test(pool, spec):
        _check(pool, spec)

    test.__name__ = f"test_fuzz_{op}"
    return test


for _op in fuzz_cases.OPS:
    globals()[f"test_fuzz_{_op}"] = _fuzz_test(_op)


def test_fuzz_isolates_crashes_and_hangs(pool):
    """The isolation itself: a worker that dies is a crash, one that sleeps is a hang, and the
    next case gets a fresh worker."""
    assert pool.run({"op": "__crash__"}) == ("crashes", "the worker process died")
    assert pool.run({"op": "__hang__"}, timeout=2)[0] == "hangs"
    assert pool.run({"op": "combine", "batch": 1, "q_len": 1, "hkv": 1, "d": 16, "topk": 1,
                     "per_head": False, "lse": True, "mutation": "none", "pick": 0,
                     "seed": 1})[0] == "ok"
