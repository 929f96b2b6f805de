#!/usr/bin/env python3
"""Writes the frozen fixtures of fl-engine's encoder CPU reference test.

    python3 bench/scripts/make_encoder_fixtures.py [--out crates/fl-engine/tests/data/encoder]

Needs PyTorch (CPU is enough) and transformers 5. For each case it builds a tiny random model
with transformers (BertModel, BertForSequenceClassification, XLMRobertaModel,
XLMRobertaForSequenceClassification; odd hidden sizes, both GELU forms, token types in the
BERT pairs; two cases at head dims 32 and 64, which the GPU attention kernel runs, with a
sequence longer than its 64-token tile), every parameter drawn at random (LayerNorm weights and biases too, so that no
term of the forward is an identity), and writes under OUT/<name>/:

  config.json, model.safetensors   as `save_pretrained` writes them (weights in the case's
                                   storage dtype; the model is run on exactly those values);
  expected.json                    the inputs (a ragged batch of 3 sequences: ids, and token
                                   types where the case has them) and transformers' f32
                                   outputs on them, run as one right-padded batch with an
                                   attention mask: the last hidden state of the real tokens
                                   ([seq][token][hidden]), CLS / mean / last-token pooling,
                                   the L2-normalised mean, BertModel's pooler output and the
                                   classification logits where the model has them.

The padded batch is also checked against each sequence run alone (no padding), so a fixture
never freezes an output that depends on its padding. Fixed seeds: rerunning writes the same
files.
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import load_file

CASES = [
    # name, class, storage dtype, config overrides, sequence lengths, token types
    dict(
        name="bert_erf",
        cls="BertModel",
        dtype=torch.float16,
        cfg=dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=2,
                 intermediate_size=52, hidden_act="gelu", vocab_size=100,
                 max_position_embeddings=40, type_vocab_size=2, pad_token_id=0),
        lens=[9, 17, 4],
        pairs=True,
    ),
    dict(
        name="bert_cls_tanh",
        cls="BertForSequenceClassification",
        dtype=torch.bfloat16,
        cfg=dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=3,
                 intermediate_size=52, hidden_act="gelu_pytorch_tanh", vocab_size=100,
                 max_position_embeddings=32, type_vocab_size=2, pad_token_id=0,
                 num_labels=3, layer_norm_eps=1e-12),
        lens=[11, 5, 16],
        pairs=True,
    ),
    dict(
        name="bert_small_f32",
        cls="BertModel",
        dtype=torch.float32,
        cfg=dict(hidden_size=21, num_attention_heads=3, num_hidden_layers=2,
                 intermediate_size=30, hidden_act="gelu_new", vocab_size=97,
                 max_position_embeddings=24, type_vocab_size=2, pad_token_id=0),
        lens=[1, 11, 6],
        pairs=False,
    ),
    dict(
        name="xlmr_tanh",
        cls="XLMRobertaModel",
        dtype=torch.float16,
        cfg=dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=2,
                 intermediate_size=52, hidden_act="gelu_new", vocab_size=100,
                 max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5),
        lens=[8, 21, 3],
        pairs=False,
    ),
    dict(
        name="xlmr_cls_erf",
        cls="XLMRobertaForSequenceClassification",
        dtype=torch.float16,
        cfg=dict(hidden_size=36, num_attention_heads=3, num_hidden_layers=2,
                 intermediate_size=52, hidden_act="gelu", vocab_size=100,
                 max_position_embeddings=36, type_vocab_size=1, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, num_labels=1),
        lens=[14, 6, 25],
        pairs=False,
    ),
    # Head dims the GPU attention kernel runs (32, 64), one sequence past its 64-token tile;
    # one layer each to keep the files small (stacking is covered by the others on the CPU and
    # by encoder_gpu.rs's random models on the GPU).
    dict(
        name="bert_hd32_erf",
        cls="BertModel",
        dtype=torch.float16,
        cfg=dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                 intermediate_size=100, hidden_act="gelu", vocab_size=100,
                 max_position_embeddings=72, type_vocab_size=2, pad_token_id=0),
        lens=[13, 65, 6],
        pairs=True,
    ),
    dict(
        name="xlmr_cls_hd64_tanh",
        cls="XLMRobertaForSequenceClassification",
        dtype=torch.float16,
        cfg=dict(hidden_size=64, num_attention_heads=1, num_hidden_layers=1,
                 intermediate_size=100, hidden_act="gelu_new", vocab_size=100,
                 max_position_embeddings=72, type_vocab_size=1, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, num_labels=2),
        lens=[67, 4, 19],
        pairs=False,
    ),
]


def randomize(model, gen):
    """Every parameter random: linear weights ~ N(0, 1/fan_in) (activations stay O(1), so
    attention is far from uniform and GELU sees both tails), embeddings ~ N(0, 1), biases
    ~ N(0, 0.1²), LayerNorm weights 1 + N(0, 0.2²)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen)
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * z)
            elif name.endswith("bias"):
                p.copy_(0.1 * z)
            elif "embeddings" in name:
                p.copy_(z)
            else:
                p.copy_(z / p.shape[1] ** 0.5)


def make_inputs(case, cfg, gen):
    """A ragged batch of 3: [CLS]-like first token, random body ids that avoid the pad id;
    BERT pairs as [CLS] a [SEP] b [SEP] with token types 0 then 1."""
    pad = cfg.pad_token_id
    ids, types = [], []
    for n in case["lens"]:
        body = torch.randint(3, cfg.vocab_size, (n,), generator=gen).tolist()
        body = [t if t != pad else t + 1 for t in body]
        body[0] = 2 if case["cls"].startswith("Bert") else 0  # [CLS] / <s>
        ids.append(body)
        if case["pairs"]:
            split = max(1, n // 2)
            types.append([0] * split + [1] * (n - split))
    return ids, (types if case["pairs"] else None)


def run(model, ids, types, pad):
    """transformers on one right-padded batch with an attention mask."""
    n = max(len(s) for s in ids)
    input_ids = torch.full((len(ids), n), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), n), dtype=torch.long)
    tt = torch.zeros((len(ids), n), dtype=torch.long)
    for i, s in enumerate(ids):
        input_ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        if types is not None:
            tt[i, : len(s)] = torch.tensor(types[i])
    kw = dict(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
    if types is not None:
        kw["token_type_ids"] = tt
    with torch.no_grad():
        return model(**kw)


def rounded(x):
    """f32 values as JSON numbers with 9 significant digits (enough to round-trip f32)."""
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return float(f"{x:.9g}")


def make(case, out_dir):
    gen = torch.Generator().manual_seed(sum(map(ord, case["name"])))
    cls = getattr(transformers, case["cls"])
    config_cls = transformers.BertConfig if case["cls"].startswith("Bert") else transformers.XLMRobertaConfig
    cfg = config_cls(**case["cfg"])
    model = cls(cfg).eval()
    randomize(model, gen)
    d = os.path.join(out_dir, case["name"])
    os.makedirs(d, exist_ok=True)
    model.to(case["dtype"]).save_pretrained(d)
    # The reference runs on the stored values: reload them and run in f32 (eager attention).
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    stored = load_file(os.path.join(d, "model.safetensors"))
    for name, p in model.state_dict().items():
        if name in stored:
            assert torch.equal(p, stored[name].float()), name

    ids, types = make_inputs(case, cfg, gen)
    out = run(model, ids, types, cfg.pad_token_id)
    last = out.hidden_states[-1]
    states, cls_, mean, lastt = [], [], [], []
    for i, s in enumerate(ids):
        h = last[i, : len(s)]
        states.append(h)
        cls_.append(h[0])
        mean.append(h.mean(0))
        lastt.append(h[-1])
        # Padding must not reach the real tokens: the sequence alone gives the same states.
        alone = run(model, [s], None if types is None else [types[i]], cfg.pad_token_id)
        err = (alone.hidden_states[-1][0] - h).norm() / h.norm()
        assert err < 1e-5, (case["name"], i, float(err))
    mean_t = torch.stack(mean)
    expected = {
        "model": case["cls"],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "storage_dtype": str(case["dtype"]).removeprefix("torch."),
        "ids": ids,
        "token_types": types,
        "last_hidden_state": rounded([h.tolist() for h in states]),
        "cls": rounded(torch.stack(cls_).tolist()),
        "mean": rounded(mean_t.tolist()),
        "last": rounded(torch.stack(lastt).tolist()),
        "mean_normalized": rounded(torch.nn.functional.normalize(mean_t, dim=-1).tolist()),
    }
    if getattr(out, "pooler_output", None) is not None:
        expected["pooler"] = rounded(out.pooler_output.tolist())
    if getattr(out, "logits", None) is not None:
        expected["logits"] = rounded(out.logits.tolist())
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    sizes = {n: os.path.getsize(os.path.join(d, n)) for n in sorted(os.listdir(d))}
    print(case["name"], sizes)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "crates", "fl-engine", "tests", "data", "encoder")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.normpath(default))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    for case in CASES:
        make(case, args.out)


if __name__ == "__main__":
    main()
