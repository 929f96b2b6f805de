//! Elementwise add and cast: time and GB/s (bytes read + written once), next to a device
//! copy of the same traffic.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::{bf16, elementwise, f16, DeviceTensor, FloatDType};

fn add_group<T: FloatDType>(c: &mut Criterion, gpu: &fl_kernels::Gpu) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("add_{}", T::NAME));
    // decode-sized (one token of hidden 4096) up to well past L2 (>= 256 MB moved)
    for &n in &[4096usize, 64 * 4096, 1 << 24, 1 << 26] {
        let a = DeviceTensor::filled(&s, &[n], T::from_f32(0.5)).unwrap();
        let b = DeviceTensor::filled(&s, &[n], T::from_f32(0.25)).unwrap();
        let mut o = DeviceTensor::zeros(&s, &[n]).unwrap();
        let bytes = 3 * n * std::mem::size_of::<T>();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("fl", n), &n, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || elementwise::add(&s, &a, &b, &mut o)))
        });
        let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", n), &n, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn cast_group(c: &mut Criterion, gpu: &fl_kernels::Gpu) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group("cast_f32_to_bf16");
    for &n in &[1usize << 20, 1 << 26] {
        let a = DeviceTensor::filled(&s, &[n], 0.5f32).unwrap();
        let mut o = DeviceTensor::<bf16>::zeros(&s, &[n]).unwrap();
        g.throughput(Throughput::Bytes((n * 6) as u64));
        g.bench_with_input(BenchmarkId::new("fl", n), &n, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || elementwise::cast(&s, &a, &mut o)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("elementwise") else {
        return;
    };
    add_group::<f32>(c, &gpu);
    add_group::<f16>(c, &gpu);
    add_group::<bf16>(c, &gpu);
    cast_group(c, &gpu);
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_millis(800));
    targets = benches
}
criterion_main!(group);
