"""Torch side of bench/src/ops/activation.rs (same keys): what a user writes in plain torch.

swiglu_fused: g, u = x.chunk(2, -1); F.silu(g) * u   (x the fused [gate | up] GEMM output)
swiglu:       F.silu(g) * u
gelu_tanh:    F.gelu(x + b, approximate="tanh")
gelu_erf:     F.gelu(x + b, approximate="none")
bias_add:     x + b
"""
import torch
import torch.nn.functional as F

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def swiglu_fused(x):
    g, u = x.chunk(2, -1)
    return F.silu(g) * u


def swiglu(g, u):
    return F.silu(g) * u


def cases():
    for fused in [True, False]:
        op = "swiglu_fused" if fused else "swiglu"
        for inter in [11008, 14336]:
            for rows in [1, 16, 64, 8192]:
                for dt in ["f16", "bf16"]:
                    def make(rows=rows, inter=inter, dt=dt, fused=fused):
                        if fused:
                            x = rnd((rows, 2 * inter), dt)
                            c = torch.compile(swiglu_fused)
                            return {"eager": lambda: swiglu_fused(x), "compile": lambda: c(x)}
                        g, u = rnd((rows, inter), dt), rnd((rows, inter), dt)
                        c = torch.compile(swiglu)
                        return {"eager": lambda: swiglu(g, u), "compile": lambda: c(g, u)}
                    yield f"{op}|{dt}|{rows}x{inter}", make
    for op, approx in [("gelu_tanh", "tanh"), ("gelu_erf", "none"), ("bias_add", None)]:
        for rows in [1, 64, 16384]:
            def make(rows=rows, approx=approx):
                x, b = rnd((rows, 4096), "f16"), rnd((4096,), "f16")
                if approx is None:
                    out = torch.empty_like(x)
                    f = lambda: torch.add(x, b, out=out)
                    c = torch.compile(lambda x, b: x + b)
                else:
                    f = lambda: F.gelu(x + b, approximate=approx)
                    c = torch.compile(lambda x, b: F.gelu(x + b, approximate=approx))
                return {"eager": f, "compile": lambda: c(x, b)}
            yield f"{op}|f16|{rows}x4096", make
