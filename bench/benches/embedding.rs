//! Embedding lookup: time and GB/s (each output row read from the table and written once),
//! next to a device copy of the same traffic.

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use fl_bench::ops::embedding::{prepare, prepare_quant, quant_bytes, VOCAB};
use fl_bench::ops::Launch;
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::gemv::QuantFormat;
use fl_kernels::{bf16, f16, FloatDType, Gpu};

/// One prepared launch as "fl" and a copy of the same `bytes` (read + written) as "copy".
fn fl_and_copy(
    g: &mut BenchmarkGroup<'_, WallTime>,
    gpu: &Gpu,
    id: &str,
    bytes: usize,
    mut launch: Launch,
) {
    let s = gpu.stream().clone();
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_with_input(BenchmarkId::new("fl", id), &bytes, |bch, _| {
        bch.iter_custom(|it| time_on_device(&s, it, &mut launch))
    });
    let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
    g.bench_with_input(BenchmarkId::new("copy", id), &bytes, |bch, _| {
        bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
    });
}

fn group<T: FloatDType>(c: &mut Criterion, gpu: &Gpu, sizes: &[(usize, usize)]) {
    let mut g = c.benchmark_group(format!("embedding_{}", T::NAME));
    for &(n, hidden) in sizes {
        let launch = prepare::<T>(gpu, n, hidden).unwrap();
        let bytes = n * hidden * 2 * std::mem::size_of::<T>();
        fl_and_copy(
            &mut g,
            gpu,
            &format!("n{n}_h{hidden}_v{VOCAB}"),
            bytes,
            launch,
        );
    }
    g.finish();
}

/// Lookups straight from quantised tables (`gemv::embedding`, f16 out) beside a copy of the
/// same traffic (the rows' quantised bytes read, f16 written).
fn quant_group(c: &mut Criterion, gpu: &Gpu, n: usize, hidden: usize) {
    let mut g = c.benchmark_group("embedding_quant_f16");
    for format in [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ] {
        let id = format!("n{n}_h{hidden}_v{VOCAB}_{}", format.name());
        let launch = prepare_quant(gpu, n, hidden, format).unwrap();
        fl_and_copy(&mut g, gpu, &id, quant_bytes(n, hidden, format), launch);
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("embedding") else {
        return;
    };
    // decode sizes (1, 16, 64 tokens) up to past L2 (65536 x 4096 moves 1 GiB)
    group::<f16>(
        c,
        &gpu,
        &[
            (1, 4096),
            (16, 8192),
            (64, 4096),
            (4096, 4096),
            (65536, 4096),
        ],
    );
    group::<bf16>(c, &gpu, &[(65536, 4096)]);
    quant_group(c, &gpu, 4096, 4096);
}

criterion_group! {
    name = group_main;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches
}
criterion_main!(group_main);
