//! Remove / rebuild padding: time and GB/s (packed rows read and written once, plus the
//! zeros of the padding for rebuild), next to a device copy of the same traffic; and the
//! on-device layout build (prefix sum + token map).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::padding::{bench_lengths, bytes, prepare, Dir, SEED};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::embedding::DeviceStatus;
use fl_kernels::padding::PackedLayout;
use fl_kernels::{f16, DeviceTensor, Gpu};

const SHAPES: &[(usize, usize, usize)] = &[(64, 512, 4096), (16, 2048, 4096), (8, 128, 4096)];

fn gathers(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    for (dir, name) in [
        (Dir::Remove, "remove_padding_f16"),
        (Dir::Rebuild, "rebuild_padding_f16"),
    ] {
        let mut g = c.benchmark_group(name);
        for &(batch, max_len, hidden) in SHAPES {
            let id = format!("b{batch}_l{max_len}_h{hidden}");
            let mut launch = prepare::<f16>(gpu, dir, batch, max_len, hidden).unwrap();
            let b = bytes::<f16>(dir, batch, max_len, hidden);
            g.throughput(Throughput::Bytes(b));
            g.bench_with_input(BenchmarkId::new("fl", &id), &b, |bch, _| {
                bch.iter_custom(|it| time_on_device(&s, it, &mut launch))
            });
            let mut cp = CopyProbe::new(gpu, b as usize / 2).unwrap();
            g.bench_with_input(BenchmarkId::new("copy", &id), &b, |bch, _| {
                bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
            });
        }
        g.finish();
    }
}

fn offsets(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group("padding_offsets");
    for &(batch, max_len) in &[(64usize, 512usize), (16, 2048), (4096, 512)] {
        let lengths =
            DeviceTensor::from_host(&s, &bench_lengths(batch, max_len, SEED), &[batch]).unwrap();
        let mut layout = PackedLayout::new(&s, batch, max_len).unwrap();
        let mut status = DeviceStatus::new(&s).unwrap();
        g.bench_with_input(
            BenchmarkId::new("fl", format!("b{batch}_l{max_len}")),
            &batch,
            |bch, _| {
                bch.iter_custom(|it| {
                    time_on_device(&s, it, || layout.compute(&s, &lengths, &mut status))
                })
            },
        );
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("padding") else {
        return;
    };
    gathers(c, &gpu);
    offsets(c, &gpu);
}

criterion_group! {
    name = group_main;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches
}
criterion_main!(group_main);
