"""Torch side of bench/src/ops/gemv.rs (same keys).

torch has no kernel equal to a weight-only int4/int8/GGUF GEMV, so every key runs what a
user would otherwise run: the fp16 F.linear of the same shape (x [m, k], W [n, k])."""
import torch
import torch.nn.functional as F

SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096)]
TOKENS = [1, 16]
FORMATS = ["gemv_int8", "gemv_int4_g128", "gemv_int4zp_g128", "gemv_q8_0", "gemv_q4_0"]


def rnd(shape):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(torch.float16)


def cases():
    for n, k in SHAPES:
        for m in TOKENS:
            for op in FORMATS:
                def make(n=n, k=k, m=m):
                    x, w = rnd((m, k)), rnd((n, k))
                    out = torch.empty((m, n), device="cuda", dtype=torch.float16)
                    f = lambda: torch.matmul(x, w.t(), out=out)
                    c = torch.compile(lambda: F.linear(x, w))
                    return {"eager": f, "compile": c}
                yield f"{op}|f16|{m}x{n}x{k}", make
