#!/usr/bin/env python3
"""Checks the engine against Hugging Face transformers on small random LLaMA models.

Run on the GPU machine (PyTorch + transformers, CUDA):
    python3 check_transformers.py --fl path/to/fl [--workdir DIR]

For each config (LLaMA-2 style with GQA; LLaMA-3 style with llama3 rope scaling and tied
embeddings; Qwen2 style with QKV bias) it builds a random LlamaForCausalLM / Qwen2ForCausalLM
with transformers, saves it as safetensors + config.json, and runs `fl logits` on a ragged
batch of prompts in one packed prefill, then 32 teacher-forced decode steps. transformers
runs each prompt alone in fp32 on the same tokens. Compared:
  - last-token logits of every prompt after the prefill: relative L2 < 1e-2;
  - the logits of every decode step under teacher forcing: relative L2 < 1e-2;
  - greedy tokens: the engine's argmax against transformers' fp32 argmax at every step
    (reported; random models have near-tied logits, so this is not a pass criterion in
    half precision).
The last line is `PASS` or `FAIL` with the worst errors.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

STEPS = 32
# Relative L2 of the logits against transformers in fp32. fp16 keeps 11 bits of mantissa, so a
# whole model run in it stays well inside 1e-2; bf16 keeps 8, and the error of every rounding
# of the residual stream adds up over the layers, so its bound is 2e-2.
TOL = {"f16": 1e-2, "bf16": 2e-2}


def configs():
    from transformers import LlamaConfig, Qwen2Config

    base = dict(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
    )
    yield "llama2-gqa", LlamaConfig(**base, rope_theta=10000.0, tie_word_embeddings=False)
    yield "llama3-rope-scaling-tied", LlamaConfig(
        **{**base, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 1,
           "hidden_size": 1024, "intermediate_size": 1024},
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64),
        tie_word_embeddings=True,
    )
    yield "qwen2-bias", Qwen2Config(**{**base, "num_hidden_layers": 2}, rope_theta=1e6,
                                    tie_word_embeddings=False, use_sliding_window=False)


def rel_l2(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm()).item()


def build(name, cfg, root):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    # Spread the logits a little (random init gives nearly flat ones) so argmax is less tied.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.8, 1.2)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.02)
    d = os.path.join(root, name)
    model.save_pretrained(d, safe_serialization=True)
    return model.cuda().eval(), d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fl", required=True)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--dtypes", default="f16,bf16")
    args = ap.parse_args()
    root = args.workdir or tempfile.mkdtemp(prefix="fl-check-")
    gen = torch.Generator().manual_seed(1)
    lens = [1, 7, 33, 64, 129]
    ok = True
    worst = {}
    rows = []
    for name, cfg in configs():
        model, d = build(name, cfg, root)
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lens]
        # transformers fp32: greedy continuation per prompt, and logits along it.
        ref_prefill, ref_steps, forced = [], [], []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p], device="cuda")
                out = model.generate(ids, max_new_tokens=STEPS + 1, do_sample=False,
                                     min_new_tokens=STEPS + 1, pad_token_id=0)
                cont = out[0, len(p):].tolist()
                full = torch.tensor([p + cont[:STEPS]], device="cuda")
                logits = model(full).logits[0].float().cpu()
                ref_prefill.append(logits[len(p) - 1])
                ref_steps.append(logits[len(p):len(p) + STEPS])
                forced.append(cont[:STEPS])
        for dt in args.dtypes.split(","):
            inp = os.path.join(root, f"{name}-in.json")
            outp = os.path.join(root, f"{name}-{dt}-out.json")
            with open(inp, "w") as f:
                json.dump({"prompts": prompts, "forced": forced, "steps": STEPS}, f)
            r = subprocess.run([args.fl, "logits", "--model", d, "--input", inp, "--out", outp,
                                "--dtype", dt], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name} {dt}: fl failed: {r.stderr.strip()}")
                ok = False
                continue
            got = json.load(open(outp))
            e_pre = max(rel_l2(got["prefill"][b], ref_prefill[b]) for b in range(len(prompts)))
            e_step = max(
                rel_l2(got["steps"][s][b], ref_steps[b][s])
                for b in range(len(prompts)) for s in range(STEPS))
            agree = total = 0
            for b in range(len(prompts)):
                # tokens[b][0] is argmax after the prefill, tokens[b][s] after forced step s.
                for s in range(STEPS + 1):
                    ref = ref_prefill[b] if s == 0 else ref_steps[b][s - 1]
                    agree += int(got["tokens"][b][s] == int(ref.argmax()))
                    total += 1
            good = e_pre < TOL[dt] and e_step < TOL[dt]
            ok &= good
            rows.append((name, dt, e_pre, e_step, agree, total, got.get("graph"), good))
    print(f"{'config':<26} {'dtype':<5} {'prefill relL2':>13} {'decode relL2':>12} "
          f"{'argmax agree':>13} {'graph':>5}  result")
    for name, dt, e_pre, e_step, agree, total, graph, good in rows:
        print(f"{name:<26} {dt:<5} {e_pre:>13.2e} {e_step:>12.2e} {agree:>6}/{total:<6} "
              f"{str(graph):>5}  {'ok' if good else 'FAIL'}")
    print(("PASS" if ok and rows else "FAIL") + f": tolerance {TOL} relative L2, "
          f"prompts of {lens} tokens in one ragged batch, {STEPS} teacher-forced steps")
    sys.exit(0 if ok and rows else 1)


if __name__ == "__main__":
    main()
