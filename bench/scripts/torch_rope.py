"""Torch side of bench/src/ops/rope.rs (same keys).

What a Hugging Face LLaMA user runs: cos/sin caches [max_pos, head_dim] (emb = cat(freqs, freqs))
in the activation dtype, gathered by position ids, then q * cos + rotate_half(q) * sin for Q and
K (out of place, as HF does). The same torch code stands against both of our paths (`rope`
computes the angles, `rope_table` reads a table).
"""
import torch

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
Q_HEADS, KV_HEADS, HEAD_DIM, MAX_POS, THETA = 32, 8, 128, 65536, 500000.0


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def positions(t):
    if t <= 64:
        return torch.arange(t, device="cuda") * 37 + 1000
    return torch.arange(t, device="cuda")


def cos_sin_cache(dt):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64, device="cuda").float() / HEAD_DIM))
    t = torch.arange(MAX_POS, device="cuda", dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(DT[dt]), emb.sin().to(DT[dt])


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(q, k, cos_cached, sin_cached, position_ids):
    cos = cos_cached[position_ids].unsqueeze(1)  # [tokens, 1, head_dim], broadcast over heads
    sin = sin_cached[position_ids].unsqueeze(1)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def cases():
    for t in [1, 64, 4096, 65536]:
        for op in ["rope", "rope_table"]:
            for dt in ["f16", "bf16"]:
                def make(t=t, dt=dt):
                    q = rnd((t, Q_HEADS, HEAD_DIM), dt)
                    k = rnd((t, KV_HEADS, HEAD_DIM), dt)
                    cos, sin = cos_sin_cache(dt)
                    pos = positions(t)
                    compiled = torch.compile(hf_rope)
                    return {"eager": lambda: hf_rope(q, k, cos, sin, pos),
                            "compile": lambda: compiled(q, k, cos, sin, pos)}
                yield f"{op}|{dt}|t{t}_q{Q_HEADS}_kv{KV_HEADS}_d{HEAD_DIM}", make
