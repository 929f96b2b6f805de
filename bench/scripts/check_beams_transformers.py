#!/usr/bin/env python3
"""Checks `fl generate --num-beams` against Hugging Face transformers' beam search.

Run on the GPU machine (PyTorch + transformers, CUDA), next to check_transformers.py:
    python3 check_beams_transformers.py --fl path/to/fl [--workdir DIR]

For the LLaMA (GQA) and Qwen2 random models of check_transformers.py, in fp32 on both sides
(transformers: eager attention, no TF32; fl: --dtype f32), for several prompts of different
lengths and every combination of early_stopping (True, False, "never"), num_return_sequences
(1, num_beams) and length_penalty (1.0, 0.6, 2.0 over the grid), it runs
`model.generate(num_beams=4, do_sample=False, ...)` and `fl generate --num-beams 4` and
compares the returned hypotheses: the same tokens, and scores (`sequences_scores`) within a
relative 1e-4. The end id is set (in config.json and for transformers) to a token the search
meets: the second most likely first token of the first prompt. Each case prints PASS / FAIL;
the last line is PASS or FAIL over all.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_transformers import build, configs  # noqa: E402

BEAMS = 4
MAX_NEW = 12
TOL = 1e-4


def hf_beams(model, prompt, eos, es, nrs, lp):
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), num_beams=BEAMS, num_return_sequences=nrs,
            early_stopping=es, length_penalty=lp, max_new_tokens=MAX_NEW, do_sample=False,
            eos_token_id=eos, pad_token_id=eos, output_scores=True,
            return_dict_in_generate=True, use_cache=True)
    hyps = []
    for seq, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
        gen = seq[len(prompt):]
        if eos in gen:
            gen = gen[: gen.index(eos) + 1]
        hyps.append((gen, score))
    return hyps


def fl_beams(args, d, prompt, es, nrs, lp):
    es_arg = {True: "true", False: "false", "never": "never"}[es]
    cmd = [args.fl, "generate", "--model", d, "--dtype", "f32", "--prompt-ids",
           ",".join(map(str, prompt)), "--num-beams", str(BEAMS), "--num-return-sequences",
           str(nrs), "--length-penalty", str(lp), "--early-stopping", es_arg,
           "--max-new-tokens", str(MAX_NEW), "--print-ids"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"fl failed: {r.stderr.strip()[-800:]}")
    hyps = []
    for line in r.stdout.strip().splitlines():
        score, ids = line.split("\t")
        hyps.append(([int(t) for t in ids.split(",") if t], float(score)))
    return hyps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fl", required=True)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    root = args.workdir or tempfile.mkdtemp(prefix="fl-beams-")
    ok_all = True
    g = torch.Generator().manual_seed(5)
    for name, cfg in configs():
        if name.startswith("llama3"):
            continue  # rope scaling and tied embeddings are covered by check_transformers.py
        model, d = build(name, cfg, root)
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
                   for n in (5, 17, 33)]
        with torch.no_grad():
            first = model(torch.tensor([prompts[0]], device="cuda")).logits[0, -1]
        eos = int(first.topk(2).indices[1])
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        c["eos_token_id"] = eos
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
        n = 0
        for pi, p in enumerate(prompts):
            for es in (True, False, "never"):
                for nrs in (1, BEAMS):
                    lp = (1.0, 0.6, 2.0)[n % 3]
                    n += 1
                    want = hf_beams(model, p, eos, es, nrs, lp)
                    try:
                        got = fl_beams(args, d, p, es, nrs, lp)
                    except RuntimeError as e:
                        print(f"FAIL {name} prompt{pi} es={es} nrs={nrs} lp={lp}: {e}")
                        ok_all = False
                        continue
                    same = len(got) == len(want) and all(
                        gt == wt and abs(gs - ws) <= TOL * max(1.0, abs(ws))
                        for (gt, gs), (wt, ws) in zip(got, want))
                    ok_all &= same
                    print(f"{'PASS' if same else 'FAIL'} {name} prompt{pi} (len {len(p)}) "
                          f"early_stopping={es} nrs={nrs} length_penalty={lp}: "
                          f"{len(got)} hypotheses, best {got[0][1] if got else float('nan'):.6f} "
                          f"vs {want[0][1]:.6f}")
                    if not same:
                        print(f"  fl:           {got}\n  transformers: {want}")
    print("PASS" if ok_all else "FAIL")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
