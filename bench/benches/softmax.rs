//! Softmax over the last dimension (same dtype out, and f32 out), temperature 1: time and
//! GB/s (input read + output written once), next to a device copy of the same traffic.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::bench_tensor;
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::softmax::{self, SoftmaxWorkspace};
use fl_kernels::{bf16, DeviceTensor, FloatDType, Gpu, Result};

/// rows x n: one and 64 sequences over the 32000 and 128256 vocabularies, 256 x 128256
/// (past L2: 64 MiB of bf16 logits in, 128 MiB of f32 out) and 2048 x 128256 (1 GB moved
/// bf16 -> bf16, 1.5 GB bf16 -> f32).
const SIZES: &[(usize, usize)] = &[
    (1, 32000),
    (64, 32000),
    (1, 128_256),
    (64, 128_256),
    (256, 128_256),
    (2048, 128_256),
];

type Op<T, O> = fn(
    &Arc<CudaStream>,
    &DeviceTensor<T>,
    &mut DeviceTensor<O>,
    &mut SoftmaxWorkspace,
) -> Result<()>;

fn group<T: FloatDType, O: FloatDType>(
    c: &mut Criterion,
    gpu: &Gpu,
    name: &str,
    sizes: &[(usize, usize)],
    op: Op<T, O>,
) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("{name}_{}", T::NAME));
    for &(rows, n) in sizes {
        let id = format!("{rows}x{n}");
        let x = bench_tensor::<T>(gpu, &[rows, n], 1).unwrap();
        let mut y = DeviceTensor::<O>::zeros(&s, &[rows, n]).unwrap();
        let mut ws = SoftmaxWorkspace::new();
        ws.reserve(&s, rows, n).unwrap();
        let bytes = rows * n * (std::mem::size_of::<T>() + std::mem::size_of::<O>());
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || op(&s, &x, &mut y, &mut ws)))
        });
        let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn same<T: FloatDType>(
    s: &Arc<CudaStream>,
    x: &DeviceTensor<T>,
    y: &mut DeviceTensor<T>,
    ws: &mut SoftmaxWorkspace,
) -> Result<()> {
    softmax::softmax(s, x, 1.0, y, Some(ws))
}

fn to_f32<T: FloatDType>(
    s: &Arc<CudaStream>,
    x: &DeviceTensor<T>,
    y: &mut DeviceTensor<f32>,
    ws: &mut SoftmaxWorkspace,
) -> Result<()> {
    softmax::softmax_f32(s, x, 1.0, y, Some(ws))
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("softmax") else {
        return;
    };
    group::<bf16, bf16>(c, &gpu, "softmax", SIZES, same::<bf16>);
    group::<bf16, f32>(c, &gpu, "softmax_f32out", SIZES, to_f32::<bf16>);
    group::<f32, f32>(
        c,
        &gpu,
        "softmax",
        &[(1, 128_256), (4096, 4096)],
        same::<f32>,
    );
}

criterion_group! {
    name = group_softmax;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(500));
    targets = benches
}
criterion_main!(group_softmax);
