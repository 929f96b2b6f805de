"""Torch side of bench/src/ops/kv_cache.rs (same keys and token layout).

What users write: advanced-indexing assignment into the cache tensors,
    k_cache[seq, :, pos] = k                                   (contiguous [batch, kv, max_seq, d])
    k_cache[block_table[seq, pos // bs], :, pos % bs] = k      (paged [blocks, kv, bs, d])
with the same inputs our kernels take (sequence ids, positions, block table).

kv_rope_append: the fused QKV GEMM output split into q, k, v, Hugging Face rotate-half RoPE
(cos/sin caches gathered by position) on q and k, then the same index_put into the cache.
"""
import torch

KV_HEADS, HEAD_DIM, BLOCK, MAX_SEQ = 8, 128, 16, 4096


def rnd(shape):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(torch.float16)


def layout(t):
    """Mirrors bench/src/ops/kv_cache.rs::layout."""
    if t <= 64:
        batch = t
        seq = torch.arange(t, device="cuda")
        pos = torch.arange(t, device="cuda") * 37 + 1000
    else:
        batch = (t + MAX_SEQ - 1) // MAX_SEQ
        i = torch.arange(t, device="cuda")
        seq, pos = i // MAX_SEQ, i % MAX_SEQ
    num_blocks = batch * MAX_SEQ // BLOCK
    table = ((torch.arange(num_blocks, device="cuda") * 7919 + 13) % num_blocks).reshape(batch, MAX_SEQ // BLOCK)
    return batch, seq, pos, table, num_blocks


def append(kc, vc, k, v, seq, pos):
    kc[seq, :, pos] = k
    vc[seq, :, pos] = v


def append_paged(kc, vc, k, v, seq, pos, table):
    blk = table[seq, pos // BLOCK]
    off = pos % BLOCK
    kc[blk, :, off] = k
    vc[blk, :, off] = v


THETA, MAX_POS = 500000.0, MAX_SEQ  # decode positions stay below 1000 + 37 * 64


def cos_sin_cache():
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64, device="cuda").float() / HEAD_DIM))
    t = torch.arange(MAX_POS, device="cuda", dtype=torch.float32)
    emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
    return emb.cos().to(torch.float16), emb.sin().to(torch.float16)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_append(qkv, kc, vc, cos_c, sin_c, seq, pos, hq, hkv):
    t = qkv.shape[0]
    q, k, v = qkv.view(t, hq + 2 * hkv, HEAD_DIM).split([hq, hkv, hkv], dim=1)
    cos, sin = cos_c[pos].unsqueeze(1), sin_c[pos].unsqueeze(1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    kc[seq, :, pos] = k
    vc[seq, :, pos] = v
    return q


def cases():
    for t in [1, 64, 4096, 65536]:
        for paged in [False, True]:
            def make(t=t, paged=paged):
                batch, seq, pos, table, num_blocks = layout(t)
                k, v = rnd((t, KV_HEADS, HEAD_DIM)), rnd((t, KV_HEADS, HEAD_DIM))
                if paged:
                    shape = (num_blocks, KV_HEADS, BLOCK, HEAD_DIM)
                    kc = torch.zeros(shape, dtype=torch.float16, device="cuda")
                    vc = torch.zeros_like(kc)
                    c = torch.compile(append_paged)
                    return {"eager": lambda: append_paged(kc, vc, k, v, seq, pos, table),
                            "compile": lambda: c(kc, vc, k, v, seq, pos, table)}
                shape = (batch, KV_HEADS, MAX_SEQ, HEAD_DIM)
                kc = torch.zeros(shape, dtype=torch.float16, device="cuda")
                vc = torch.zeros_like(kc)
                c = torch.compile(append)
                return {"eager": lambda: append(kc, vc, k, v, seq, pos),
                        "compile": lambda: c(kc, vc, k, v, seq, pos)}
            op = "kv_append_paged" if paged else "kv_append"
            yield f"{op}|f16|t{t}_kv{KV_HEADS}_d{HEAD_DIM}", make
    for hq, hkv in [(32, 32), (32, 8)]:
        for t in [1, 16, 64, 4096]:
            def make(t=t, hq=hq, hkv=hkv):
                batch, seq, pos, _, _ = layout(t)
                qkv = rnd((t, (hq + 2 * hkv) * HEAD_DIM))
                kc = torch.zeros((batch, hkv, MAX_SEQ, HEAD_DIM), dtype=torch.float16, device="cuda")
                vc = torch.zeros_like(kc)
                cos_c, sin_c = cos_sin_cache()
                c = torch.compile(rope_append)
                return {"eager": lambda: rope_append(qkv, kc, vc, cos_c, sin_c, seq, pos, hq, hkv),
                        "compile": lambda: c(qkv, kc, vc, cos_c, sin_c, seq, pos, hq, hkv)}
            yield f"kv_rope_append|f16|t{t}_q{hq}_kv{hkv}_d{HEAD_DIM}", make
