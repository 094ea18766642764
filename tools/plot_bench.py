#!/usr/bin/env python3
"""KV bandwidth of GQA decode against batch size and sequence length, from deca-bench --json.

    python tools/plot_bench.py bench/results/h200-sweep.json bench/results/h200-sweep.png

One row of panels per KV dtype: KV GB/s against batch (a line per sequence length) and against
sequence length (a line per batch). The device-to-device copy bandwidth deca-bench measured in the
same run is drawn as a horizontal line: the ceiling a memory-bound kernel can approach. Cases with
ragged lengths, errors or skips are left out. Needs matplotlib (not a CI dependency).
"""

import argparse
import json
import sys
from collections import defaultdict


def load_points(cases, match):
    """{kv_dtype: {(batch, seq_len): kv_gbs}} of the uniform-length GQA cases whose name has
    `match` in it (all of them when match is empty)."""
    points = defaultdict(dict)
    for c in cases:
        if c.get("family") != "gqa" or c.get("ragged") or "kv_gbs" not in c:
            continue
        if match and match not in c["name"]:
            continue
        points[c["kv_dtype"]][(c["batch"], c["seq_len"])] = c["kv_gbs"]
    return points


def plot(run, points, png, title):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a GPU machine or in CI
    import matplotlib.pyplot as plt

    dtypes = sorted(points)
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(12, 4.2 * len(dtypes)), squeeze=False)
    copy = run.get("copy_bandwidth_gbs")
    for row, dtype in zip(axes, dtypes):
        pts = points[dtype]
        batches = sorted({b for b, _ in pts})
        lengths = sorted({s for _, s in pts})
        for ax, xs, series, key, xlabel, label in (
            (row[0], batches, lengths, lambda x, s: (x, s), "batch", "seq_len {}"),
            (row[1], lengths, batches, lambda x, b: (b, x), "seq_len (keys per request)",
             "batch {}"),
        ):
            for s in series:
                line = [(x, pts[key(x, s)]) for x in xs if key(x, s) in pts]
                if line:
                    ax.plot(*zip(*line), marker="o", label=label.format(s))
            if copy:
                ax.axhline(copy, color="black", linestyle="--", label=f"D2D copy {copy:.0f} GB/s")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([str(x) for x in xs])
            ax.set_xlabel(xlabel)
            ax.set_ylabel("KV GB/s")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{dtype} KV cache")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    device = run.get("device", {}).get("name", "?")
    commit = str(run.get("git_commit", "?"))[:12]
    fig.suptitle(title or f"deca GQA decode KV bandwidth, {device} (commit {commit})")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", help="deca-bench --json output")
    p.add_argument("png", help="where to write the plot")
    p.add_argument("--match", default=None,
                   help="only cases whose name contains this (default: 'sweep-' when the file has "
                        "sweep cases, else every uniform-length GQA case)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    with open(args.json) as f:
        run = json.load(f)
    cases = run.get("cases", [])
    match = args.match
    if match is None:
        match = "sweep-" if any("sweep-" in c["name"] for c in cases) else ""
    points = load_points(cases, match)
    if not points:
        sys.exit(f"plot_bench: no uniform-length GQA case with a result in {args.json}"
                 + (f" whose name contains '{match}'" if match else ""))
    plot(run, points, args.png, args.title)
    n = sum(len(v) for v in points.values())
    print(f"plot_bench: {n} cases ({', '.join(sorted(points))}) -> {args.png}")


if __name__ == "__main__":
    main()
