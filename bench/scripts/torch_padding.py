"""Torch side of bench/src/ops/padding.rs (same keys): boolean-mask indexing,
x[mask] (remove) and out = zeros; out[mask] = packed (rebuild)."""
import torch

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SEED = 2024
M64 = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def bench_lengths(batch, max_len, seed=SEED):
    """Same lengths as bench_lengths in bench/src/ops/padding.rs."""
    return [1 + splitmix64((seed * 1_000_003 + b) & M64) % max_len for b in range(batch)]


def rnd(shape, dt):
    x = torch.rand(shape, device="cuda") * 0.95 + 0.05
    return (x * torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)).to(DT[dt])


def cases():
    hidden, dt = 4096, "f16"
    for op in ["remove_padding", "rebuild_padding"]:
        for batch, max_len in [(64, 512), (16, 2048)]:
            def make(op=op, batch=batch, max_len=max_len):
                lengths = torch.tensor(bench_lengths(batch, max_len), device="cuda")
                mask = torch.arange(max_len, device="cuda")[None, :] < lengths[:, None]
                x = rnd((batch, max_len, hidden), dt)
                if op == "remove_padding":
                    f = lambda: x[mask]
                else:
                    packed = x[mask].clone()
                    del x

                    def f():
                        out = torch.zeros(batch, max_len, hidden, dtype=DT[dt], device="cuda")
                        out[mask] = packed
                        return out
                return {"eager": f, "compile": torch.compile(f)}
            yield f"{op}|{dt}|b{batch}_l{max_len}_h{hidden}", make
