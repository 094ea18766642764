#!/usr/bin/env python3
"""Host time per call of deca's Python entry points, against torch.add for scale.

    python tools/py_host_cost.py [--iters N] [--device cuda|cpu] [--json FILE]

On a GPU machine with torch the tensors are CUDA torch tensors (a tiny decode, so the GPU keeps
up and the time measured is the Python + binding + launch cost of each call); without one,
numpy arrays on the CPU backend (the time then includes the CPU reference decode and its
thread start-up, tens of microseconds: compare GqaPlan.run with its checked path there, not with
the GPU target). GqaPlan.run gets raw bf16 bits (uint16) on the CPU, which its fast path takes;
ml_dtypes arrays go through the checked path. Each figure is the median over 7 repeats of the mean of --iters calls in
a loop, without synchronising inside the loop, after at least 0.3 s of warm-up calls.

A second table splits one GqaPlan.run into its stages, each timed alone with the same arguments:
the floor of a nanobind call of the same 18 arguments that does nothing, then the tensor import,
then deca's checks, kernel lookup and params (no launch), then the launch, then the Python
wrapper (defaults, stream lookup). On the CPU those calls get 0-request views, so no attention
is computed and every stage is host cost only.

torch tensors are read through DLPack's C exchange table where torch has one (2.10 and later);
DECA_PY_DLPACK_EXCHANGE=0 reads them through their attributes instead, for comparison.

The plan-less entry points (the compat calls engines make, deca's one-off calls) are timed beside
GqaPlan.run and torch.add: each plans at its first call of a shape and then only looks its plan
up, so a repeated call should cost about what GqaPlan.run costs plus the allocation of its
outputs. Beside each time, "fallbacks" counts the calls whose one-C++-call fast path refused
them and that were retried on the checked path (deca._tensors.FALLBACKS): it must be 0 for a
repeated shape. --clock process times process CPU time instead of wall time (a shared machine).
--profile SUBSTRING (repeatable) runs the cases whose names contain it under cProfile after the
table and prints where their host time goes (the 25 functions with the most time of their own).

On CUDA a second column, "host", times each case with the GPU kept busy: a spin kernel
(torch.cuda._sleep) queued ahead of each batch of 64 calls outlasts the batch, so that the
batch's own kernels wait behind it and the time is the host's alone, as in an engine whose GPU
is busy with the previous layer (not for FlashInfer's plan(), whose copies to the device wait
for the GPU). The first column can only be the larger of the host time and the GPU time of a
call (a loop of calls whose kernels take longer than their launches waits for the launch
queue); where "host" is well below it, the case is bound by its kernels, not its host cost.
Issue 30's targets are host costs.

--python-only (with --device cpu; needs torch) times the Python side alone: torch CPU tensors,
and the per-call C++ decode entry points (deca._C.*_planned_fast) replaced by a no-op, so that
a call costs its Python, its output allocations and deca._C.call_key; the stage table is left
out. It compares Python changes on a machine without a GPU.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import deca
import deca.compat


CLOCK = time.perf_counter


def per_call_us(fn, iters, warm_s=0.3):
    # Warm up for a fixed wall time, not a call count: on the H200 the first case measured after
    # start-up read 13.2 us per GqaPlan.run while the same call measured later (the stage table)
    # read 9.2 us; a few thousand calls (~2 ms) do not bring the GPU and the host's clocks to
    # their steady state.
    t_end = time.perf_counter() + warm_s
    n = 0
    while n < max(iters // 10, 10) or time.perf_counter() < t_end:
        fn()
        n += 1
    runs = []
    for _ in range(7):
        t0 = CLOCK()
        for _ in range(iters):
            fn()
        runs.append((CLOCK() - t0) / iters * 1e6)
    return statistics.median(runs)


BUSY_BATCH = 64  # calls per batch: at most ~200 kernels queued behind the spin kernel, well
# inside the driver's launch queue (a full queue would block the host and time the GPU again)


def host_us(fn, torch, cycles_per_us, wall_us):
    """Host time per call of fn (already warm) with the GPU busy: each of 21 batches of
    BUSY_BATCH calls is queued behind a spin kernel that lasts four times the batch's wall time
    (per_call_us's figure) and at least 2 ms; median of the batches."""
    spin = int(cycles_per_us * max(4 * BUSY_BATCH * wall_us, 2000))
    runs = []
    for _ in range(21):
        torch.cuda._sleep(spin)
        t0 = CLOCK()
        for _ in range(BUSY_BATCH):
            fn()
        runs.append((CLOCK() - t0) / BUSY_BATCH * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def spin_rate(torch):
    """GPU clock cycles per microsecond of torch.cuda._sleep, measured with CUDA events."""
    cycles = 20_000_000
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    torch.cuda._sleep(cycles // 10)  # wakes the clocks up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


def inputs(device, torch):
    batch, hq, hkv, d, page, pages = 1, 8, 1, 128, 16, 4
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, 1, hq, d)).astype(np.float32)
    k = rng.standard_normal((pages, page, hkv, d)).astype(np.float32)
    table = np.arange(pages, dtype=np.int32).reshape(1, pages)
    lens = np.array([17], np.int32)
    if torch is not None:
        bf = dict(dtype=torch.bfloat16, device=device)
        return (torch.from_numpy(q).to(**bf), torch.from_numpy(k).to(**bf),
                torch.from_numpy(k).to(**bf), torch.from_numpy(table).to(device),
                torch.from_numpy(lens).to(device))
    import ml_dtypes
    qb, kb = q.astype(ml_dtypes.bfloat16), k.astype(ml_dtypes.bfloat16)
    return qb, kb, kb.copy(), table, lens


def mla_inputs(device, torch, rng):
    """q, kv cache (4 pages of 64 tokens, scales 2^-7), indices, out, lse of a sparse MLA call
    with torch tensors (None without torch)."""
    if torch is None:
        return None
    dev = "cuda" if device == "cuda" else "cpu"
    kv = rng.integers(0, 0x70, (4, 64, 1, 656)).astype(np.uint8)
    kv.reshape(-1, 656)[:, 512:528] = np.tile(np.array([0x3c, 0, 0, 0], np.uint8), 4)
    q = torch.from_numpy(rng.standard_normal((1, 1, 64, 576)).astype(np.float32))
    idx = torch.from_numpy(rng.integers(0, 256, (1, 1, 64)).astype(np.int32))
    return (q.to(dev).to(torch.bfloat16), torch.from_numpy(kv).to(dev), idx.to(dev),
            torch.empty(1, 1, 64, 512, dtype=torch.bfloat16, device=dev),
            torch.empty(1, 1, 64, dtype=torch.float32, device=dev))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--json", default=None)
    ap.add_argument("--clock", choices=["wall", "process"], default="wall")
    ap.add_argument("--profile", action="append", default=[])
    ap.add_argument("--python-only", action="store_true")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    torch = None
    try:
        import torch  # noqa: F811
    except ImportError:
        pass
    device = args.device
    if device == "auto":
        device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if device == "cuda" and (torch is None or not torch.cuda.is_available()):
        sys.exit("py_host_cost: --device cuda needs torch with a CUDA device")
    if args.python_only and (device != "cpu" or torch is None):
        sys.exit("py_host_cost: --python-only needs --device cpu and torch")
    # torch tensors on CUDA, or on the CPU for --python-only; numpy arrays on the CPU otherwise.
    tt = device == "cuda" or args.python_only
    if args.python_only:
        nop = "".format  # a C builtin that takes any arguments and does nothing
        for name in ("gqa_decode_planned_fast", "mla_decode_sparse_planned_fast",
                     "mla_decode_dense_planned_fast"):
            setattr(deca._C, name, nop)

    q, k, v, table, lens = inputs(device, torch if tt else None)
    where = "cuda:0" if device == "cuda" else "cpu"
    plan = deca.GqaPlan(8, 1, 128, 16, max_batch=1, max_seq_len=64, device=where)
    ws = None
    if plan.workspace_bytes:
        ws = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(q) if tt else np.empty_like(q)
    # The plan's own path: raw bits on the CPU (numpy's DLPack has no bf16), tensors on CUDA.
    bits = (lambda x: x) if tt else (lambda x: x.view(np.uint16))
    pq, pk, pv, pout = bits(q), bits(k), bits(v), bits(out)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    cases = {
        "GqaPlan.run": lambda: plan.run(pq, pk, pv, table, lens, pout, workspace=ws),
        "GqaPlan.run (checked path)": lambda: plan._run_checked(
            pq, pk, pv, table, lens, pout, ws, None, None, None, 1.0, 1.0, None, None, None, 1.0,
            plan._current_stream(q)),
        "gqa_decode (one-off, out given)": lambda: deca.gqa_decode(q, k, v, table, lens, out),
        "gqa_decode (one-off)": lambda: deca.gqa_decode(q, k, v, table, lens),
        "deca.compat.flash_attn_with_kvcache": lambda: deca.compat.flash_attn_with_kvcache(
            q, k, v, cache_seqlens=lens, block_table=table, causal=True),
        "deca.compat.flash_attn_with_kvcache (+ lse)": lambda: (
            deca.compat.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table,
                                                causal=True, return_softmax_lse=True)),
    }
    # FlashInfer's plan(): the CSR page list -> deca's page table, once per batch composition.
    from deca.compat import BatchDecodeWithPagedKVCacheWrapper
    crng = np.random.default_rng(1)
    counts = crng.integers(1, 65, 256)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    csr = (indptr, crng.permutation(int(indptr[-1])).astype(np.int32),
           crng.integers(1, 17, 256).astype(np.int32))
    wrapper = BatchDecodeWithPagedKVCacheWrapper(q if tt else np.zeros(16, np.uint8))
    cases["FlashInfer wrapper plan() (batch 256 x 1..64 pages)"] = lambda: wrapper.plan(
        *csr, 8, 1, 128, 16, q_data_type="bfloat16")
    # Its run() on the GQA shape above: plan() once, run() per layer.
    run_wrapper = BatchDecodeWithPagedKVCacheWrapper(q if tt else np.zeros(16, np.uint8))
    run_wrapper.plan(np.array([0, 2], np.int32), np.array([0, 1], np.int32),
                     np.array([1], np.int32), 8, 1, 128, 16, q_data_type="bfloat16")
    # q [batch, heads, dim] made once: the view q[:, 0] per call is the caller's cost, not run()'s.
    q3 = q[:, 0]
    cases["FlashInfer wrapper run()"] = lambda: run_wrapper.run(q3, (k, v))
    # As vLLM calls it: the combined [pages, 2, ...] cache, out given, float KV scales.
    kv = torch.stack([k, v], dim=1) if tt else np.stack([k, v], axis=1)
    fi_out = torch.empty_like(q3) if tt else np.empty_like(q3)
    cases["FlashInfer wrapper run() (combined cache, out=)"] = lambda: run_wrapper.run(
        q3, kv, k_scale=1.0, v_scale=1.0, out=fi_out)
    # Sparse FP8 MLA (batch 1, 64 heads, topk 64: the kernels keep up) through its plan and
    # through FlashMLA's signature; on the CPU the reference decode is in the time.
    mla = mla_inputs(device, torch, rng=np.random.default_rng(2))
    if mla is not None:
        mq, mkv, midx, mout, mlse = mla
        mplan = deca.MlaPlan(64, sparse=True, page_size=64, max_batch=1, max_q_len=1,
                             max_seq_len=4 * 64, topk=64, lse=True, device=where)
        mws = None
        if mplan.workspace_bytes:
            mws = torch.zeros(mplan.workspace_bytes, dtype=torch.uint8, device="cuda")
        cases["MlaPlan.run_sparse (b1 h64 topk64)"] = lambda: mplan.run_sparse(
            mq, mkv, midx, mout, lse=mlse, workspace=mws)
        if mws is not None:
            # What the FlashMLA call with metadata runs after its step's first call: the
            # decode on the schedule left in the workspace (no scheduler launch).
            rws = torch.zeros_like(mws)
            mplan.run_sparse(mq, mkv, midx, mout, lse=mlse, workspace=rws)
            cases["MlaPlan.run_sparse (schedule reused)"] = lambda: mplan.run_sparse(
                mq, mkv, midx, mout, lse=mlse, workspace=rws, reuse_schedule=True)
        meta, _ = deca.compat.get_mla_metadata()
        cases["deca.compat.flash_mla_with_kvcache (same)"] = lambda: deca.compat.flash_mla_with_kvcache(
            mq, mkv, None, None, 512, meta, is_fp8_kvcache=True, indices=midx)
        cases["mla_decode_sparse (one-off, same)"] = lambda: deca.mla_decode_sparse(
            mq, mkv, midx, lse=mlse)
    if torch is not None:
        a = torch.ones(16, device="cuda" if device == "cuda" else "cpu")
        cases["torch.add (scale)"] = lambda: torch.add(a, a)
    if args.python_only:
        del cases["GqaPlan.run (checked path)"]  # the CPU reference decode itself
    results, host = {}, {}
    rate = spin_rate(torch) if device == "cuda" else None
    iters = {"FlashInfer wrapper plan() (batch 256 x 1..64 pages)": max(args.iters // 20, 10)}
    # (An older deca has no fallback counter: the column is then left out.)
    counter = getattr(deca._tensors, "FALLBACKS", None)
    fallbacks = {}
    for name, fn in cases.items():
        fn()
        sync()
        before = sum(counter.values()) if counter is not None else 0
        results[name] = per_call_us(fn, iters.get(name, args.iters))
        sync()
        busy = ""
        if rate is not None and "plan()" not in name:  # plan() copies to the device: it waits
            host[name] = host_us(fn, torch, rate, results[name])
            busy = f"  host {host[name]:8.2f} us/call"
        fallbacks[name] = sum(counter.values()) - before if counter is not None else None
        note = ("" if "checked path" in name or counter is None
                else f"  fallbacks {fallbacks[name]}")
        print(f"{name:52s} {results[name]:8.2f} us/call{busy}{note}")
    stages = None
    if not args.python_only:
        stages = breakdown(device, plan, pq, pk, pv, table, lens, pout, ws, q, args.iters)
    for name, fn in cases.items():
        if any(p in name for p in args.profile):
            profile(name, fn, args.iters, sync)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "deca": deca.version(), "clock": args.clock,
                       "us_per_call": results, "host_us_per_call_gpu_busy": host,
                       "python_only": args.python_only, "fallbacks": fallbacks,
                       "gqa_plan_run_stages_us": stages}, f, indent=1)


def profile(name, fn, iters, sync):
    """Where the host time of `iters` calls of fn goes, by function (own time first)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    sync()
    print(f"\n== profile: {name} ({iters} calls; cProfile's own overhead inflates every line)")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def breakdown(device, plan, pq, pk, pv, table, lens, pout, ws, q, iters):
    """GqaPlan.run split into stages: each line is one call of a probe that stops after that
    stage (deca._C._gqa_fast_*), so the difference between lines is that stage's cost."""
    from deca import _C
    if device == "cpu":
        # 0-request views: the checks run in full, the CPU reference has nothing to compute.
        pq, table, lens, pout = pq[:0], table[:0], lens[:0], pout[:0]
    stream = plan._current_stream(q)
    a = (plan._plan, pq, pk, pv, table, lens, pout, None, None, None, None, None, 1.0, 1.0, 0.0,
         1.0, ws, stream)
    cases = {
        "nanobind floor: same 18 arguments, does nothing": lambda: _C._gqa_fast_nothing(*a),
        "+ import of the 6 tensors": lambda: _C._gqa_fast_import(*a),
        "+ checks, kernel lookup, params (no launch)": lambda: _C._gqa_fast_without_launch(*a),
        "+ launch (_C.gqa_decode_planned_fast)": lambda: _C.gqa_decode_planned_fast(*a),
        "GqaPlan.run (+ Python wrapper, stream lookup)": lambda: plan.run(
            pq, pk, pv, table, lens, pout, workspace=ws),
        "stream lookup alone (GqaPlan._current_stream)": lambda: plan._current_stream(q),
    }
    sync = (__import__("torch").cuda.synchronize if device == "cuda" else (lambda: None))
    print(f"\nGqaPlan.run by stage ({'CUDA tensors' if device == 'cuda' else 'CPU, 0 requests'})")
    stages = {}
    for name, fn in cases.items():
        fn()
        sync()
        stages[name] = per_call_us(fn, iters)
        sync()
        print(f"{name:52s} {stages[name]:8.2f} us/call")
    return stages


if __name__ == "__main__":
    main()
