#!/usr/bin/env python3
"""Writes a small random LLaMA model directory that `fl serve` can serve with text: config.json,
model.safetensors (f16), a byte-level BPE tokenizer.json trained here on a short corpus,
tokenizer_config.json with bos / eos and a LLaMA-3-style chat_template, and
generation_config.json. For the real-client checks on a machine without network or model
downloads (the GPU machine): `bash run.sh serve-check` makes one, serves it and runs
check_openai_client.py against it.

    python3 bench/scripts/make_serve_model.py OUT_DIR [--layers 4 --hidden 256 --vocab 1024]

Needs torch, transformers and tokenizers (the GPU machine has them).
"""

import argparse
import json
import os

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Training text: plain English, digits and punctuation, a few multi-byte characters so that
# byte-level merges inside UTF-8 characters exist (the server's hold-back of partial
# characters then has something to do).
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A server answers many clients at once; each request streams its tokens.",
    "Continuous batching admits new requests while others decode.",
    "Paged attention reads keys and values from fixed-size blocks of the cache.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1024 4096 65536.",
    "Punctuation: ( ) [ ] { } < > , . ; : ! ? ' \" - _ / \\ * & % $ # @",
    "Unicode: café, naïve, Zürich, 東京, 北京, Москва, emoji 🙂 and 🚀.",
    "Once upon a time there was a small model that could only say random things.",
    "Hello! How are you today? I am fine, thank you. What would you like to know?",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(args.out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    ids = {s: tok.token_to_id(s) for s in SPECIAL}

    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIAL[0], "eos_token": SPECIAL[4], "add_bos_token": False,
                   "chat_template": TEMPLATE, "model_max_length": 2048,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden,
                      intermediate_size=args.hidden * 8 // 3 // 8 * 8,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=2048,
                      bos_token_id=ids[SPECIAL[0]], eos_token_id=ids[SPECIAL[4]],
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    # Larger-than-default logits so that sampling and logprobs see peaked distributions.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.to(torch.float16).save_pretrained(args.out, safe_serialization=True)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ids[SPECIAL[0]], "eos_token_id": ids[SPECIAL[4]]}, f)
    print(f"make_serve_model: {args.out}: vocab {vocab}, {args.layers} layers, "
          f"hidden {args.hidden}, heads {args.heads}/{args.kv_heads}")


if __name__ == "__main__":
    main()
