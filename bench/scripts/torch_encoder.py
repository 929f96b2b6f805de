"""PyTorch side of `fl embed-bench`: the same BERT shapes and ragged batches through
transformers' BertModel (random weights) in eager mode with SDPA and under torch.compile,
padded to each batch's longest sequence as a padded framework must.

    python torch_encoder.py --model bert-base --batches 1,32,256 --seqs 128,384 [--json]

Prints one line per (mode, shape): ms per batch and sentences/s; `best` is the faster mode.
Lengths follow fl_engine::encoder::presets::bench_lengths (sequence 0 at the full length, the
others ceil(L * (0.25 + 0.75 * frac(i / phi)))).
"""
import argparse
import json
import math
import time

import torch
from transformers import BertConfig, BertModel

PRESETS = {
    "bert-base": (12, 768, 12, 3072),
    "bge-base": (12, 768, 12, 3072),
    "bert-large": (24, 1024, 16, 4096),
    "bge-small": (12, 384, 12, 1536),
}
INV_PHI = 0.6180339887498949


def bench_lengths(batch, max_len, ragged=True):
    out = []
    for i in range(batch):
        if i == 0 or not ragged:
            out.append(max_len)
        else:
            f = math.fmod(i * INV_PHI, 1.0)
            out.append(min(max_len, max(1, math.ceil(max_len * (0.25 + 0.75 * f)))))
    return out


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base", choices=sorted(PRESETS))
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--seqs", default="128,384")
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    layers, hidden, heads, inter = PRESETS[a.model]
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=inter,
                     max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                     layer_norm_eps=1e-12, attn_implementation="sdpa")
    dt = torch.float16 if a.dtype == "f16" else torch.bfloat16
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=False).to("cuda", dt).eval()
    modes = [("eager-sdpa", model)]
    if not a.no_compile:
        modes.append(("compile", torch.compile(model)))
    for s in [int(x) for x in a.seqs.split(",")]:
        for b in [int(x) for x in a.batches.split(",")]:
            lens = bench_lengths(b, s, not a.full)
            pad = max(lens)
            ids = torch.randint(1, 30522, (b, pad), device="cuda")
            mask = torch.zeros(b, pad, dtype=torch.long, device="cuda")
            for i, l in enumerate(lens):
                mask[i, :l] = 1
            best = None
            for name, m in modes:
                with torch.inference_mode():
                    sec = timed(lambda: m(input_ids=ids, attention_mask=mask), a.iters)
                row = {"impl": name, "model": a.model, "dtype": a.dtype, "batch": b,
                       "max_len": s, "tokens": sum(lens), "padded_tokens": b * pad,
                       "ms": sec * 1e3, "sentences_per_s": b / sec}
                best = row if best is None or row["ms"] < best["ms"] else best
                print(json.dumps(row) if a.json else
                      f"{name:<11} {a.model:<10} {a.dtype} b{b:<4} L{s:<4} {sec*1e3:9.3f} ms "
                      f"{b/sec:10.0f} sent/s")
            print(json.dumps(dict(best, impl="best:" + best["impl"])) if a.json else
                  f"best {a.model:<10} b{b:<4} L{s:<4} {best['ms']:9.3f} ms {b / best['ms'] * 1e3:10.0f} sent/s "
                  f"({best['impl']})")


if __name__ == "__main__":
    main()
