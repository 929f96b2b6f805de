"""Torch side of bench/src/ops/norm.rs (same keys): what a user writes in plain torch."""
import torch
import torch.nn.functional as F

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SIZES = [(1, 4096), (16, 4096), (64, 4096), (1, 8192), (64, 8192), (65536, 8192)]
EPS = 1e-5


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def shapes():
    for rows, h in SIZES:
        for dt in ["f16", "bf16"]:
            yield rows, h, dt
    yield 65536, 4096, "f32"


def add_rms(x, r, w):
    # residual += x (in place), then RMSNorm of the new residual
    r.add_(x)
    return F.rms_norm(r, (r.shape[-1],), w, EPS)


def cases():
    for rows, h, dt in shapes():
        def make(rows=rows, h=h, dt=dt):
            x, w = rnd((rows, h), dt), rnd((h,), dt)
            c = torch.compile(lambda: F.rms_norm(x, (h,), w, EPS))
            return {"eager": lambda: F.rms_norm(x, (h,), w, EPS), "compile": c}
        yield f"rms_norm|{dt}|{rows}x{h}", make
    for rows, h, dt in shapes():
        def make(rows=rows, h=h, dt=dt):
            x, r, w = rnd((rows, h), dt), rnd((rows, h), dt), rnd((h,), dt)
            c = torch.compile(add_rms)
            return {"eager": lambda: add_rms(x, r, w), "compile": lambda: c(x, r, w)}
        yield f"add_rms_norm|{dt}|{rows}x{h}", make
    for rows, h, dt in shapes():
        def make(rows=rows, h=h, dt=dt):
            x, w, b = rnd((rows, h), dt), rnd((h,), dt), rnd((h,), dt)
            c = torch.compile(lambda: F.layer_norm(x, (h,), w, b, EPS))
            return {"eager": lambda: F.layer_norm(x, (h,), w, b, EPS), "compile": c}
        yield f"layer_norm|{dt}|{rows}x{h}", make
