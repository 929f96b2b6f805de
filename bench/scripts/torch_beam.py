"""PyTorch side of bench/benches/beam.rs: one beam-search step as transformers writes it, at
the same shapes (4 beams x vocab 128256, batch 1 and 64, f32 and f16 logits), printed as a
table.

    python3 torch_beam.py [FILTER] [--md OUT.md]

The step (transformers' _beam_search): scores = log_softmax(logits.float(), -1) +
beam_scores[:, None]; scores.view(batch, beams * vocab).topk(2 * beams) -> candidate scores
and flat ids (beam * vocab + token), what fl_sampling::beam_topk returns.
Timing: CUDA events around a batch of calls after a warm-up, median of 7 batches (compare.py's
time_us); two input sets alternate, as in the criterion bench. Three columns: eager, eager
captured in a CUDA graph (one graph per input set, replayed in turn: launch overhead gone, as
an engine that graphs its decode step would run it) and torch.compile. `cases()` yields the
eager and compiled cases under keys `beam_topk|<dtype>|<batch>x4x128256` for compare.py.
"""
import sys

import torch

BEAMS = 4
VOCAB = 128256
KEEP = 2 * BEAMS
DT = {"f32": torch.float32, "f16": torch.float16}
SHAPES = [(dt, b) for dt in ("f32", "f16") for b in (1, 64)]


def logits(batch, dt, seed):
    """LM-like logits, the recipe of the criterion bench: ~normal, one token in 500 raised by 8."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = batch * BEAMS
    u = torch.rand(4, rows, VOCAB, device="cuda", generator=g).sum(0)
    x = (u - 2.0) * 4.0
    spike = torch.rand(rows, VOCAB, device="cuda", generator=g) < 0.002
    return torch.where(spike, x + 8.0, x).to(DT[dt])


def inputs(batch, dt, seed):
    x = logits(batch, dt, seed)
    bs = -0.25 * (torch.arange(batch * BEAMS, device="cuda") % BEAMS).float()
    return x, bs


def step(x, bs, batch):
    scores = torch.log_softmax(x.float(), dim=-1) + bs[:, None]
    return scores.view(batch, BEAMS * VOCAB).topk(KEEP, dim=-1)


def make_fn(batch, dt, seed):
    x, bs = inputs(batch, dt, seed)
    return lambda: step(x, bs, batch)


def make_graph(batch, dt, seed):
    x, bs = inputs(batch, dt, seed)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture (allocator, cuBLAS-free ops)
        for _ in range(3):
            step(x, bs, batch)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(x, bs, batch)
    return lambda: (graph.replay(), out)[1]


def alternating(batch, dt, fn=step):
    """One callable over two input sets, called in turn (as the criterion bench does)."""
    sets = [inputs(batch, dt, 1), inputs(batch, dt, 2)]
    k = [0]

    def f():
        k[0] += 1
        x, bs = sets[k[0] & 1]
        return fn(x, bs, batch)
    return f


def cases():
    for dt, b in SHAPES:
        def make(dt=dt, b=b):
            return {"eager": alternating(b, dt), "compile": alternating(b, dt, torch.compile(step))}
        yield f"beam_topk|{dt}|{b}x{BEAMS}x{VOCAB}", make


def check():
    """The graph replays compute what eager does (ids and scores)."""
    g = make_graph(1, "f32", 1)
    e = make_fn(1, "f32", 1)
    (gs, gi), (es, ei) = g(), e()
    torch.cuda.synchronize()
    assert torch.equal(gi, ei) and torch.allclose(gs, es), "graph replay differs from eager"


def main():
    from compare import time_us

    args = sys.argv[1:]
    md = None
    if "--md" in args:
        i = args.index("--md"); md = args[i + 1]; del args[i:i + 2]
    filt = args[0] if args else ""
    check()
    lines = [f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}", "",
             "| op | dtype | shape | torch eager us | torch eager + CUDA graph us | torch.compile us |",
             "|---|---|---|---:|---:|---:|"]
    for dt, b in SHAPES:
        key = f"beam_topk|{dt}|{b}x{BEAMS}x{VOCAB}"
        if filt not in key:
            continue
        eager = time_us([make_fn(b, dt, 1), make_fn(b, dt, 2)])
        graphed = time_us([make_graph(b, dt, 1), make_graph(b, dt, 2)])
        try:
            comp = f"{time_us(alternating(b, dt, torch.compile(step))):.1f}"
        except Exception as ex:  # report, don't hide
            comp = str(ex).splitlines()[0][:60]
        lines.append(f"| beam_topk | {dt} | {b}x{BEAMS}x{VOCAB} | {eager:.1f} | {graphed:.1f} | {comp} |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print()
    print(text)
    if md:
        open(md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
