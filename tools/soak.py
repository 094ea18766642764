#!/usr/bin/env python3
"""Soak: random plan / run calls of every op on the GPU for a while, with device and host memory
watched, results compared with the CPU reference now and then, and faults injected.

    python tools/soak.py --seconds 1200 [--seed 1] [--json FILE] [--configs 24]

On a GPU machine with torch and deca installed. A fixed pool of call shapes is drawn from the seed
(GQA over bf16 / fp8 / int8 caches with q_len 1..4, windows, LSE, checked or not; sparse MLA;
dense MLA over bf16 and the 656-byte cache); each iteration picks one and runs it one of three
ways: its plan (made once, with a workspace of its own), the plan-less one-off call, or the
engines' compat call, on fresh random lengths, page tables and indices. Every --verify-every-th
call of a shape is also run on the CPU reference from the same inputs (bf16 outputs compared by
relative RMS, LSE by absolute error); every --fault-every-th call runs with a workspace one byte
short and must raise deca.Error with the output left as it was (NaN-poisoned before).

Memory: every 2 s the device memory in use (cudaMemGetInfo: total - free), torch's reserved
bytes and the process's resident host memory are sampled. The first --warmup-s seconds (every
shape planned and compiled by then) set the baseline; the soak passes when neither the device
memory in use nor the host RSS grew by more than --max-growth-mib after it, and no call failed,
mismatched or let a fault through. Prints a summary, writes the samples and counts to --json,
exits 1 on a failure.
"""

import argparse
import json
import math
import os
import sys
import time

import ml_dtypes
import numpy as np
import torch

import deca
import deca.compat

DEV = "cuda"
BF16 = ml_dtypes.bfloat16
TORCH = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def device_used_mib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2 ** 20


def to_numpy(t):
    """A CUDA tensor's bits as numpy (ml_dtypes for bf16 / fp8)."""
    c = t.detach().cpu()
    if c.dtype == torch.bfloat16:
        return c.view(torch.int16).numpy().view(BF16)
    if c.dtype == torch.float8_e4m3fn:
        return c.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return c.numpy()


def rel_rms(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    if not np.array_equal(fin, np.isfinite(got)):
        return math.inf
    den = math.sqrt(float(np.mean(want[fin] ** 2))) if fin.any() else 0.0
    err = math.sqrt(float(np.mean((got[fin] - want[fin]) ** 2))) if fin.any() else 0.0
    return err / den if den > 0 else err


def paged(rng, lens, page, max_pages):
    """A shuffled page table [batch, max_pages] covering `lens` tokens per request."""
    need = [max(1, -(-int(n) // page)) for n in lens]
    ids = rng.permutation(max_pages * len(lens))[:sum(need)]
    table = np.zeros((len(lens), max_pages), np.int32)
    at = 0
    for b, k in enumerate(need):
        table[b, :k] = ids[at:at + k]
        at += k
    return table


class Gqa:
    """One GQA call shape: its plan, workspace and cache."""

    def __init__(self, rng):
        self.hq, self.hkv = [(8, 1), (32, 8), (64, 8), (12, 4), (7, 7)][rng.integers(5)]
        self.d = int(rng.choice([64, 128, 256]))
        self.page = int(rng.choice([16, 32, 64]))
        self.kv = str(rng.choice(["bf16", "fp8_e4m3", "int8"]))
        self.q_len = int(rng.choice([1, 1, 2, 4]))
        self.batch = int(rng.integers(1, 17))
        self.max_len = int(rng.choice([256, 1024, 4096]))
        self.window = int(rng.choice([0, 0, 100]))
        self.lse = bool(rng.integers(2))
        self.checked = bool(rng.integers(2))
        self.max_pages = -(-self.max_len // self.page)
        self.plan = deca.GqaPlan(self.hq, self.hkv, self.d, self.page, max_seq_len=self.max_len,
                                 kv_dtype=self.kv, max_batch=self.batch, max_q_len=self.q_len,
                                 lse=self.lse, window=self.window, checked=self.checked,
                                 device=DEV)
        self.ws = torch.zeros(self.plan.workspace_bytes, dtype=torch.uint8, device=DEV)
        pages = self.max_pages * self.batch
        shape = (pages, self.page, self.hkv, self.d)
        if self.kv == "bf16":
            self.k = torch.randn(shape, device=DEV).to(torch.bfloat16)
            self.v = torch.randn(shape, device=DEV).to(torch.bfloat16)
        elif self.kv == "int8":
            self.k = torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV)
            self.v = torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV)
        else:
            self.k = (torch.randn(shape, device=DEV) * 4).to(torch.float8_e4m3fn)
            self.v = (torch.randn(shape, device=DEV) * 4).to(torch.float8_e4m3fn)
        self.scale = 1.0 if self.kv == "bf16" else (0.25 if self.kv == "fp8_e4m3" else 0.02)

    def name(self):
        return (f"gqa {self.hq}/{self.hkv} d{self.d} p{self.page} {self.kv} q{self.q_len} "
                f"b{self.batch} w{self.window}{' chk' if self.checked else ''}")

    def draw(self, rng):
        b = int(rng.integers(1, self.batch + 1))
        lens = rng.integers(self.q_len, self.max_len + 1, b).astype(np.int32)
        table = paged(rng, lens, self.page, self.max_pages)
        q = torch.randn((b, self.q_len, self.hq, self.d), device=DEV).to(torch.bfloat16)
        return q, torch.from_numpy(table).to(DEV), torch.from_numpy(lens).to(DEV)

    def run(self, how, args, out, lse, ws=None):
        q, table, lens = args
        s = self.scale
        if how == "plan":
            self.plan.run(q, self.k, self.v, table, lens, out, workspace=self.ws if ws is None else ws,
                          lse=lse if self.lse else None, k_scale=s, v_scale=s)
        elif how == "oneoff":
            deca.gqa_decode(q, self.k, self.v, table, lens, out, k_scale=s, v_scale=s,
                            window=self.window, lse=lse if self.lse else None,
                            max_seq_len=self.max_len)
        else:
            deca.compat.flash_attn_with_kvcache(
                q, self.k, self.v, cache_seqlens=lens, block_table=table, causal=True,
                window_size=(self.window - 1 if self.window else -1, 0), out=out,
                k_descale=s if self.kv != "bf16" else None,
                v_descale=s if self.kv != "bf16" else None)

    def outputs(self, args):
        q = args[0]
        return (torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device=DEV))

    def reference(self, args):
        q, table, lens = (to_numpy(a) for a in args)
        return deca.gqa_decode(q, to_numpy(self.k), to_numpy(self.v), table, lens,
                               k_scale=self.scale, v_scale=self.scale, window=self.window,
                               return_lse=True, max_seq_len=self.max_len)


class Mla:
    """One MLA call shape (sparse over the 656-byte cache, or dense)."""

    def __init__(self, rng, sparse):
        self.sparse = sparse
        self.heads = int(rng.choice([16, 24, 64, 128]))
        self.page = 64
        self.q_len = int(rng.choice([1, 2]))
        self.batch = int(rng.integers(1, 9))
        self.blocks = 64
        self.fmt = "fp8_sparse" if self.sparse else str(rng.choice(["bf16", "fp8_sparse"]))
        self.topk = int(rng.choice([64, 128, 512])) if self.sparse else 0
        self.max_len = (self.blocks // self.batch) * self.page
        kv = (np.random.default_rng(int(rng.integers(1 << 30))).standard_normal(
            (self.blocks, self.page, 1, 576)) * 0.5).astype(BF16)
        self.kv_np = kv if self.fmt == "bf16" else deca.pack_mla_fp8(kv)
        self.kv = (torch.from_numpy(kv.view(np.int16)).view(torch.bfloat16).to(DEV)
                   if self.fmt == "bf16" else torch.from_numpy(self.kv_np).to(DEV))
        self.plan = deca.MlaPlan(self.heads, sparse=self.sparse, kv_format=self.fmt,
                                 page_size=self.page, max_batch=self.batch,
                                 max_q_len=self.q_len, topk=self.topk,
                                 max_seq_len=0 if self.sparse else self.max_len, device=DEV)
        self.ws = torch.zeros(self.plan.workspace_bytes, dtype=torch.uint8, device=DEV)

    def name(self):
        kind = f"sparse topk{self.topk}" if self.sparse else f"dense {self.fmt}"
        return f"mla {kind} h{self.heads} q{self.q_len} b{self.batch}"

    def draw(self, rng):
        b = int(rng.integers(1, self.batch + 1))
        q = (torch.randn((b, self.q_len, self.heads, 576), device=DEV) * 0.5).to(torch.bfloat16)
        if self.sparse:
            idx = rng.integers(-1, self.blocks * self.page, (b, self.q_len, self.topk))
            return q, torch.from_numpy(idx.astype(np.int32)).to(DEV)
        lens = rng.integers(self.q_len, self.max_len + 1, b).astype(np.int32)
        table = paged(rng, lens, self.page, self.blocks // self.batch)
        return q, torch.from_numpy(table).to(DEV), torch.from_numpy(lens).to(DEV)

    def outputs(self, args):
        q = args[0]
        return (torch.empty(q.shape[:3] + (512,), dtype=torch.bfloat16, device=DEV),
                torch.empty(q.shape[:3], dtype=torch.float32, device=DEV))

    def run(self, how, args, out, lse, ws=None):
        ws = self.ws if ws is None else ws
        if self.sparse:
            q, idx = args
            if how == "plan":
                self.plan.run_sparse(q, self.kv, idx, out, lse=lse, workspace=ws)
            elif how == "oneoff":
                deca.mla_decode_sparse(q, self.kv, idx, out, lse=lse)
            else:
                o, _ = deca.compat.flash_mla_with_kvcache(q, self.kv, None, None, 512, None,
                                                          is_fp8_kvcache=True, indices=idx)
                out.copy_(o)
            return
        q, table, lens = args
        if how == "plan":
            self.plan.run_dense(q, self.kv, table, lens, out, lse=lse, workspace=ws)
        elif how == "oneoff":
            deca.mla_decode_dense(q, self.kv, table, lens, out, lse=lse,
                                  kv_format=self.fmt, max_seq_len=self.max_len)
        else:
            o, _ = deca.compat.flash_mla_with_kvcache(q, self.kv, table, lens, 512, None,
                                                      causal=True,
                                                      is_fp8_kvcache=self.fmt != "bf16")
            out.copy_(o)

    def reference(self, args):
        a = [to_numpy(x) for x in args]
        if self.sparse:
            return deca.mla_decode_sparse(a[0], self.kv_np, a[1], return_lse=True)
        return deca.mla_decode_dense(a[0], self.kv_np, a[1], a[2], kv_format=self.fmt,
                                     return_lse=True, max_seq_len=self.max_len)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--configs", type=int, default=24)
    ap.add_argument("--verify-every", type=int, default=25)
    ap.add_argument("--fault-every", type=int, default=97)
    ap.add_argument("--warmup-s", type=float, default=None)
    ap.add_argument("--max-growth-mib", type=float, default=64.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    warmup = args.warmup_s if args.warmup_s is not None else min(120.0, args.seconds / 5)
    t0 = time.time()
    # Two GQA shapes for each MLA one, the MLA ones sparse and dense in turn.
    pool = [Gqa(rng) if i % 3 else Mla(rng, sparse=(i // 3) % 2 == 0) for i in range(args.configs)]
    counts = {"calls": 0, "verified": 0, "faults": 0, "errors": 0, "mismatches": 0,
              "faults_missed": 0}
    worst = {}
    failures = []
    samples = []
    next_sample = 0.0
    hows = ("plan", "plan", "oneoff", "compat")
    per_shape = [0] * len(pool)
    while True:
        now = time.time() - t0
        if now >= next_sample:
            torch.cuda.synchronize()
            samples.append((round(now, 1), round(device_used_mib(), 1),
                            round(torch.cuda.memory_reserved() / 2 ** 20, 1), round(rss_mib(), 1)))
            next_sample = now + 2.0
        if now >= args.seconds:
            break
        i = int(rng.integers(len(pool)))
        c = pool[i]
        per_shape[i] += 1
        draw = c.draw(rng)
        out, lse = c.outputs(draw)
        how = hows[int(rng.integers(len(hows)))]
        counts["calls"] += 1
        try:
            if per_shape[i] % args.fault_every == 0 and c.ws.numel() > 0:
                counts["faults"] += 1
                out.fill_(float("nan"))
                try:
                    c.run("plan", draw, out, lse, ws=c.ws[:-1])
                    counts["faults_missed"] += 1
                    failures.append(f"{c.name()}: a workspace one byte short ran")
                except deca.Error:
                    torch.cuda.synchronize()
                    if not torch.isnan(out.float()).all():
                        counts["faults_missed"] += 1
                        failures.append(f"{c.name()}: refused run wrote its output")
                continue
            c.run(how, draw, out, lse)
            if per_shape[i] % args.verify_every == 1:
                want, want_lse = c.reference(draw)
                torch.cuda.synchronize()
                err = rel_rms(to_numpy(out).astype(np.float64), want.astype(np.float64))
                counts["verified"] += 1
                worst[c.name()] = max(worst.get(c.name(), 0.0), err)
                if err > 0.02:
                    counts["mismatches"] += 1
                    failures.append(f"{c.name()} via {how}: relative RMS {err:.4f}")
            elif counts["calls"] % 64 == 0:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 -- every failure is counted and reported
            counts["errors"] += 1
            failures.append(f"{c.name()} via {how}: {type(e).__name__}: {e}")
    base = [s for s in samples if s[0] >= warmup][:1] or samples[-1:]
    last = samples[-1]
    growth = {"device_used_mib": last[1] - base[0][1], "torch_reserved_mib": last[2] - base[0][2],
              "host_rss_mib": last[3] - base[0][3]}
    flat = growth["device_used_mib"] <= args.max_growth_mib and \
        growth["host_rss_mib"] <= args.max_growth_mib
    ok = flat and not failures
    print(f"soak: {args.seconds:.0f} s, seed {args.seed}, {len(pool)} shapes, "
          f"{counts['calls']} calls ({counts['verified']} verified against the CPU reference, "
          f"{counts['faults']} short-workspace faults), errors {counts['errors']}, mismatches "
          f"{counts['mismatches']}, faults let through {counts['faults_missed']}")
    print(f"memory after the {warmup:.0f} s warm-up: device in use {base[0][1]:.0f} -> "
          f"{last[1]:.0f} MiB, host RSS {base[0][3]:.0f} -> {last[3]:.0f} MiB "
          f"({'flat' if flat else 'GREW'}; limit {args.max_growth_mib:.0f} MiB)")
    print("worst relative RMS per shape: " +
          ", ".join(f"{k}: {v:.4f}" for k, v in sorted(worst.items())))
    for f in failures[:20]:
        print("FAIL", f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": args.seconds, "seed": args.seed, "deca": deca.version(),
                       "commit": os.environ.get("DECA_GIT_COMMIT", ""),
                       "device": torch.cuda.get_device_name(), "shapes": [c.name() for c in pool],
                       "counts": counts, "growth": growth, "flat": flat, "worst": worst,
                       "failures": failures, "samples_t_dev_reserved_rss": samples}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
