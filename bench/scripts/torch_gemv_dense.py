"""Torch side of bench/src/ops/gemv_dense.rs (same keys).

gemv_dense_linear: F.linear (eager: torch.matmul into a preallocated out);
gemv_dense_swiglu: what a LLaMA MLP with a stacked gate/up weight runs,
  g, u = F.linear(x, w).chunk(2, -1); F.silu(g) * u;
gemv_dense_add: the residual add after the o / down projection, res += F.linear(x, w)."""
import torch
import torch.nn.functional as F

SHAPES = [(4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008), (32000, 4096), (1024, 4096)]
TOKENS = [1, 16]


def rnd(shape):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(torch.float16)


def swiglu(x, w):
    g, u = F.linear(x, w).chunk(2, -1)
    return F.silu(g) * u


def cases():
    for n, k in SHAPES:
        for m in TOKENS:
            def make_linear(n=n, k=k, m=m):
                x, w = rnd((m, k)), rnd((n, k))
                out = torch.empty((m, n), device="cuda", dtype=torch.float16)
                f = lambda: torch.matmul(x, w.t(), out=out)
                c = torch.compile(lambda: F.linear(x, w))
                return {"eager": f, "compile": c}
            yield f"gemv_dense_linear|f16|{m}x{n}x{k}", make_linear

            if n == 22016:
                def make_swiglu(n=n, k=k, m=m):
                    x, w = rnd((m, k)), rnd((n, k))
                    f = lambda: swiglu(x, w)
                    c = torch.compile(lambda: swiglu(x, w))
                    return {"eager": f, "compile": c}
                yield f"gemv_dense_swiglu|f16|{m}x{n // 2}x{k}", make_swiglu

            if n == 4096:
                def make_add(n=n, k=k, m=m):
                    x, w, res = rnd((m, k)), rnd((n, k)), rnd((m, n))
                    f = lambda: res.add_(F.linear(x, w))
                    c = torch.compile(lambda: res + F.linear(x, w))
                    return {"eager": f, "compile": c}
                yield f"gemv_dense_add|f16|{m}x{n}x{k}", make_add
