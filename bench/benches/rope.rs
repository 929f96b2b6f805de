//! RoPE of Q [tokens, 32, 128] and K [tokens, 8, 128] in place: angles computed on the fly
//! (`fl`) and read from a cos/sin table (`fl_table`), next to a device copy of the same
//! traffic (bytes = Q and K read and written once, plus the positions). Positions as in the
//! op table: decode steps (<= 64 tokens, spread out) up to one 65536-token prefill.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::rope::{positions, MAX_POS, THETA};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::rope::{self, RopeParams, RopeStyle, RopeTable};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType};

const Q_HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;

fn group<T: FloatDType>(c: &mut Criterion, gpu: &fl_kernels::Gpu, table: &RopeTable) {
    let s = gpu.stream().clone();
    let params = RopeParams::new(HEAD_DIM, THETA);
    let interleaved = params.with_style(RopeStyle::Interleaved);
    let mut g = c.benchmark_group(format!("rope_{}", T::NAME));
    for &t in &[1usize, 64, 4096, 65_536] {
        let mut q = DeviceTensor::filled(&s, &[t, Q_HEADS, HEAD_DIM], T::from_f32(0.5)).unwrap();
        let mut k = DeviceTensor::filled(&s, &[t, KV_HEADS, HEAD_DIM], T::from_f32(0.25)).unwrap();
        let pos = DeviceTensor::from_host(&s, &positions(t), &[t]).unwrap();
        let bytes = 2 * t * (Q_HEADS + KV_HEADS) * HEAD_DIM * std::mem::size_of::<T>() + 4 * t;
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("fl", t), &t, |b, _| {
            b.iter_custom(|it| {
                time_on_device(&s, it, || {
                    rope::apply(&s, &mut q, &mut k, &pos, &params, None)
                })
            })
        });
        g.bench_with_input(BenchmarkId::new("fl_table", t), &t, |b, _| {
            b.iter_custom(|it| {
                time_on_device(&s, it, || {
                    rope::apply_with_table(&s, &mut q, &mut k, &pos, table, None)
                })
            })
        });
        if t == 65_536 {
            g.bench_with_input(BenchmarkId::new("fl_interleaved", t), &t, |b, _| {
                b.iter_custom(|it| {
                    time_on_device(&s, it, || {
                        rope::apply(&s, &mut q, &mut k, &pos, &interleaved, None)
                    })
                })
            });
        }
        let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", t), &t, |b, _| {
            b.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("rope") else {
        return;
    };
    let table = RopeTable::new(gpu.stream(), &RopeParams::new(HEAD_DIM, THETA), MAX_POS)
        .expect("rope table");
    group::<f16>(c, &gpu, &table);
    group::<bf16>(c, &gpu, &table);
}

criterion_group! {
    name = group_main;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches
}
criterion_main!(group_main);
