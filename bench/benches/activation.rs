//! SwiGLU (fused [gate | up] and two inputs), GELU (tanh, erf; with bias) and bias add:
//! time and GB/s (bytes read + written once), next to a device copy of the same traffic.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::bench_tensor;
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::activation::{self, GeluKind};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType, Gpu};

/// Token counts: decode (1, 16, 64) and a prefill of 8192 (>= 256 MB moved).
const ROWS: &[usize] = &[1, 16, 64, 8192];
/// LLaMA-2-7B and LLaMA-3-8B intermediate sizes.
const INTER: &[usize] = &[11_008, 14_336];

fn copy_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    gpu: &Gpu,
    id: &str,
    bytes: usize,
) {
    let s = gpu.stream().clone();
    let mut cp = CopyProbe::new(gpu, bytes / 2).unwrap();
    g.bench_with_input(BenchmarkId::new("copy", id), &bytes, |bch, _| {
        bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
    });
}

fn swiglu_group<T: FloatDType>(c: &mut Criterion, gpu: &Gpu, fused: bool) {
    let s = gpu.stream().clone();
    let name = if fused { "swiglu_fused" } else { "swiglu" };
    let mut g = c.benchmark_group(format!("{name}_{}", T::NAME));
    for &inter in INTER {
        for &rows in ROWS {
            let id = format!("{rows}x{inter}");
            let bytes = 3 * rows * inter * std::mem::size_of::<T>();
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut o = DeviceTensor::<T>::zeros(&s, &[rows, inter]).unwrap();
            if fused {
                let x = bench_tensor::<T>(gpu, &[rows, 2 * inter], 1).unwrap();
                g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
                    bch.iter_custom(|it| {
                        time_on_device(&s, it, || activation::swiglu_fused(&s, &x, &mut o))
                    })
                });
            } else {
                let gate = bench_tensor::<T>(gpu, &[rows, inter], 1).unwrap();
                let up = bench_tensor::<T>(gpu, &[rows, inter], 2).unwrap();
                g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
                    bch.iter_custom(|it| {
                        time_on_device(&s, it, || activation::swiglu(&s, &gate, &up, &mut o))
                    })
                });
            }
            copy_bench(&mut g, gpu, &id, bytes);
        }
    }
    g.finish();
}

/// `None`: bias add; `Some(kind)`: GELU with a bias.
fn bias_group<T: FloatDType>(c: &mut Criterion, gpu: &Gpu, kind: Option<GeluKind>) {
    let s = gpu.stream().clone();
    let name = match kind {
        None => "bias_add".to_string(),
        Some(k) => format!("gelu_{}", k.name()),
    };
    let mut g = c.benchmark_group(format!("{name}_{}", T::NAME));
    let cols = 4096;
    for &rows in &[1usize, 64, 16_384] {
        let id = format!("{rows}x{cols}");
        let bytes = (2 * rows * cols + cols) * std::mem::size_of::<T>();
        g.throughput(Throughput::Bytes(bytes as u64));
        let x = bench_tensor::<T>(gpu, &[rows, cols], 1).unwrap();
        let b = bench_tensor::<T>(gpu, &[cols], 2).unwrap();
        let mut o = DeviceTensor::<T>::zeros(&s, &[rows, cols]).unwrap();
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
            bch.iter_custom(|it| {
                time_on_device(&s, it, || match kind {
                    None => activation::bias_add(&s, &x, &b, &mut o),
                    Some(k) => activation::gelu(&s, &x, Some(&b), &mut o, k),
                })
            })
        });
        copy_bench(&mut g, gpu, &id, bytes);
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("activation") else {
        return;
    };
    swiglu_group::<f16>(c, &gpu, true);
    swiglu_group::<bf16>(c, &gpu, true);
    swiglu_group::<f16>(c, &gpu, false);
    swiglu_group::<bf16>(c, &gpu, false);
    bias_group::<f16>(c, &gpu, Some(GeluKind::Tanh));
    bias_group::<f16>(c, &gpu, Some(GeluKind::Erf));
    bias_group::<f16>(c, &gpu, None);
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(500));
    targets = benches
}
criterion_main!(group);
