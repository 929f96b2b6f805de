"""PyTorch side of bench/benches/sampling.rs: the usual torch sampling code at the same
shapes (f32 logits, batch 1/16/64/256 x vocab 32000/128256), printed as a table.

    python3 torch_sampling.py [FILTER] [--md OUT.md]

What a user writes in plain torch (Hugging Face's warpers, eager):
  greedy            torch.argmax
  top_k50           torch.topk -> softmax -> multinomial -> gather
  top_p0.9          sort -> softmax -> cumsum -> mask -> softmax -> multinomial -> gather
  top_k50_top_p0.9  top-k mask on the row (kth value) then the top-p recipe above
Timing: CUDA events around a batch of calls after a warm-up, median of 7 batches (as
compare.py); two input sets alternate, as in the criterion bench. `cases()` yields the same
cases under keys `sampling_<op>|f32|<batch>x<vocab>` (eager only) for compare.py.
"""
import sys

import torch

OPS = ["greedy", "top_k50", "top_p0.9", "top_k50_top_p0.9"]
SHAPES = [(b, v) for v in (32000, 128256) for b in (1, 16, 64, 256)]


def logits(batch, vocab, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    u = torch.rand(4, batch, vocab, device="cuda", generator=g).sum(0)
    x = (u - 2.0) * 4.0
    spike = torch.rand(batch, vocab, device="cuda", generator=g) < 0.002
    return torch.where(spike, x + 8.0, x)


def top_p_filter(x, p):
    sorted_logits, sorted_idx = torch.sort(x, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    cum = probs.cumsum(dim=-1)
    remove = (cum - probs) > p  # keep the smallest prefix reaching p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return sorted_logits, sorted_idx


def make_fn(op, inputs):
    state = {"k": 0}

    def pick():
        state["k"] += 1
        return inputs[state["k"] & 1]

    if op == "greedy":
        return lambda: torch.argmax(pick(), dim=-1)
    if op == "top_k50":
        def f():
            v, i = torch.topk(pick(), 50, dim=-1)
            idx = torch.multinomial(torch.softmax(v, dim=-1), 1)
            return i.gather(-1, idx)
        return f
    if op == "top_p0.9":
        def f():
            sl, si = top_p_filter(pick(), 0.9)
            idx = torch.multinomial(torch.softmax(sl, dim=-1), 1)
            return si.gather(-1, idx)
        return f
    if op == "top_k50_top_p0.9":
        def f():
            x = pick()
            kth = torch.topk(x, 50, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
            sl, si = top_p_filter(x, 0.9)
            idx = torch.multinomial(torch.softmax(sl, dim=-1), 1)
            return si.gather(-1, idx)
        return f
    raise ValueError(op)


def cases():
    for op in OPS:
        for b, v in SHAPES:
            def make(op=op, b=b, v=v):
                inputs = [logits(b, v, 1), logits(b, v, 2)]
                return {"eager": make_fn(op, inputs), "compile": None}
            yield f"sampling_{op}|f32|{b}x{v}", make


def main():
    # The same timing as the side-by-side table (compare.py sits beside this file).
    from compare import time_us

    args = sys.argv[1:]
    md = None
    if "--md" in args:
        i = args.index("--md"); md = args[i + 1]; del args[i:i + 2]
    filt = args[0] if args else ""
    lines = [f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}", "",
             "| op | dtype | shape | torch eager us |", "|---|---|---|---:|"]
    for key, make in cases():
        if filt not in key:
            continue
        fns = make()
        us = time_us(fns["eager"])
        op, dt, shape = key.split("|")
        lines.append(f"| {op} | {dt} | {shape} | {us:.1f} |")
        print(lines[-1], flush=True)
        del fns
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print()
    print(text)
    if md:
        open(md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
