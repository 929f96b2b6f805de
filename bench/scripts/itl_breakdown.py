#!/usr/bin/env python3
"""Where a serving run's long inter-token gaps come from.

Reads fl_loadgen's --save-result files (one JSON line per request) and, when given, the
server's /metrics scrape taken after the same row, and prints per file:
- ITL p50 / p90 / p99 / max (nearest rank, as fl_loadgen), and the share of gaps over
  2x and 3x the median (p99 <= 2x p50 holds when that share is under 1%);
- how those long gaps sit: per request (how many requests have any) and by position (the
  gap's index within its request: the first few gaps are a new request's, waiting on the
  prefills of the requests admitted after it);
- with --metrics: fl serve's step times by kind (decode-only steps against steps that carry
  prompt tokens), from fl_step_duration_seconds.

    python3 itl_breakdown.py requests-fl-64.jsonl [--metrics metrics-fl-64.txt]
"""
import argparse
import json
import math
import re


def nearest_rank(sorted_xs, q):
    if not sorted_xs:
        return float("nan")
    k = max(1, math.ceil(q / 100.0 * len(sorted_xs)))
    return sorted_xs[min(k, len(sorted_xs)) - 1]


def load_requests(path):
    reqs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                reqs.append(json.loads(line))
    return reqs


def itl_report(reqs):
    gaps = [(i, j, g) for i, r in enumerate(reqs) if r.get("ok") for j, g in enumerate(r.get("itl_ms") or [])]
    xs = sorted(g for _, _, g in gaps)
    if not xs:
        return ["no inter-token gaps (no request streamed two tokens)"]
    p50 = nearest_rank(xs, 50)
    out = [
        f"requests {len(reqs)} (ok {sum(1 for r in reqs if r.get('ok'))}), gaps {len(xs)}",
        "ITL ms p50 %.3f p90 %.3f p99 %.3f max %.3f (p99 / p50 %.2fx)"
        % (p50, nearest_rank(xs, 90), nearest_rank(xs, 99), xs[-1], nearest_rank(xs, 99) / p50),
    ]
    for k in (2, 3):
        long = [(i, j, g) for i, j, g in gaps if g > k * p50]
        who = len({i for i, _, _ in long})
        early = sum(1 for _, j, _ in long if j < 8)
        out.append(
            f"gaps > {k}x p50: {len(long)} ({100.0 * len(long) / len(xs):.2f}% of gaps) in {who} requests; "
            f"{early} of them among a request's first 8 gaps"
        )
    ttft = sorted(r["ttft_ms"] for r in reqs if r.get("ok") and r.get("ttft_ms") is not None)
    if ttft:
        out.append("TTFT ms p50 %.1f p99 %.1f" % (nearest_rank(ttft, 50), nearest_rank(ttft, 99)))
    return out


BUCKET = re.compile(r'^fl_step_duration_seconds_bucket\{kind="(\w+)",le="([^"]+)"\} (\S+)$')
COUNT = re.compile(r'^fl_step_duration_seconds_(sum|count)\{kind="(\w+)"\} (\S+)$')


def step_report(path):
    buckets, totals = {}, {}
    with open(path) as f:
        for line in f:
            m = BUCKET.match(line.strip())
            if m:
                kind, le, v = m.group(1), m.group(2), float(m.group(3))
                buckets.setdefault(kind, []).append((float("inf") if le == "+Inf" else float(le), v))
                continue
            m = COUNT.match(line.strip())
            if m:
                totals[(m.group(2), m.group(1))] = float(m.group(3))
    if not buckets:
        return [f"{path}: no fl_step_duration_seconds (not fl serve, or an older one)"]
    out = []
    for kind, bs in sorted(buckets.items()):
        n = totals.get((kind, "count"), 0.0)
        mean = 1e3 * totals.get((kind, "sum"), 0.0) / n if n else float("nan")
        # The bucket holding the median and the 99th percentile (cumulative counts).
        def at(q):
            for le, c in bs:
                if n and c >= q * n:
                    return "<= %g ms" % (1e3 * le) if le != float("inf") else "> last bucket"
            return "-"
        out.append(f"{kind} steps: {int(n)}, mean {mean:.2f} ms, median {at(0.5)}, p99 {at(0.99)}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requests", nargs="+", help="fl_loadgen --save-result files")
    ap.add_argument("--metrics", action="append", default=[], help="/metrics scrapes (fl serve)")
    a = ap.parse_args()
    for p in a.requests:
        print(f"== {p}")
        for line in itl_report(load_requests(p)):
            print("  " + line)
    for p in a.metrics:
        print(f"== {p}")
        for line in step_report(p):
            print("  " + line)


if __name__ == "__main__":
    main()
