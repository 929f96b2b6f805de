#!/usr/bin/env python3
"""Side-by-side table: our kernels (the `optable` binary) against PyTorch on the same GPU,
in the same run, joined on `op|dtype|shape`.

    python3 compare.py PATH/TO/optable [FILTER] [--md OUT.md]

Torch cases come from every torch_<family>.py beside this file: each defines
`cases()` yielding (key, make) where make() allocates inputs and returns a dict
{"eager": fn, "compile": fn or None}. Timing: CUDA events around a batch of calls after a
warm-up of >= 25 ms, median of 7 batches, inputs as the user would call them (eager includes Python's
launch overhead, as users see it). Where optable rotates two instances of a case (working set
under 256 MB, so the L2 cache does not serve repeats), the torch side does too: two make()
calls, called in turn (before 2026-11-24 torch always reused one set of inputs).
"""
import glob, importlib.util, json, os, subprocess, sys

import torch
import torch._dynamo

# Every case compiles its own lambdas; keep dynamo from giving up on recompiles.
torch._dynamo.config.recompile_limit = 100000
torch._dynamo.config.cache_size_limit = 100000

HERE = os.path.dirname(os.path.abspath(__file__))


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def time_us(fns):
    """`fns`: one callable, or several called in turn (inputs rotated as optable does)."""
    fns = fns if isinstance(fns, list) else [fns]
    for _ in range(3):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fns[0](); e.record(); e.synchronize()
    probe = max(s.elapsed_time(e), 1e-4)
    iters = int(min(max(2.0 / probe, 5), 2000))

    def batch():  # ms for `iters` calls
        s.record()
        for i in range(iters):
            fns[i % len(fns)]()
        e.record(); e.synchronize()
        return s.elapsed_time(e)

    warm = 0.0  # >= 25 ms before measuring, as optable
    while warm < 25.0:
        warm += max(batch(), 1e-3)
    return median([batch() * 1e3 / iters for _ in range(7)])


def torch_cases(filt):
    for path in sorted(glob.glob(os.path.join(HERE, "torch_*.py"))):
        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if not hasattr(mod, "cases"):  # e.g. torch_generate.py: a script, not an op table
            continue
        for key, make in mod.cases():
            if matches(key, filt):
                yield key, make


def matches(key, filt):
    """`filt`: comma-separated substrings; a key matches any of them (empty: all)."""
    return not filt or any(f and f in key for f in filt.split(","))


def main():
    args = [a for a in sys.argv[1:]]
    md = None
    if "--md" in args:
        i = args.index("--md"); md = args[i + 1]; del args[i:i + 2]
    optable = args[0]
    filt = args[1] if len(args) > 1 else ""
    ours = {}
    proc = subprocess.run([optable, filt], capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr); sys.exit(proc.returncode)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r["key"] == "copy" or matches(r["key"], filt):
                ours[r["key"]] = r
    copy = ours.pop("copy")
    dev = torch.cuda.get_device_name()
    header = [f"GPU: {dev}; torch {torch.__version__}; device copy {copy['gbps']:.0f} GB/s "
              f"(1 GiB, read+write)", "",
              "| op | dtype | shape | fl us | fl GB/s | % of copy | torch eager us | torch.compile us | speed-up vs best torch |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(header), flush=True)
    lines = list(header)
    torch_makers = dict(torch_cases(filt))
    worst = None
    for key, r in ours.items():
        op, dt, shape = key.split("|")
        if "error" in r:
            row = f"| {op} | {dt} | {shape} | error: {r['error']} | | | | | |"
            print(row, flush=True); lines.append(row); continue
        t = {}
        make = torch_makers.get(key)
        if make is not None:
            try:
                # Two instances when optable used two (working set under 256 MB), called in
                # turn, so the L2 cache serves repeats on neither side.
                sets = [make() for _ in range(2 if r.get("bytes", 1 << 40) < (256 << 20) else 1)]
                t["eager"] = time_us([f["eager"] for f in sets])
                if sets[0].get("compile") is not None:
                    try:
                        t["compile"] = time_us([f["compile"] for f in sets])
                    except Exception as ex:  # report, don't hide
                        t["compile_error"] = str(ex).splitlines()[0][:60]
                del sets
            except Exception as ex:
                t["error"] = str(ex).splitlines()[0][:60]
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        eager, comp = t.get("eager"), t.get("compile")
        best = min([x for x in (eager, comp) if x is not None], default=None)
        ratio = best / r["us"] if best else None
        if ratio is not None and (worst is None or ratio < worst[0]):
            worst = (ratio, key)
        fe = f"{eager:.1f}" if eager is not None else t.get("error", "-")
        fc = f"{comp:.1f}" if comp is not None else t.get("compile_error", "-")
        row = (f"| {op} | {dt} | {shape} | {r['us']:.1f} | {r['gbps']:.0f} | {r['pct_copy']:.0f}% | "
               f"{fe} | {fc} | {('%.2fx' % ratio) if ratio else '-'} |")
        print(row, flush=True); lines.append(row)
        if md:
            open(md, "w").write("\n".join(lines) + "\n")
    if worst:
        tail = f"lowest speed-up vs torch: {worst[0]:.2f}x ({worst[1]})"
        print("\n" + tail); lines += ["", tail]
    if md:
        open(md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
