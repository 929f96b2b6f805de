//! Decode attention: time and GB/s over the K/V bytes read, next to a device copy of the
//! same traffic. Shapes from `fl_bench::ops::attention::DECODE_SHAPES`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::{gpu_or_skip, ops, time_on_device, CopyProbe};

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("attention") else {
        return;
    };
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group("decode_attn");
    for case in ops::attention::cases() {
        let mut launch = (case.make)(&gpu).expect("allocate case");
        g.throughput(Throughput::Bytes(case.bytes));
        g.bench_with_input(BenchmarkId::new("fl", case.key()), &(), |b, _| {
            b.iter_custom(|it| time_on_device(&s, it, &mut launch))
        });
        let mut cp = CopyProbe::new(&gpu, (case.bytes / 2) as usize).expect("copy probe");
        g.bench_with_input(BenchmarkId::new("copy", case.key()), &(), |b, _| {
            b.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches
}
criterion_main!(group);
