#!/usr/bin/env python3
"""Event model of the sm90 MLA wide kernel's consumers on the two-tile ring (docs/perf-notes-mla.md,
"Dense consumers that split the tokens"). Clock cycles per 64-token block per CTA in steady state.

The tensor cores are one FIFO (a wgmma group starts when issued and the previous group is done);
each warpgroup is a sequence of steps (issue, wait, ALU work, hand-overs); a tile is refilled R clk
after both warpgroups released it. Numbers: QK^T (64 tokens) `qk`, P V (both column halves) `pv`,
the softmax of 64 tokens on one warpgroup `sm`, a hand-over between warpgroups `ho`.
"""
import argparse


def simulate(design, R, qk=1300, pv=1060, sm=900, ho=300, blocks=40):
    pipe = [0.0]                      # when the tensor FIFO is free
    full = {0: 0.0, 1: 0.0}           # block -> when its tile is full
    rel = {}                          # block -> [release times]

    def tensor(t_issue, dur):
        start = max(t_issue, pipe[0])
        pipe[0] = start + dur
        return pipe[0]

    def release(n, t):
        rel.setdefault(n, []).append(t)
        if len(rel[n]) == 2:
            full[n + 2] = max(rel[n]) + R

    if design == "default":
        # WG0: S(n) on one warpgroup, softmax, hand P over, its P V half; WG1: its P V half after P.
        t0 = t1 = 0.0
        for n in range(blocks):
            t0 = max(t0, full[n])
            s_done = tensor(t0, qk)
            p_at = s_done + sm + ho
            pv0 = tensor(p_at, pv / 2)
            pv1 = tensor(max(p_at, t1), pv / 2)
            t0 = pv0
            t1 = pv1
            release(n, t0)
            release(n, t1)
        return t0 / blocks
    if design == "split-serial":
        # Both warpgroups S over 32 tokens each, max and P exchanged, P V over 64 tokens: no overlap.
        t = 0.0
        for n in range(blocks):
            t = max(t, full[n])
            s_done = tensor(t, qk)
            p_at = s_done + sm / 2 + 2 * ho
            t = tensor(p_at, pv)
            release(n, t)
            release(n, t)
        return t / blocks
    if design == "split-pairs":
        # As kernels/mla/sm90/split_consumer.cuh runs them: blocks in pairs (a, b); S(a), S(b)
        # issued back to back (each warpgroup its 32 tokens: `qk` is both halves); softmax(a) with
        # its two exchanges under S(b); P V(a) issued once S(b) is done; softmax(b) under P V(a);
        # P V(a) waited for, tile a released (refilled under P V(b)); P V(b) issued and waited for,
        # tile b released; the next pair's S(a') issued `gap` clk later.
        gap = 100
        t = 0.0
        for a in range(0, blocks, 2):
            b = a + 1
            t = max(t, full[a])
            sa = tensor(t, qk)
            t = max(t, full[b])
            sb = tensor(t, qk)
            t = max(t, sa) + sm / 2 + 2 * ho     # softmax(a) with its two exchanges
            t = max(t, sb)
            pva = tensor(t, pv)
            t = t + sm / 2 + 2 * ho              # softmax(b) under P V(a)
            t = max(t, pva)
            release(a, t)
            release(a, t)
            t = tensor(t, pv)
            release(b, t)
            release(b, t)
            t += gap
        return t / blocks
    if design == "seesaw2":
        # The notes' order 2 (each warpgroup its own block of a pair, the other's P V first).
        t = [0.0, 0.0]
        m_at = 0.0
        last = 0.0
        for n in range(blocks):
            w = n % 2
            o = 1 - w
            t[w] = max(t[w], full[n])
            s_done = tensor(t[w], qk)
            t[w] = max(s_done, m_at) + sm + ho
            m_at = t[w]
            pv_own = tensor(t[w], pv / 2)
            pv_oth = tensor(max(t[o], t[w]), pv / 2)
            t[w] = pv_own
            t[o] = pv_oth
            release(n, pv_own)
            release(n, pv_oth)
            last = max(pv_own, pv_oth)
        return last / blocks
    raise ValueError(design)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sm", type=float, default=900)
    ap.add_argument("--ho", type=float, default=300)
    ap.add_argument("--qk-split", type=float, default=1300,
                    help="QK^T of both warpgroups' N = 32 halves (more shared-memory reads than N = 64)")
    a = ap.parse_args()
    designs = ["default", "seesaw2", "split-serial", "split-pairs"]
    print("R (clk) | " + " | ".join(designs))
    for R in (0, 500, 1000, 1500, 2000, 3300):
        row = [simulate(d, R, sm=a.sm, ho=a.ho, qk=a.qk_split if d.startswith("split") else 1300)
               for d in designs]
        print(f"{R} | " + " | ".join(f"{x:.0f}" for x in row))
