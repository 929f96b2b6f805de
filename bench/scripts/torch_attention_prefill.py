"""Torch side of bench/src/ops/attention_prefill.rs: causal prefill attention with GQA, same
keys (`attn_prefill|dtype|b{B}xL{L}xh32/8xd128`), batch of equal lengths in torch's
[B, H, L, D] layout.

In the op table (compare.py): "eager" is F.scaled_dot_product_attention(is_causal=True,
enable_gqa=True) with torch's own backend choice; "compile" is torch.compile of the plain
GEMM-softmax-GEMM a user would write (matmul, causal mask, softmax, matmul), so the table
shows both ratios. Run this file directly for every backend side by side (flash, cuDNN,
efficient, math-free naive eager and compiled) in TFLOP/s, causal FLOPs counted once:
4 * D * Hq * B * L * (L + 1) / 2.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
LENS = [512, 1024, 2048, 4096, 8192, 16384]
HQ, HKV, D = 32, 8, 128


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def points():
    for l in LENS:
        yield max(1, 16384 // l), l, "f16"
    yield 4, 4096, "bf16"
    yield 16, 1024, "f32"


def key(b, l, dt):
    return f"attn_prefill|{dt}|b{b}xL{l}xh{HQ}/{HKV}xd{D}"


def flops(b, l):
    return 4 * D * HQ * b * l * (l + 1) // 2


def inputs(b, l, dt):
    return rnd((b, HQ, l, D), dt), rnd((b, HKV, l, D), dt), rnd((b, HKV, l, D), dt)


def sdpa(q, k, v, backend=None):
    if backend is None:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def f():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return f


def naive(q, k, v):
    """matmul, causal mask, softmax (f32), matmul; GQA by repeat_interleave."""
    g = q.shape[1] // k.shape[1]
    l = q.shape[2]
    mask = torch.ones(l, l, device=q.device, dtype=torch.bool).tril()
    scale = q.shape[-1] ** -0.5

    def f():
        kk = k.repeat_interleave(g, dim=1)
        vv = v.repeat_interleave(g, dim=1)
        s = (q @ kk.transpose(-1, -2)).float() * scale
        s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1).to(q.dtype) @ vv
    return f


def cases():
    for b, l, dt in points():
        def make(b=b, l=l, dt=dt):
            q, k, v = inputs(b, l, dt)
            n = naive(q, k, v)
            # the naive path materialises [B, H, L, L] scores: skip it where that is > 8 GiB
            big = b * HQ * l * l * 6 > (8 << 30)
            return {"eager": sdpa(q, k, v), "compile": None if big else torch.compile(n)}
        yield key(b, l, dt), make


def main():
    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import time_us
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print("| key | backend | us | TFLOP/s |\n|---|---|---:|---:|")
    for b, l, dt in points():
        q, k, v = inputs(b, l, dt)
        variants = [("sdpa-default", sdpa(q, k, v)),
                    ("flash", sdpa(q, k, v, SDPBackend.FLASH_ATTENTION)),
                    ("cudnn", sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION)),
                    ("efficient", sdpa(q, k, v, SDPBackend.EFFICIENT_ATTENTION))]
        if b * HQ * l * l * 6 <= (8 << 30):
            variants += [("naive-eager", naive(q, k, v)),
                         ("naive-compile", torch.compile(naive(q, k, v)))]
        for name, fn in variants:
            try:
                us = time_us(fn)
                print(f"| {key(b, l, dt)} | {name} | {us:.1f} | {flops(b, l) / us / 1e6:.1f} |",
                      flush=True)
            except Exception as ex:  # a backend that does not support the shape: say so
                print(f"| {key(b, l, dt)} | {name} | error: {str(ex).splitlines()[0][:60]} | |")
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
