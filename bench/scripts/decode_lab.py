#!/usr/bin/env python3
"""Decode-attention lab: our fl_attention_decode (from a shared library built by
bench/gpu/build_decode_lab.sh) side by side with torch's SDPA, in one process.

    python3 decode_lab.py LIB.so [--check] [--bench] [--prof] [--variants 0,1,2] [--dtypes f16]

The lab build carries several configurations of the tensor-core GQA kernel (head_dim 128,
4 query heads per kv head); FL_GQA_MMA (read on every call) picks one: 0 is the shipped
choice ("auto"), i >= 1 variant i of FL_MMA_VARIANTS in kernels/attention_decode.cu. Other
shapes always take the shipped choice.
--check: ragged lengths, windows and a paged cache, GQA 32/8 (and 32/32, 32/4), against a
         float64 reference (rel L2 and max abs error per case, FAIL over 1e-2), every variant.
--bench: the issue-6 decode shapes (GQA 32/8 and MHA, d 128): microseconds per call (median
         of 5 loops of back-to-back calls between CUDA events), % of the device copy measured
         in the same process, and the ratio to torch SDPA (eager).
--prof:  per-kernel times (torch.profiler) of torch and of each variant at the GQA shapes.
"""
import ctypes, os, sys

import torch
import torch.nn.functional as F

DT = {"f16": (torch.float16, 1), "bf16": (torch.bfloat16, 2)}
NAMES = ["auto", "w1s2 pad", "w4s2 swz", "w8s2 swz", "w4s3 swz", "w12s2 swz", "w8s3 swz"]


class Args(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("batch", ctypes.c_int32), ("q_heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("seq_lens", ctypes.c_void_p),
                ("max_seq_len", ctypes.c_int32), ("layout", ctypes.c_int),
                ("kv_block_size", ctypes.c_int32), ("block_table", ctypes.c_void_p),
                ("max_blocks_per_seq", ctypes.c_int32), ("num_blocks", ctypes.c_int32),
                ("scale", ctypes.c_float), ("window", ctypes.c_int32),
                ("num_splits", ctypes.c_int32), ("sm_count", ctypes.c_int32)]


def load(lib):
    so = ctypes.CDLL(os.path.abspath(lib))
    so.fl_attention_decode.restype = ctypes.c_int
    so.fl_attention_decode.argtypes = [ctypes.POINTER(Args), ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    so.fl_attention_decode_workspace_size.restype = ctypes.c_int64
    so.fl_attention_decode_workspace_size.argtypes = [ctypes.POINTER(Args)]
    so.fl_attention_decode_num_splits.restype = ctypes.c_int32
    so.fl_attention_decode_num_splits.argtypes = [ctypes.POINTER(Args)]
    return so


SMS = None


class Call:
    """One prepared fl_attention_decode call (args and workspace built once)."""

    def __init__(self, so, dt, q, k, v, out, lens, max_len, scale, window=0, table=None, block=0):
        global SMS
        if SMS is None:
            SMS = torch.cuda.get_device_properties(0).multi_processor_count
        self.so = so
        paged = table is not None
        self.keep = (q, k, v, out, lens, table)
        self.a = Args(DT[dt][1], q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.data_ptr(), k.data_ptr(),
                      v.data_ptr(), out.data_ptr(), lens.data_ptr(), max_len, 1 if paged else 0,
                      block if paged else k.shape[2], table.data_ptr() if paged else None,
                      table.shape[1] if paged else 0, k.shape[0] if paged else 0, scale, window, 0, SMS)
        self.prepare()

    def prepare(self):  # the workspace depends on the variant (its CTAs per SM set the split)
        n = self.so.fl_attention_decode_workspace_size(ctypes.byref(self.a))
        if n < 0:
            raise RuntimeError("bad decode args")
        self.splits = self.so.fl_attention_decode_num_splits(ctypes.byref(self.a))
        self.ws = torch.empty(max(n, 16), dtype=torch.uint8, device="cuda")
        self.wsn = n

    def __call__(self):
        st = self.so.fl_attention_decode(ctypes.byref(self.a), ctypes.c_void_p(self.ws.data_ptr()), self.wsn,
                                         ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if st != 0:
            raise RuntimeError(f"fl_attention_decode returned {st}")


def set_variant(i):
    os.environ["FL_GQA_MMA"] = str(i)


def reference(q, k, v, lens, scale, window):
    b, hq, d = q.shape
    rep = hq // k.shape[1]
    out = torch.zeros(b, hq, d, dtype=torch.float64, device=q.device)
    for i, n in enumerate(lens):
        lo = max(0, n - window) if window > 0 else 0
        if n <= lo:
            continue
        ks = k[i, :, lo:n].double().repeat_interleave(rep, 0)  # [hq, n, d]
        vs = v[i, :, lo:n].double().repeat_interleave(rep, 0)
        s = torch.einsum("hd,hnd->hn", q[i].double(), ks) * scale
        out[i] = torch.einsum("hn,hnd->hd", torch.softmax(s, -1), vs)
    return out


def check(so, dts, variants):
    cases = [([1, 7, 129, 4095, 300], 32, 8, 0, 0), ([33000], 32, 8, 0, 0), ([5000, 17, 2048], 32, 8, 1000, 0),
             ([1, 7, 129, 4095], 32, 8, 0, 16), ([3000, 9], 32, 8, 100, 32), ([700, 4096], 32, 32, 0, 0),
             ([129, 2000], 32, 4, 0, 0), ([0, 5], 32, 8, 0, 0)]
    bad = 0
    for dt in dts:
        for lens, hq, hk, win, block in cases:
            torch.manual_seed(sum(lens) + hq + hk + win + block)
            b, cap = len(lens), max(max(lens), 1)
            q = torch.randn(b, hq, 128, device="cuda", dtype=DT[dt][0])
            k = torch.randn(b, hk, cap, 128, device="cuda", dtype=DT[dt][0])
            v = torch.randn(b, hk, cap, 128, device="cuda", dtype=DT[dt][0])
            ln = torch.tensor(lens, dtype=torch.int32, device="cuda")
            scale = 128 ** -0.5
            ref = reference(q, k, v, lens, scale, win)
            table = None
            if block:  # scatter the contiguous cache into a shuffled block pool
                nb = (cap + block - 1) // block
                perm = torch.randperm(b * nb, device="cuda").to(torch.int32)
                table = perm.view(b, nb).contiguous()
                pad = nb * block - cap
                kp = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(b, hk, nb, block, 128).permute(0, 2, 1, 3, 4)
                vp = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(b, hk, nb, block, 128).permute(0, 2, 1, 3, 4)
                kpool = torch.empty(b * nb, hk, block, 128, device="cuda", dtype=k.dtype)
                vpool = torch.empty_like(kpool)
                kpool[perm.long()] = kp.reshape(b * nb, hk, block, 128)
                vpool[perm.long()] = vp.reshape(b * nb, hk, block, 128)
                kk, vv = kpool, vpool
            else:
                kk, vv = k, v
            for vi in variants:
                set_variant(vi)
                out = torch.full_like(q, float("nan"))
                c = Call(so, dt, q, kk, vv, out, ln, cap, scale, win, table, block)
                c()
                torch.cuda.synchronize()
                err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                mx = (out.double() - ref).abs().max().item()
                ok = (err < 1e-2 or ref.norm().item() == 0 and mx == 0) and not torch.isnan(out).any().item()
                bad += not ok
                print(f"check {NAMES[vi]:9s} {dt} lens={lens if len(lens) < 4 else str(len(lens)) + ' seqs'} "
                      f"h{hq}/{hk} w{win} blk{block} splits {c.splits}: rel L2 {err:.2e} max abs {mx:.2e} "
                      f"{'ok' if ok else 'FAIL'}", flush=True)
    print(f"check: {'PASS' if bad == 0 else f'FAIL ({bad} cases)'}")


def loop_time(fs, target_ms=3.0):
    """`fs`: one callable, or several called in turn (rotated inputs, as optable)."""
    fs = fs if isinstance(fs, list) else [fs]
    for f in fs:
        f()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fs[0]()
    b.record()
    b.synchronize()
    n = max(5, min(2000, int(target_ms / max(a.elapsed_time(b), 1e-3))))
    ts = []
    for _ in range(5):
        a.record()
        for i in range(n):
            fs[i % len(fs)]()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / n)
    ts.sort()
    return ts[2] * 1e3  # us


def copy_tbps():
    x = torch.empty(1 << 29, dtype=torch.float16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    us = loop_time(lambda: y.copy_(x), 30.0)
    return 2 * x.numel() * 2 / us / 1e6


SHAPES = [(1, 32768, 8), (4, 16384, 8), (16, 8192, 8), (64, 4096, 8), (1, 4096, 8), (1, 32768, 32), (4, 16384, 32),
          (16, 8192, 32), (64, 4096, 32), (1, 4096, 32)]


def decode_inputs(b, L, hk, dt):
    """Inputs of one timed shape (32 q heads, d 128, every sequence L long): (bytes moved,
    [(q, k, v, out)] -- two instances, called in turn, under 256 MB as optable does -- lens,
    torch SDPA callables over the same instances)."""
    esz = torch.finfo(DT[dt][0]).bits // 8
    byts = 2 * b * hk * L * 128 * esz + 2 * b * 32 * 128 * esz
    sets = []
    for _ in range(2 if byts < (256 << 20) else 1):
        q = torch.randn(b, 32, 128, device="cuda", dtype=DT[dt][0])
        k = torch.randn(b, hk, L, 128, device="cuda", dtype=DT[dt][0])
        v = torch.randn(b, hk, L, 128, device="cuda", dtype=DT[dt][0])
        sets.append((q, k, v, torch.empty_like(q)))
    ln = torch.full((b,), L, dtype=torch.int32, device="cuda")
    tfs = [lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.view(b, 32, 1, 128), k, v, enable_gqa=hk != 32)
           for q, k, v, _ in sets]
    return byts, sets, ln, tfs


def bench(so, dts, variants):
    cp = copy_tbps()
    x = torch.empty(1 << 29, dtype=torch.float16, device="cuda").uniform_()
    rd = x.numel() * 2 / loop_time(lambda: x.sum(dtype=torch.float32), 30.0) / 1e6
    del x
    print(f"bench: device copy {cp:.3f} TB/s (1 GiB, read + write); read-only {rd:.3f} TB/s (torch sum of 1 GiB)")
    print(" | ".join(["dtype", "b x L kv", "torch us"] + [f"{NAMES[v]} us (%copy, x torch, splits)" for v in variants]))
    for dt in dts:
        for b, L, hk in SHAPES:
            torch.manual_seed(b + L)
            byts, sets, ln, tfs = decode_inputs(b, L, hk, dt)
            tus = loop_time(tfs)
            row = [dt, f"{b}x{L} kv{hk}", f"{tus:.1f}"]
            for vi in (variants if hk == 8 else variants[:1]):
                set_variant(vi)
                cs = [Call(so, dt, q, k, v, out, ln, L, 128 ** -0.5) for q, k, v, out in sets]
                c = cs[0]
                us = loop_time(cs)
                row.append(f"{us:.1f} ({byts / us / 1e6 / cp * 100:.0f}%, {tus / us:.3f}x, s{c.splits})")
            print(" | ".join(row), flush=True)


def splits(so, dts):
    """Forced split counts against the automatic one (s0 = auto), at the shapes where the
    automatic choice runs 128 CTAs on 132 SMs. (FL_ATTN_MHA=cuda|mma, read once per process,
    picks the MHA kernel.)"""
    cp = copy_tbps()
    print(f"splits: device copy {cp:.3f} TB/s")
    rows = [(16, 8192, 8, [0, 2, 33, 66]), (64, 4096, 8, [0, 2, 33]), (1, 32768, 8, [0, 33, 66]),
            (4, 16384, 8, [0, 33]), (64, 4096, 32, [0, 2]), (16, 8192, 32, [0]), (1, 32768, 32, [0, 33])]
    for dt in dts:
        for b, L, hk, forced in rows:
            byts, sets, ln, tfs = decode_inputs(b, L, hk, dt)
            row = [dt, f"{b}x{L} kv{hk}", f"torch {loop_time(tfs):.1f}"]
            for sp in forced:
                set_variant(0)
                cs = []
                for q, k, v, out in sets:
                    c = Call(so, dt, q, k, v, out, ln, L, 128 ** -0.5)
                    c.a.num_splits = sp
                    c.prepare()
                    cs.append(c)
                us = loop_time(cs)
                row.append(f"s{cs[0].splits}: {us:.1f} ({byts / us / 1e6 / cp * 100:.0f}%)")
            print(" | ".join(row), flush=True)


def prof(so, variants):
    from torch.profiler import profile, ProfilerActivity
    for b, L, hk in SHAPES[:4]:
        q = torch.randn(b, 32, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(b, hk, L, 128, device="cuda", dtype=torch.float16)
        v = torch.randn(b, hk, L, 128, device="cuda", dtype=torch.float16)
        ln = torch.full((b,), L, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        qt = q.view(b, 32, 1, 128)
        fns = [("torch", lambda: F.scaled_dot_product_attention(qt, k, v, enable_gqa=True))]
        for vi in variants:
            set_variant(vi)
            fns.append((NAMES[vi], Call(so, "f16", q, k, v, out, ln, L, 128 ** -0.5)))
        for name, f in fns:
            if name != "torch":
                set_variant(NAMES.index(name))
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(10):
                    f()
                torch.cuda.synchronize()
            ks = {}
            for e in p.events():
                if e.device_type.name == "CUDA":
                    ks.setdefault(e.name, []).append(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0))
            desc = "; ".join(f"{n[:60]} {sum(t) / len(t):.1f} us x{len(t) // 10}" for n, t in ks.items())
            print(f"prof {b}x{L} kv{hk} {name}: {desc}", flush=True)


def main():
    args = sys.argv[1:]
    lib = [a for a in args if a.endswith(".so")][0]
    dts, variants = "f16", list(range(len(NAMES)))
    for i, a in enumerate(args):
        if a == "--dtypes":
            dts = args[i + 1]
        if a == "--variants":
            variants = [int(x) for x in args[i + 1].split(",")]
    so = load(lib)
    if "--check" in args:
        check(so, dts.split(","), variants)
    if "--bench" in args:
        bench(so, dts.split(","), variants)
    if "--prof" in args:
        prof(so, variants)
    if "--splits" in args:
        splits(so, dts.split(","))


if __name__ == "__main__":
    main()
