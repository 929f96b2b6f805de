"""Torch side of bench/src/ops/elementwise.rs (same keys)."""
import torch

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def cases():
    for n in [4096, 64 * 4096, 1 << 26]:
        for dt in ["f32", "f16", "bf16"]:
            def make(n=n, dt=dt):
                a, b = rnd((n,), dt), rnd((n,), dt)
                out = torch.empty_like(a)
                f = lambda: torch.add(a, b, out=out)
                c = torch.compile(lambda: a + b)
                return {"eager": f, "compile": c}
            yield f"add|{dt}|{n}", make
