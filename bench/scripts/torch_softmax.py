"""Torch side of bench/src/ops/softmax.rs (same keys). Temperature 1 on both sides."""
import torch

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SIZES = [(1, 32000), (64, 32000), (1, 128256), (64, 128256), (256, 128256), (2048, 128256)]


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def case(rows, n, dt, f32_out):
    def make():
        x = rnd((rows, n), dt)
        if f32_out:
            f = lambda: torch.softmax(x, dim=-1, dtype=torch.float32)
        else:
            f = lambda: torch.softmax(x, dim=-1)
        return {"eager": f, "compile": torch.compile(f)}
    op = "softmax_f32out" if f32_out else "softmax"
    return f"{op}|{dt}|{rows}x{n}", make


def cases():
    for rows, n in SIZES:
        yield case(rows, n, "bf16", False)
        yield case(rows, n, "bf16", True)
    yield case(4096, 4096, "f32", False)
    yield case(1, 128256, "f32", False)
