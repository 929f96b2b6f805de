"""Torch side of bench/src/ops/attention.rs: scaled_dot_product_attention for one query
token per sequence with GQA (enable_gqa=True), same keys."""
import torch
import torch.nn.functional as F

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SHAPES = [(1, 32768), (4, 16384), (16, 8192), (64, 4096), (1, 4096)]


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def cases():
    todo = [(b, l, kv, "f16") for (b, l) in SHAPES for kv in (8, 32)] + [(64, 4096, 8, "bf16"), (64, 4096, 8, "f32")]
    for b, l, kv, dt in todo:
        def make(b=b, l=l, kv=kv, dt=dt):
            q = rnd((b, 32, 1, 128), dt)
            k = rnd((b, kv, l, 128), dt)
            v = rnd((b, kv, l, 128), dt)
            gqa = kv != 32
            f = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            c = torch.compile(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa))
            return {"eager": f, "compile": c}
        yield f"decode_attn|{dt}|b{b}_L{l}_q32_kv{kv}_d128", make
