#!/usr/bin/env python3
"""transformers' generation speed on the shapes `fl bench` reports, for the side-by-side table.

    python3 torch_generate.py [--preset llama-2-7b] [--runs 1:128:128,16:1024:64,...]
                              [--modes eager,compile] [--json]

Random weights in fp16 (the speed does not depend on the values). For each BATCH:PROMPT:GEN
run: prefill tokens/s (one forward over the batch of prompts, timed alone) and decode
tokens/s (generate with max_new_tokens=min_new_tokens=GEN, minus the prefill time), greedy.
Modes: `eager` (dynamic cache) and `compile` (static cache, torch.compile default mode via
generation_config.cache_implementation="static" and compile_config; reduce-overhead failed
in transformers 5.x on this machine, so the default mode is what is reported). A mode that
fails prints its error and the script goes on.
"""
import argparse
import json
import time

import torch

PRESETS = {
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                       max_position_embeddings=4096, rope_theta=10000.0),
}


def model_for(preset):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**PRESETS[preset], rms_norm_eps=1e-5, tie_word_embeddings=False)
    with torch.device("cuda"):
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg).half().eval()
    return m


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, r


def run(model, mode, batch, prompt, gen):
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, max_new_tokens=gen, min_new_tokens=gen, pad_token_id=0)
    if mode == "compile":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        # Prefill alone: one forward over the prompts (warm once).
        model(ids, attention_mask=mask, logits_to_keep=1)
        t_pre, _ = timed(lambda: model(ids, attention_mask=mask, logits_to_keep=1))
        # Warm-up generate (compiles in `compile` mode), then the measured one.
        model.generate(ids, attention_mask=mask, **{**kw, "max_new_tokens": 4,
                                                   "min_new_tokens": 4})
        if mode == "compile":
            model.generate(ids, attention_mask=mask, **kw)
        t_all, _ = timed(lambda: model.generate(ids, attention_mask=mask, **kw))
    decode_s = max(t_all - t_pre, 1e-9)
    return {
        "mode": mode, "batch": batch, "prompt_len": prompt, "gen_len": gen,
        "prefill_tokens_per_s": batch * prompt / t_pre,
        "decode_tokens_per_s": batch * (gen - 1) / decode_s,
        "ms_per_step": decode_s * 1e3 / (gen - 1),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-2-7b")
    ap.add_argument("--runs", default="1:128:128,16:1024:64,64:1024:64,16:4096:64")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    model = model_for(a.preset)
    for mode in a.modes.split(","):
        if mode == "compile":
            model.forward = torch.compile(model.forward)
        for r in a.runs.split(","):
            b, p, g = (int(x) for x in r.split(":"))
            try:
                res = run(model, mode, b, p, g)
            except Exception as e:  # noqa: BLE001 - report and go on
                res = {"mode": mode, "batch": b, "prompt_len": p, "gen_len": g,
                       "error": f"{type(e).__name__}: {str(e)[:200]}"}
            torch.cuda.empty_cache()
            if a.json:
                print(json.dumps(res), flush=True)
            elif "error" in res:
                print(f"transformers {mode:<8} b{b} p{p} g{g}: {res['error']}", flush=True)
            else:
                print(f"transformers {mode:<8} b{b} p{p} g{g}: prefill "
                      f"{res['prefill_tokens_per_s']:.0f} tok/s, decode "
                      f"{res['decode_tokens_per_s']:.1f} tok/s ({res['ms_per_step']:.2f} ms/step)",
                      flush=True)


if __name__ == "__main__":
    main()
