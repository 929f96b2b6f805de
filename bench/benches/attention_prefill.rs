//! Causal prefill attention: time and TFLOP/s at 512..16384 tokens per sequence, batch =
//! max(1, 16384 / len), 32 q heads / 8 kv heads, head_dim 128, f16 (bf16 at 4096, f32 at
//! 1024).
//!
//! Throughput is `Throughput::Elements(flops)` with the causal FLOPs counted once:
//! `4 · head_dim · q_heads · Σ_b L_b (L_b + 1) / 2` (`attention_prefill::prefill_flops`), so
//! criterion's `Telem/s` reads as TFLOP/s. A one-line TFLOP/s summary per case is also
//! printed to stderr.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::attention_prefill::{flops, make, shape, shape_key, PREFILL_LENS};
use fl_bench::{gpu_or_skip, time_on_device};
use fl_kernels::{bf16, f16, FloatDType, Gpu};

fn point<T: FloatDType>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    len: usize,
) {
    let s = gpu.stream().clone();
    let (hq, hkv, d) = (32usize, 8usize, 128usize);
    let (batch, len) = shape(len);
    let f = flops(batch, len, hq, d);
    let mut launch = make::<T>(gpu, batch, len, hq, hkv, d).expect("allocate case");
    let id = format!("{}|{}", T::NAME, shape_key(batch, len, hq, hkv, d));
    g.throughput(Throughput::Elements(f));
    let mut last = std::time::Duration::ZERO;
    let mut iters = 0u64;
    g.bench_with_input(BenchmarkId::new("fl", &id), &(), |b, _| {
        b.iter_custom(|it| {
            let t = time_on_device(&s, it, &mut launch);
            last = t;
            iters = it;
            t
        })
    });
    if iters > 0 {
        let secs = last.as_secs_f64() / iters as f64;
        eprintln!(
            "attn_prefill {id}: {:.3} ms, {:.1} TFLOP/s",
            secs * 1e3,
            f as f64 / secs / 1e12
        );
    }
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("attention_prefill") else {
        return;
    };
    let mut g = c.benchmark_group("attn_prefill");
    for &len in &PREFILL_LENS {
        point::<f16>(&mut g, &gpu, len);
    }
    point::<bf16>(&mut g, &gpu, 4096);
    point::<f32>(&mut g, &gpu, 1024);
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
