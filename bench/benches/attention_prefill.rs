//! Causal prefill attention: time and TFLOP/s at 512..16384 tokens per sequence, batch =
//! max(1, 16384 / len), 32 q heads / 8 kv heads, head_dim 128, f16 (bf16 at 4096, f32 at
//! 1024). Paged prefill (`attn_prefill_paged`, 16-token blocks): 8 x 512 new tokens over
//! 3,584 cached ones and 1 x 2,048 over none, f16 and bf16. Non-causal prefill
//! (`attn_prefill_bidir`, issue 35's encoder attention) at the BERT-base shape: 12 heads x 64,
//! 32 sentences of ragged lengths (uniform in 25-100% of 128 or 384, fixed), f16.
//!
//! Throughput is `Throughput::Elements(flops)` with the causal FLOPs counted once:
//! `4 · head_dim · q_heads · Σ_b L_b (L_b + 1) / 2` (`attention_prefill::prefill_flops`), and
//! every pair for the non-causal rows: `4 · head_dim · q_heads · Σ_b L_b²`
//! (`attention_prefill::prefill_bidirectional_flops`), so criterion's `Telem/s` reads as
//! TFLOP/s. A one-line TFLOP/s summary per case is also printed to stderr.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::attention_prefill::{
    flops, make, make_paged, paged_flops, paged_shape_key, shape, shape_key, PAGED_POINTS,
    PREFILL_LENS,
};
use fl_bench::ops::{bench_tensor, bench_values, Launch};
use fl_bench::{gpu_or_skip, time_on_device};
use fl_kernels::attention_prefill::{self, BidirectionalPrefillParams};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType, Gpu};

fn point<T: FloatDType>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    len: usize,
) {
    let (hq, hkv, d) = (32usize, 8usize, 128usize);
    let (batch, len) = shape(len);
    let f = flops(batch, len, hq, d);
    let launch = make::<T>(gpu, batch, len, hq, hkv, d).expect("allocate case");
    let id = format!("{}|{}", T::NAME, shape_key(batch, len, hq, hkv, d));
    measure(g, gpu, "attn_prefill", id, f, launch);
}

fn paged_point<T: FloatDType>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    (batch, q_len, prefix): (usize, usize, usize),
) {
    let (hq, hkv, d) = (32usize, 8usize, 128usize);
    let f = paged_flops(batch, q_len, prefix, hq, d);
    let launch = make_paged::<T>(gpu, (batch, q_len, prefix), hq, hkv, d).expect("allocate case");
    let id = format!(
        "{}|{}",
        T::NAME,
        paged_shape_key(batch, q_len, prefix, hq, hkv, d)
    );
    measure(g, gpu, "attn_prefill_paged", id, f, launch);
}

/// Non-causal rows: (batch, longest sentence) at the BERT-base shape.
const BERT_POINTS: [(usize, usize); 2] = [(32, 128), (32, 384)];

/// `batch` sentence lengths uniform in `max_len / 4 ..= max_len`, the same every run.
fn ragged_lens(batch: usize, max_len: usize) -> Vec<usize> {
    let lo = max_len / 4;
    bench_values(batch, 7)
        .into_iter()
        .map(|x| {
            let u = ((x.abs() - 0.05) / 0.95).clamp(0.0, 1.0) as f64; // [0, 1]
            (lo + (u * (max_len - lo) as f64).round() as usize).clamp(1, max_len)
        })
        .collect()
}

/// A prepared non-causal launch over the packed sentences `lens` (`heads` x `d`, MHA).
fn make_bidir<T: FloatDType>(
    gpu: &Gpu,
    lens: &[usize],
    heads: usize,
    d: usize,
) -> fl_kernels::Result<Launch> {
    let s = gpu.stream().clone();
    let total: usize = lens.iter().sum();
    let q = bench_tensor::<T>(gpu, &[total, heads, d], 1)?;
    let k = bench_tensor::<T>(gpu, &[total, heads, d], 2)?;
    let v = bench_tensor::<T>(gpu, &[total, heads, d], 3)?;
    let cu: Vec<i32> = std::iter::once(0)
        .chain(lens.iter().scan(0i32, |acc, &l| {
            *acc += l as i32;
            Some(*acc)
        }))
        .collect();
    let cu = DeviceTensor::from_host(&s, &cu, &[lens.len() + 1])?;
    let max_len = lens.iter().copied().max().unwrap_or(1);
    let params = BidirectionalPrefillParams::new(d, max_len);
    let mut out = DeviceTensor::<T>::zeros(&s, &[total, heads, d])?;
    Ok(Box::new(move || {
        attention_prefill::prefill_bidirectional(&s, &q, &k, &v, &cu, &mut out, &params)
    }))
}

fn bert_point<T: FloatDType>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    (batch, max_len): (usize, usize),
) {
    let (heads, d) = (12usize, 64usize);
    let lens = ragged_lens(batch, max_len);
    let f = attention_prefill::prefill_bidirectional_flops(&lens, heads, d);
    let launch = make_bidir::<T>(gpu, &lens, heads, d).expect("allocate case");
    let tokens: usize = lens.iter().sum();
    let id = format!(
        "{}|b{batch}xL{max_len}ragged{tokens}xh{heads}/{heads}xd{d}",
        T::NAME
    );
    measure(g, gpu, "attn_prefill_bidir", id, f, launch);
}

/// Times one prepared launch; `Telem/s` reads as TFLOP/s.
fn measure(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    name: &str,
    id: String,
    f: u64,
    mut launch: Launch,
) {
    let s = gpu.stream().clone();
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
            "{name} {id}: {:.3} ms, {:.1} TFLOP/s",
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
    for &pt in &PAGED_POINTS {
        paged_point::<f16>(&mut g, &gpu, pt);
    }
    paged_point::<bf16>(&mut g, &gpu, PAGED_POINTS[0]);
    for &pt in &BERT_POINTS {
        bert_point::<f16>(&mut g, &gpu, pt);
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
