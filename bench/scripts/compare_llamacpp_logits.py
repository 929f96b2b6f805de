#!/usr/bin/env python3
"""fl's logits against llama.cpp's on the same GGUF file, under teacher forcing (issue 33):
`fl logits` runs a ragged batch; llama.cpp (bench/llamacpp/dump_logits) runs each sequence
alone over the same tokens; per step, the top-1 agreement and the relative L2 of the logits.

    fl logits --model F.gguf --input in.json --out fl.json
    python3 bench/scripts/compare_llamacpp_logits.py --gguf F.gguf --input in.json --fl fl.json \\
        --dump-logits LLAMA/bin/dump_logits [--ngl 99]

in.json is `fl logits`' input ({"prompts", "forced" (optional), "steps"}); without "forced", the
tokens fl chose (fl.json's "tokens") are forced on llama.cpp, so both see the same sequences.
`--make-input N_PROMPTS` writes a ragged input instead (prompt lengths 1-129, random ids below
the vocabulary, 8 forced steps) to --input and exits. Prints a line per step and a summary;
exit status 1 when top-1 agreement is below 100%. Needs numpy.

How far apart two correct engines may be depends on the model: random weights have small
top-1 margins, and a deep random network carries rounding differences forward. So the F16 file
is the control (the same function in both engines: rel L2 at rounding level), and a quantised
file is judged beside its quantisation's own effect on each engine: `--save-ref R.npy` keeps
llama.cpp's logits of a run; `--vs-f16 FL_F16.json REF_F16.npy` (the F16 file's fl output and
saved llama.cpp logits, same input) adds a line "quantisation" with fl against fl on F16 and
llama.cpp against llama.cpp on F16: an fl-llama.cpp gap well below both is rounding, one of
their size is a different function.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf")
    ap.add_argument("--input", required=True)
    ap.add_argument("--fl")
    ap.add_argument("--dump-logits")
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--make-input", type=int, metavar="N_PROMPTS")
    ap.add_argument("--vocab", type=int, default=32000, help="with --make-input")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-ref", metavar="NPY", help="save llama.cpp's logits here")
    ap.add_argument("--vs-f16", nargs=2, metavar=("FL_F16_JSON", "REF_F16_NPY"),
                    help="fl's output and llama.cpp's saved logits on the F16 file (same input)")
    args = ap.parse_args()
    if args.make_input:
        r = random.Random(args.seed)
        lens = [1 + (i * 37) % 129 for i in range(args.make_input)]
        steps = 8
        v = {"prompts": [[r.randrange(3, args.vocab) for _ in range(n)] for n in lens],
             "forced": [[r.randrange(3, args.vocab) for _ in range(steps + 1)] for _ in lens],
             "steps": steps}
        json.dump(v, open(args.input, "w"))
        print(f"compare_llamacpp_logits: {args.input}: {len(lens)} prompts of {min(lens)}-{max(lens)} tokens, {steps} steps")
        return 0
    import numpy as np

    inp = json.load(open(args.input))
    fl = json.load(open(args.fl))
    steps = int(inp.get("steps", 0))
    prompts = inp["prompts"]
    forced = inp.get("forced") or fl["tokens"]

    def rows(out):
        """fl's logits per prompt: prefill (after the prompt), then step k fed token k - 1, as
        one [prompts, steps + 1, vocab] f64 array."""
        r = [[out["prefill"][p]] + [out["steps"][k][p] for k in range(steps)] for p in range(len(prompts))]
        return np.asarray(r, dtype=np.float64)

    def compare(a, b):
        """Per prompt and position: whether a's top-1 is b's, and a's relative L2 from b."""
        top = np.argmax(a, axis=-1) == np.argmax(b, axis=-1)
        l2 = np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1), 1e-30)
        return top, l2

    fl_rows = rows(fl)
    with tempfile.TemporaryDirectory() as d:
        txt, out = os.path.join(d, "in.txt"), os.path.join(d, "out.bin")
        with open(txt, "w") as f:
            for p, pr in enumerate(prompts):
                seq = list(pr) + list(forced[p][:steps])
                f.write(f"{steps + 1} " + " ".join(map(str, seq)) + "\n")
        subprocess.run([args.dump_logits, args.gguf, txt, out, str(args.ngl)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ref = np.fromfile(out, dtype="<f4")
    vocab = fl_rows.shape[-1]
    ref = ref.reshape(len(prompts), steps + 1, vocab)
    if args.save_ref:
        np.save(args.save_ref, ref)
    ref = ref.astype(np.float64)
    top, l2 = compare(fl_rows, ref)
    for k in range(steps + 1):
        print(f"step {k}: top-1 {int(top[:, k].sum())}/{len(prompts)}, "
              f"rel L2 max {l2[:, k].max():.3e} mean {l2[:, k].mean():.3e}")
    agree, total = int(top.sum()), top.size
    print(f"summary: top-1 agreement {agree}/{total} ({100.0 * agree / total:.2f}%), "
          f"rel L2 max {l2.max():.3e}, {len(prompts)} prompts x {steps + 1} positions, vocab {vocab}")
    if args.vs_f16:
        fl16 = rows(json.load(open(args.vs_f16[0])))
        ref16 = np.load(args.vs_f16[1]).astype(np.float64)
        parts = []
        for name, a, b in (("fl vs fl F16", fl_rows, fl16), ("llama.cpp vs llama.cpp F16", ref, ref16),
                           ("fl vs llama.cpp", fl_rows, ref)):
            t1, d = compare(a, b)
            parts.append(f"{name}: top-1 {int(t1.sum())}/{total}, rel L2 mean {d.mean():.3e} max {d.max():.3e}")
        print("quantisation: " + "; ".join(parts))
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
