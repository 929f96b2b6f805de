//! GEMM on cuBLASLt (`fl_blas::Blas::gemm`): time and TFLOP/s.
//!
//! Throughput is `Throughput::Elements(2·m·n·k)`: one "element" is one floating-point
//! operation (a multiply-add counts 2), so criterion's `Gelem/s` reads as GFLOP/s and
//! `Telem/s` as TFLOP/s. Shapes: 4096³ and the LLaMA-7B/13B prefill projections
//! m = 2048 tokens × n ∈ {4096, 11008, 12288} × k ∈ {4096, 11008}, in f16 and bf16, each
//! with cuBLASLt's heuristic choice (`heuristic`) and after `Blas::autotune` (`autotuned`).
//! A one-line TFLOP/s summary per case is also printed to stderr.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::bench_tensor;
use fl_bench::{gpu_or_skip, time_on_device};
use fl_blas::{Blas, GemmShape, GemmType};
use fl_kernels::{bf16, f16, DeviceTensor, Gpu};

fn shapes() -> Vec<(usize, usize, usize)> {
    let mut v = vec![(4096, 4096, 4096)];
    for n in [4096, 11008, 12288] {
        for k in [4096, 11008] {
            v.push((2048, n, k));
        }
    }
    v
}

/// Queues one GEMM; a failure panics (benches have no error path).
fn gemm<T: GemmType>(
    blas: &mut Blas,
    a: &DeviceTensor<T>,
    b: &DeviceTensor<T>,
    c: &mut DeviceTensor<T>,
) -> fl_kernels::Result<()> {
    if let Err(e) = blas.linear(a, b, None, c) {
        panic!("gemm failed: {e}");
    }
    Ok(())
}

fn gemm_group<T: GemmType>(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    let mut blas = Blas::new(gpu).unwrap();
    let mut g = c.benchmark_group(format!("gemm_{}", T::NAME));
    for (i, (m, n, k)) in shapes().into_iter().enumerate() {
        let a = bench_tensor::<T>(gpu, &[m, k], 2 * i as u64 + 1).unwrap();
        let b = bench_tensor::<T>(gpu, &[n, k], 2 * i as u64 + 2).unwrap();
        let mut out = DeviceTensor::<T>::zeros(&s, &[m, n]).unwrap();
        let flops = 2 * (m * n * k) as u64;
        let id = format!("{m}x{n}x{k}");
        g.throughput(Throughput::Elements(flops));
        for mode in ["heuristic", "autotuned"] {
            if mode == "autotuned" {
                let shape = GemmShape::new(m, n, k, T::DTYPE);
                let r = blas.autotune(&[shape], 8).unwrap();
                eprintln!(
                    "autotune {} {id}: {} candidates, heuristic {:.3} ms, best #{} {:.3} ms",
                    T::NAME,
                    r[0].candidates,
                    r[0].heuristic_ms,
                    r[0].best_index,
                    r[0].best_ms
                );
            }
            g.bench_with_input(BenchmarkId::new(mode, &id), &id, |bch, _| {
                bch.iter_custom(|it| time_on_device(&s, it, || gemm(&mut blas, &a, &b, &mut out)))
            });
            let t = time_on_device(&s, 20, || gemm(&mut blas, &a, &b, &mut out));
            let tflops = flops as f64 * 20.0 / t.as_secs_f64() / 1e12;
            eprintln!("gemm {} {id} {mode}: {tflops:.1} TFLOP/s", T::NAME);
        }
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("blas") else {
        return;
    };
    gemm_group::<f16>(c, &gpu);
    gemm_group::<bf16>(c, &gpu);
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_millis(800));
    targets = benches
}
criterion_main!(group);
