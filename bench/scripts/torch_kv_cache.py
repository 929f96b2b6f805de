"""Torch side of bench/src/ops/kv_cache.rs (same keys and token layout).

What users write: advanced-indexing assignment into the cache tensors,
    k_cache[seq, :, pos] = k                                   (contiguous [batch, kv, max_seq, d])
    k_cache[block_table[seq, pos // bs], :, pos % bs] = k      (paged [blocks, kv, bs, d])
with the same inputs our kernels take (sequence ids, positions, block table).
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
