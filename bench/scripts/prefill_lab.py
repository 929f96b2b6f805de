#!/usr/bin/env python3
"""Prefill-attention lab: our fl_attention_prefill (from a shared library built by
bench/gpu/build_prefill_lab.sh) side by side with torch's SDPA backends, in one process.

    python3 prefill_lab.py LIB.so [LIB2.so ...] [--check] [--bench] [--dtypes f16,bf16]

The path is FL_PREFILL_PATH of the process (auto or mma), the same for every library: the
setting is read once into a static of an inline function, which the dynamic linker shares
between copies of a library (a GNU unique symbol), so one process cannot run both paths.
--check: ragged batches at odd lengths, GQA ratios 1/4/8/32, windows, against a float64
         reference built from torch (prints rel L2 and max abs error per case, FAIL over 1e-2).
--ncu:   three launches of each library at 4 x 4096 f16 (run under ncu)
--bench: causal d=128 GQA 32/8 at the issue-6 lengths, TFLOP/s with causal FLOPs counted
         once (4 * b * h * L^2 * d / 2), median of CUDA-event timings, next to SDPA flash and
         cuDNN.
"""
import ctypes, os, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DT = {"f16": (torch.float16, 1), "bf16": (torch.bfloat16, 2)}


class Args(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("batch", ctypes.c_int32), ("q_heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("total_tokens", ctypes.c_int32), ("q", ctypes.c_void_p), ("k", ctypes.c_void_p),
                ("v", ctypes.c_void_p), ("out", ctypes.c_void_p), ("cu_seqlens", ctypes.c_void_p),
                ("max_seq_len", ctypes.c_int32), ("scale", ctypes.c_float), ("window", ctypes.c_int32)]


def load(lib):
    so = ctypes.CDLL(os.path.abspath(lib))
    so.fl_attention_prefill.restype = ctypes.c_int
    so.fl_attention_prefill.argtypes = [ctypes.POINTER(Args), ctypes.c_void_p]
    return so


def call(so, dt, q, k, v, out, cu, max_len, scale, window=0):
    a = Args(DT[dt][1], cu.numel() - 1, q.shape[1], k.shape[1], q.shape[2], q.shape[0],
             q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), cu.data_ptr(), max_len,
             scale, window)
    st = so.fl_attention_prefill(ctypes.byref(a), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if st != 0:
        raise RuntimeError(f"fl_attention_prefill returned {st}")


def reference(q, k, v, lens, scale, window):
    outs, s0 = [], 0
    rep = q.shape[1] // k.shape[1]
    for n in lens:
        qs = q[s0:s0 + n].double().transpose(0, 1)
        ks = k[s0:s0 + n].double().repeat_interleave(rep, 1).transpose(0, 1)
        vs = v[s0:s0 + n].double().repeat_interleave(rep, 1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) * scale
        i = torch.arange(n, device=q.device)
        mask = i[None, :] > i[:, None]
        if window > 0:
            mask |= i[None, :] <= i[:, None] - window
        s.masked_fill_(mask, float("-inf"))
        outs.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
        s0 += n
    return torch.cat(outs)


def check(libs, dts):
    cases = [([1], 32, 32, 0), ([7], 32, 8, 0), ([129], 8, 1, 0), ([4095], 32, 8, 0),
             ([1, 7, 129, 300, 64, 128, 257], 32, 4, 0), ([1000, 513], 32, 32, 0),
             ([700, 1], 8, 8, 100), ([2000], 32, 8, 256), ([384, 200], 32, 1, 0)]
    bad = 0
    for name, so in libs:
        for dt in dts:
            for lens, hq, hk, win in cases:
                torch.manual_seed(sum(lens) + hq + hk + win)
                n = sum(lens)
                q = torch.randn(n, hq, 128, device="cuda", dtype=DT[dt][0])
                k = torch.randn(n, hk, 128, device="cuda", dtype=DT[dt][0])
                v = torch.randn(n, hk, 128, device="cuda", dtype=DT[dt][0])
                cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
                out = torch.full_like(q, float("nan"))
                scale = 128 ** -0.5
                call(so, dt, q, k, v, out, cu, max(lens), scale, win)
                torch.cuda.synchronize()
                ref = reference(q, k, v, lens, scale, win)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                mx = (out.double() - ref).abs().max().item()
                ok = err < 1e-2 and not torch.isnan(out).any().item()
                bad += not ok
                print(f"check {name} {dt} lens={lens if len(lens) < 4 else str(len(lens)) + ' seqs'} "
                      f"h{hq}/{hk} w{win}: rel L2 {err:.2e} max abs {mx:.2e} {'ok' if ok else 'FAIL'}")
    print(f"check: {'PASS' if bad == 0 else f'FAIL ({bad} cases)'}")


def timeit(f, reps):
    f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def bench(libs, dts):
    rows = [(32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]
    hq, hk = 32, 8
    print("bench: TFLOP/s, causal d=128 GQA 32/8 (causal FLOPs counted once)")
    hdr = ["dtype", "b x L", "flash", "cudnn"] + [n for n, _ in libs]
    print(" | ".join(hdr))
    for dt in dts:
        for b, L in rows:
            n = b * L
            q = torch.randn(n, hq, 128, device="cuda", dtype=DT[dt][0])
            k = torch.randn(n, hk, 128, device="cuda", dtype=DT[dt][0])
            v = torch.randn(n, hk, 128, device="cuda", dtype=DT[dt][0])
            cu = torch.arange(0, n + 1, L, dtype=torch.int32, device="cuda")
            out = torch.empty_like(q)
            flops = 4 * b * hq * L * L * 128 / 2
            reps = max(10, min(200, int(2e12 / flops)))
            qt, kt, vt = (x.view(b, L, -1, 128).transpose(1, 2) for x in (q, k, v))
            res = []
            for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                try:
                    with sdpa_kernel(be):
                        ms = timeit(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True), reps)
                    res.append(f"{flops / ms / 1e9:.1f}")
                except Exception as e:  # a backend that refuses the shape
                    res.append("n/a")
            for name, so in libs:
                ms = timeit(lambda: call(so, dt, q, k, v, out, cu, L, 128 ** -0.5), reps)
                res.append(f"{flops / ms / 1e9:.1f}")
            print(" | ".join([dt, f"{b}x{L}"] + res), flush=True)


def main():
    args = sys.argv[1:]
    libs_paths = [a for a in args if a.endswith(".so")]
    dts = "f16,bf16"
    for i, a in enumerate(args):
        if a == "--dtypes":
            dts = args[i + 1]
    dts = dts.split(",")
    path = os.environ.get("FL_PREFILL_PATH", "auto")
    libs = [(f"{os.path.basename(lib)[:-3]}:{path}", load(lib)) for lib in libs_paths]
    if "--check" in args:
        check(libs, dts)
    if "--bench" in args:
        bench(libs, dts)
    if "--ncu" in args:  # a few launches of each library's wgmma path at 4 x 4096 for a profiler
        b, L, n = 4, 4096, 4 * 4096
        q = torch.randn(n, 32, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(n, 8, 128, device="cuda", dtype=torch.float16)
        cu = torch.arange(0, n + 1, L, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        for name, so in libs:
            for _ in range(3):
                call(so, "f16", q, k, k, out, cu, L, 128 ** -0.5)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
