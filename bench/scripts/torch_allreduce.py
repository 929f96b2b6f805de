#!/usr/bin/env python3
"""NCCL all-reduce through PyTorch (one process per GPU, loopback rendezvous): the time and bus
bandwidth of an in-place sum all-reduce per message size, for comparison with `fl bench --tp`'s
own all-reduce timing of the decode step's [batch, hidden] messages.

    python3 torch_allreduce.py [--gpus 2] [--dtype f16] [--sizes 8192,65536,...]

Bus bandwidth as nccl-tests defines it: 2 (n - 1) / n * bytes / time.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, n, sizes, dtype, iters, q):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n,
                            init_method="tcp://127.0.0.1:29533")
    rows = []
    for elems in sizes:
        x = torch.ones(elems, dtype=dtype, device="cuda")
        for _ in range(10):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            dist.all_reduce(x)
        e.record()
        torch.cuda.synchronize()
        t = s.elapsed_time(e) / 1e3 / iters
        rows.append((elems, t))
    # CUDA graph of the same small all-reduces (what a captured decode step replays).
    graph_rows = []
    for elems in sizes[:3]:
        x = torch.ones(elems, dtype=dtype, device="cuda")
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for _ in range(3):
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(st)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                dist.all_reduce(x)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        graph_rows.append((elems, s.elapsed_time(e) / 1e3 / 200))
    if rank == 0:
        q.put((rows, graph_rows))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32"])
    ap.add_argument("--sizes", default="5120,8192,327680,524288,4194304,268435456")
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    sizes = [int(s) for s in a.sizes.split(",")]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a.gpus, sizes, dtype, a.iters, q), nprocs=a.gpus, join=True)
    rows, graph_rows = q.get()
    esz = torch.tensor([], dtype=dtype).element_size()
    n = a.gpus
    print(f"torch {torch.__version__} NCCL {torch.cuda.nccl.version()} all-reduce, {n} GPUs, {a.dtype}")
    print("| elements | bytes | us (eager) | bus GB/s | us (CUDA graph) |")
    print("|---:|---:|---:|---:|---:|")
    g = dict(graph_rows)
    for elems, t in rows:
        b = elems * esz
        bus = 2 * (n - 1) / n * b / t / 1e9
        gt = f"{g[elems] * 1e6:.1f}" if elems in g else "-"
        print(f"| {elems} | {b} | {t * 1e6:.1f} | {bus:.1f} | {gt} |")


if __name__ == "__main__":
    main()
