#!/usr/bin/env python3
"""Writes a LLaMA-architecture GGUF file of random f16 weights and a placeholder SentencePiece
vocabulary, so that `fl serve` / `fl bench` and llama.cpp's `llama-server` / `llama-bench` run
identical weights from one file (issue 32's side by side; llama-quantize makes the K-quant
files of issue 33 from it). Needs only numpy; tensors are written one at a time, so the file
never sits in memory whole.

    python3 bench/scripts/make_random_gguf.py OUT.gguf [--shape llama-2-7b] [--seed 0]

Shapes: llama-2-7b (32 layers, 4096, MHA 32, ff 11008, vocab 32000), llama-3-8b-shape (GQA
32/8, ff 14336, vocab 32000, rope 500000), tiny (2 layers, 256, GQA 4/2, ff 704, vocab 512).
Weights are N(0, 0.02) values (slices of one pool of 16M, from random offsets: the file writes
at disk speed; norms 1.0); the vocabulary is <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>
and placeholder pieces, so prompts are best sent as token ids.
"""

import argparse
import struct
import sys

SHAPES = {
    "llama-2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ff=11008, vocab=32000,
                       ctx=4096, rope=10000.0),
    "llama-3-8b-shape": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ff=14336, vocab=32000,
                             ctx=8192, rope=500000.0),
    "tiny": dict(layers=2, hidden=256, heads=4, kv_heads=2, ff=704, vocab=512, ctx=2048,
                 rope=10000.0),
}

# GGUF value types and ggml tensor types used here.
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_F16 = 0, 1
ALIGN = 32


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, ty, value):
    out = gstr(key) + struct.pack("<I", ty)
    if ty == STRING:
        return out + gstr(value)
    if ty == ARRAY:
        ety, items = value
        out += struct.pack("<IQ", ety, len(items))
        if ety == STRING:
            return out + b"".join(gstr(x) for x in items)
        fmt = {I32: "<i", F32: "<f", U32: "<I"}[ety]
        return out + b"".join(struct.pack(fmt, x) for x in items)
    fmt = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}[ty]
    return out + struct.pack(fmt, value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-2-7b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import numpy as np

    s = SHAPES[args.shape]
    h, ff, L, V = s["hidden"], s["ff"], s["layers"], s["vocab"]
    hd = h // s["heads"]
    kvd = hd * s["kv_heads"]

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(V - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (V - 259)  # unknown, control, byte, normal
    scores = [0.0] * 259 + [-float(i) for i in range(V - 259)]
    meta = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, f"random {args.shape}"),
        kv("general.file_type", U32, 1),  # mostly f16
        kv("llama.context_length", U32, s["ctx"]),
        kv("llama.embedding_length", U32, h),
        kv("llama.block_count", U32, L),
        kv("llama.feed_forward_length", U32, ff),
        kv("llama.attention.head_count", U32, s["heads"]),
        kv("llama.attention.head_count_kv", U32, s["kv_heads"]),
        kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        kv("llama.rope.dimension_count", U32, hd),
        kv("llama.rope.freq_base", F32, s["rope"]),
        kv("llama.vocab_size", U32, V),
        kv("tokenizer.ggml.model", STRING, "llama"),
        kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        kv("tokenizer.ggml.scores", ARRAY, (F32, scores)),
        kv("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        kv("tokenizer.ggml.unknown_token_id", U32, 0),
        kv("tokenizer.ggml.bos_token_id", U32, 1),
        kv("tokenizer.ggml.eos_token_id", U32, 2),
        kv("tokenizer.ggml.add_bos_token", BOOL, True),
        kv("tokenizer.ggml.add_eos_token", BOOL, False),
    ]
    # (name, ggml dims with ne[0] innermost, type)
    tensors = [("token_embd.weight", (h, V), GGML_F16)]
    for i in range(L):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (h,), GGML_F32),
            (p + "attn_q.weight", (h, h), GGML_F16),
            (p + "attn_k.weight", (h, kvd), GGML_F16),
            (p + "attn_v.weight", (h, kvd), GGML_F16),
            (p + "attn_output.weight", (h, h), GGML_F16),
            (p + "ffn_norm.weight", (h,), GGML_F32),
            (p + "ffn_gate.weight", (h, ff), GGML_F16),
            (p + "ffn_up.weight", (h, ff), GGML_F16),
            (p + "ffn_down.weight", (ff, h), GGML_F16),
        ]
    tensors += [("output_norm.weight", (h,), GGML_F32), ("output.weight", (h, V), GGML_F16)]

    def nbytes(dims, ty):
        n = 1
        for d in dims:
            n *= d
        return n * (4 if ty == GGML_F32 else 2)

    infos, offset = [], 0
    for name, dims, ty in tensors:
        infos.append(gstr(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ty, offset))
        offset += (nbytes(dims, ty) + ALIGN - 1) // ALIGN * ALIGN

    rng = np.random.default_rng(args.seed)
    # Weights: slices of one pool of N(0, 0.02) f16 values from random offsets, so a 13 GB file
    # writes at disk speed (drawing every value takes minutes).
    chunk = 1 << 24
    pool = (rng.standard_normal(chunk + (1 << 20), dtype=np.float32) * 0.02).astype(np.float16)
    with open(args.out, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for name, dims, ty in tensors:
            n = nbytes(dims, ty) // (4 if ty == GGML_F32 else 2)
            if ty == GGML_F32:
                f.write(np.ones(n, dtype=np.float32).tobytes())
            else:
                for at in range(0, n, chunk):
                    off = int(rng.integers(0, 1 << 20))
                    f.write(pool[off : off + min(chunk, n - at)].tobytes())
            f.write(b"\0" * (-f.tell() % ALIGN))
        size = f.tell()
    print(f"make_random_gguf: {args.out}: {args.shape}, {len(tensors)} tensors, "
          f"{size / 1e9:.2f} GB", file=sys.stderr)


if __name__ == "__main__":
    main()
