//! RMSNorm, fused residual-add + RMSNorm and LayerNorm: time and GB/s (bytes read + written
//! once), next to a device copy of the same traffic.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::bench_tensor;
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::{bf16, f16, norm, DeviceTensor, FloatDType, Gpu};

/// rows x hidden: decode sizes (1, 16, 64 tokens of 4096 / 8192) and one past L2 (2 GiB moved
/// at 65536 x 8192 in 2-byte types).
const SIZES: &[(usize, usize)] = &[
    (1, 4096),
    (16, 4096),
    (64, 4096),
    (1, 8192),
    (64, 8192),
    (65536, 8192),
];

#[derive(Clone, Copy)]
enum Op {
    Rms,
    AddRms,
    Layer,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Rms => "rms_norm",
            Op::AddRms => "add_rms_norm",
            Op::Layer => "layer_norm",
        }
    }
}

fn group<T: FloatDType>(c: &mut Criterion, gpu: &Gpu, op: Op, sizes: &[(usize, usize)]) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("{}_{}", op.name(), T::NAME));
    let es = std::mem::size_of::<T>();
    for &(rows, h) in sizes {
        let id = format!("{rows}x{h}");
        let x = bench_tensor::<T>(gpu, &[rows, h], 1).unwrap();
        let w = bench_tensor::<T>(gpu, &[h], 2).unwrap();
        let b = bench_tensor::<T>(gpu, &[h], 3).unwrap();
        let mut res = bench_tensor::<T>(gpu, &[rows, h], 4).unwrap();
        let mut y = DeviceTensor::<T>::zeros(&s, &[rows, h]).unwrap();
        // Bytes that must move: the row tensors once each, the weights (and bias) once.
        let row_bytes = rows * h * es;
        let bytes = match op {
            Op::Rms => 2 * row_bytes + h * es,
            Op::AddRms => 4 * row_bytes + h * es,
            Op::Layer => 2 * row_bytes + 2 * h * es,
        };
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
            bch.iter_custom(|it| {
                time_on_device(&s, it, || match op {
                    Op::Rms => norm::rms_norm(&s, &x, &w, 1e-5, &mut y),
                    Op::AddRms => norm::add_rms_norm(&s, &x, &mut res, &w, 1e-5, &mut y),
                    Op::Layer => norm::layer_norm(&s, &x, &w, Some(&b), 1e-5, &mut y),
                })
            })
        });
        let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("norm") else {
        return;
    };
    group::<f16>(c, &gpu, Op::Rms, SIZES);
    group::<bf16>(c, &gpu, Op::Rms, SIZES);
    group::<f32>(c, &gpu, Op::Rms, &[(1, 4096), (65536, 4096)]);
    group::<bf16>(c, &gpu, Op::AddRms, SIZES);
    group::<bf16>(c, &gpu, Op::Layer, &[(1, 4096), (65536, 8192)]);
}

criterion_group! {
    name = group_norm;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(500));
    targets = benches
}
criterion_main!(group_norm);
