#!/usr/bin/env python3
"""Per-kernel GPU time of the last decode steps of one or two `ncu --csv` runs, side by side:
where a decode step's time goes, and where two ways of running it (the static engine and the
runner) differ.

    ncu --csv --print-units base --metrics gpu__time_duration.sum --clock-control none \\
        --cache-control none fl bench ... > a.csv
    python3 bench/scripts/ncu_steps.py a.csv [b.csv] [--end sample] [--steps 16]

A step ends at a kernel whose name contains --end (the sampler's kernels: the last launch of a
decode step). Kernels are grouped by name (template arguments cut), grid and block; the table
lists GPU microseconds per step and launches per step for each file, largest first, then the
totals. The step's wall time minus its kernels' sum is the time the GPU sat idle between them
(launch gaps, host waits): `fl bench` prints the wall time.
"""

import argparse
import collections
import csv
import sys


def steps(path, end, n):
    """{(kernel, grid, block): (launches, ns)} over the last n steps, and the step count found."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(r["Metric Value"].replace(",", ""))
        rows.append((r["Kernel Name"].split("(")[0].split("<")[0].removeprefix("void ")[:60], r.get("Grid Size", ""),
                     r.get("Block Size", ""), ns))
    # A step's end: the last kernel of a run of --end kernels.
    ends = [i for i, r in enumerate(rows) if end in r[0] and (i + 1 == len(rows) or end not in rows[i + 1][0])]
    if len(ends) < n + 1:
        sys.exit(f"{path}: {len(ends)} step ends ('{end}' kernels), want at least {n + 1}")
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, g, b, ns in rows[ends[-n - 1] + 1 : ends[-1] + 1]:
        a = agg[(name, g, b)]
        a[0] += 1
        a[1] += ns
    return agg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="one or two ncu CSV files")
    ap.add_argument("--end", default="sample", help="substring of the kernel that ends a step")
    ap.add_argument("--steps", type=int, default=16, help="last N steps of each file")
    args = ap.parse_args()
    if len(args.csv) > 2:
        sys.exit("at most two CSV files")
    runs = [steps(p, args.end, args.steps) for p in args.csv]
    n = args.steps
    keys = sorted(set().union(*runs), key=lambda k: -max(r.get(k, [0, 0.0])[1] for r in runs))
    head = " | ".join(f"{p}: us/step (launches)" for p in args.csv)
    print(f"| kernel | grid | block | {head} |")
    print("|---|---|---|" + "---:|" * len(runs))
    for k in keys:
        cells = []
        for r in runs:
            c, ns = r.get(k, [0, 0.0])
            cells.append(f"{ns / n / 1e3:.1f} ({c / n:g})" if c else "-")
        print(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    tot = [sum(v[1] for v in r.values()) / n / 1e3 for r in runs]
    cnt = [sum(v[0] for v in r.values()) / n for r in runs]
    print("| **all kernels** | | | " + " | ".join(f"**{t:.1f}** ({c:g})" for t, c in zip(tot, cnt)) + " |")
    if len(runs) == 2:
        print(f"\nsecond - first: {tot[1] - tot[0]:+.1f} us of kernels per step")


if __name__ == "__main__":
    main()
