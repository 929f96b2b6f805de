"""Torch side of bench/src/ops/embedding.rs (same keys): torch.nn.functional.embedding."""
import torch
import torch.nn.functional as F

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
VOCAB = 32000


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def cases():
    sizes = [(n, 4096, "f16") for n in [1, 64, 4096, 65536]]
    sizes += [(16, 8192, "f16"), (65536, 4096, "bf16")]
    for n, hidden, dt in sizes:
        def make(n=n, hidden=hidden, dt=dt):
            table = rnd((VOCAB, hidden), dt)
            # input ids as users hold them (int64)
            ids = torch.randint(0, VOCAB, (n,), device="cuda", dtype=torch.long)
            f = lambda: F.embedding(ids, table)
            c = torch.compile(lambda: F.embedding(ids, table))
            return {"eager": f, "compile": c}
        yield f"embedding|{dt}|n{n}_h{hidden}_v{VOCAB}", make
