//! Dense f16 GEMV for decode (`fl_kernels::gemv_dense`): time and GB/s on the weight bytes,
//! next to cuBLAS (`fl_blas::Blas::linear`, f16) at the same m and a device copy of the same
//! bytes, in the same run.
//!
//! Shapes (n x k) of LLaMA-7B: 4096x4096 (q/k/v/o), 12288x4096 (fused qkv), 22016x4096
//! (stacked gate/up), 4096x11008 (down), 32000x4096 (LM head) and a small 1024x4096 (a GQA
//! k/v projection), at m = 1 and 16 tokens. Variants: `linear` everywhere; `linear_swiglu`
//! on the gate/up weight (out [m, 11008]); `linear_add` on the two shapes that feed the
//! residual (o and down projections); `rms_norm_linear` (next to `rms_norm+linear`, the two
//! kernels it replaces) on the qkv weight and `rms_norm_linear_swiglu` on the gate/up weight;
//! on the qkv weight also `rms_norm_linear_rope_append` (RoPE + KV-cache append fused into
//! the epilogue, 32 q and 32 kv heads of 128, each token its own sequence) next to
//! `rms_norm_linear+rope_append` (the two kernels it replaces). Throughput is `Throughput::Bytes(weight + x + output
//! (+ the residual read))`. Weights (and copy buffers) rotate through enough copies to move
//! at least 256 MB per cycle, so each call reads its weight from HBM as in a real decode step.
//! One summary line per variant goes to stderr: us, GB/s on the weight bytes, % of the copy
//! bandwidth, speed-up vs cuBLAS.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::bench_tensor;
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_blas::Blas;
use fl_kernels::gemv_dense::QkvRopeAppend;
use fl_kernels::kv_cache::{self, CacheLayout, KvCache, QkvSplit, RopeAppend, TokenSlots};
use fl_kernels::rope::{RopeParams, RopeStyle};
use fl_kernels::{f16, gemv_dense, DeviceTensor, Gpu, Result};

const SHAPES: &[(usize, usize)] = &[
    (4096, 4096),
    (12288, 4096),
    (22016, 4096),
    (4096, 11008),
    (32000, 4096),
    (1024, 4096),
];
const ROTATE_BYTES: usize = 256 << 20;
const ITERS: u64 = 50;

/// How many copies of `bytes` make up >= ROTATE_BYTES.
fn copies(bytes: usize) -> usize {
    ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, 64)
}

fn gbps(bytes: usize, t: std::time::Duration, iters: u64) -> f64 {
    bytes as f64 * iters as f64 / t.as_secs_f64() / 1e9
}

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Linear,
    Swiglu,
    Add,
    NormLinear,
    NormThenLinear,
    NormSwiglu,
    NormRopeAppend,
    NormThenRopeAppend,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Linear => "linear",
            Variant::Swiglu => "linear_swiglu",
            Variant::Add => "linear_add",
            Variant::NormLinear => "rms_norm_linear",
            Variant::NormThenLinear => "rms_norm+linear",
            Variant::NormSwiglu => "rms_norm_linear_swiglu",
            Variant::NormRopeAppend => "rms_norm_linear_rope_append",
            Variant::NormThenRopeAppend => "rms_norm_linear+rope_append",
        }
    }
}

fn variants(n: usize) -> Vec<Variant> {
    match n {
        22016 => vec![Variant::Linear, Variant::Swiglu, Variant::NormSwiglu],
        12288 => vec![
            Variant::Linear,
            Variant::NormLinear,
            Variant::NormThenLinear,
            Variant::NormRopeAppend,
            Variant::NormThenRopeAppend,
        ],
        4096 => vec![Variant::Linear, Variant::Add],
        _ => vec![Variant::Linear],
    }
}

fn shape_group(c: &mut Criterion, gpu: &Gpu, blas: &mut Blas, n: usize, k: usize, m: usize) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("gemv_dense_{n}x{k}_m{m}"));
    let wbytes = 2 * n * k;
    let x = bench_tensor::<f16>(gpu, &[m, k], 1).unwrap();
    let ws: Vec<DeviceTensor<f16>> = (0..copies(wbytes))
        .map(|i| bench_tensor::<f16>(gpu, &[n, k], 10 + i as u64).unwrap())
        .collect();
    let mut y = DeviceTensor::<f16>::zeros(&s, &[m, n]).unwrap();

    // cuBLAS f16 on the same matrices.
    let mut i = 0usize;
    let mut cublas = || {
        i = (i + 1) % ws.len();
        if let Err(e) = blas.linear(&x, &ws[i], None, &mut y) {
            panic!("cuBLAS linear failed: {e}");
        }
        Ok(())
    };
    g.throughput(Throughput::Bytes((wbytes + 2 * (m * k + m * n)) as u64));
    g.bench_function(BenchmarkId::new("cublas_f16", m), |b| {
        b.iter_custom(|it| time_on_device(&s, it, &mut cublas))
    });
    let t_cublas = time_on_device(&s, ITERS, &mut cublas);

    let mut probes: Vec<CopyProbe> = (0..copies(wbytes))
        .map(|_| CopyProbe::new(gpu, wbytes / 2).unwrap())
        .collect();
    let mut j = 0usize;
    let mut copy = || {
        j = (j + 1) % probes.len();
        probes[j].copy(&s)
    };
    g.throughput(Throughput::Bytes(wbytes as u64));
    g.bench_function(BenchmarkId::new("copy", m), |b| {
        b.iter_custom(|it| time_on_device(&s, it, &mut copy))
    });
    let tc = time_on_device(&s, ITERS, &mut copy);
    drop(probes);

    let mut out = DeviceTensor::<f16>::zeros(&s, &[m, n / 2]).unwrap();
    let gamma = bench_tensor::<f16>(gpu, &[k], 2).unwrap();
    let mut xn = DeviceTensor::<f16>::zeros(&s, &[m, k]).unwrap();
    // The qkv variants with RoPE + append: 32 q / 32 kv heads of 128 (n = 12288), token t in
    // sequence t at position 100 + t of a 256-slot cache.
    let (heads, d) = (
        QkvSplit {
            q_heads: 32,
            kv_heads: 32,
        },
        128,
    );
    let rope_i = RopeParams::new(d, 10_000.0).with_style(RopeStyle::Interleaved);
    let rope_h = RopeParams::new(d, 10_000.0);
    let seq_ids = DeviceTensor::from_host(&s, &(0..m as i32).collect::<Vec<_>>(), &[m]).unwrap();
    let positions = DeviceTensor::from_host(
        &s,
        &(0..m as i32).map(|t| 100 + t).collect::<Vec<_>>(),
        &[m],
    )
    .unwrap();
    let mut q = DeviceTensor::<f16>::zeros(&s, &[m, 32, d]).unwrap();
    let mut cache = KvCache::<f16>::zeros(&s, [m, 32, 256, d]).unwrap();
    for v in variants(n) {
        let mut i = 0usize;
        let norm = gemv_dense::RmsNorm {
            weight: &gamma,
            eps: 1e-5,
        };
        let mut run = || -> Result<()> {
            i = (i + 1) % ws.len();
            match v {
                Variant::Linear => gemv_dense::linear(&s, &x, &ws[i], None, &mut y),
                Variant::Swiglu => gemv_dense::linear_swiglu(&s, &x, &ws[i], &mut out),
                Variant::Add => gemv_dense::linear_add(&s, &x, &ws[i], &mut y),
                Variant::NormLinear => {
                    gemv_dense::rms_norm_linear(&s, &x, norm, &ws[i], None, &mut y)
                }
                Variant::NormThenLinear => {
                    fl_kernels::norm::rms_norm(&s, &x, &gamma, 1e-5, &mut xn)?;
                    gemv_dense::linear(&s, &xn, &ws[i], None, &mut y)
                }
                Variant::NormSwiglu => {
                    gemv_dense::rms_norm_linear_swiglu(&s, &x, norm, &ws[i], &mut out)
                }
                Variant::NormRopeAppend => {
                    let args = QkvRopeAppend {
                        heads,
                        rope: &rope_i,
                        slots: TokenSlots {
                            seq_ids: &seq_ids,
                            positions: &positions,
                        },
                        layout: CacheLayout::Contiguous,
                    };
                    gemv_dense::linear_rope_append(
                        &s,
                        &x,
                        Some(norm),
                        &ws[i],
                        None,
                        &args,
                        &mut q,
                        &mut cache,
                        None,
                    )
                }
                Variant::NormThenRopeAppend => {
                    gemv_dense::rms_norm_linear(&s, &x, norm, &ws[i], None, &mut y)?;
                    let args = RopeAppend {
                        qkv: &y,
                        heads,
                        slots: TokenSlots {
                            seq_ids: &seq_ids,
                            positions: &positions,
                        },
                        rope: &rope_h,
                        layout: CacheLayout::Contiguous,
                    };
                    kv_cache::rope_append(&s, &args, &mut q, None, &mut cache, None)
                }
            }
        };
        let io = match v {
            Variant::Linear | Variant::NormLinear | Variant::NormThenLinear => 2 * (m * k + m * n),
            // q out and k, v into the cache: m·n outputs as for a linear.
            Variant::NormRopeAppend | Variant::NormThenRopeAppend => 2 * (m * k + m * n),
            Variant::Swiglu | Variant::NormSwiglu => 2 * (m * k + m * n / 2),
            Variant::Add => 2 * (m * k + 2 * m * n),
        };
        g.throughput(Throughput::Bytes((wbytes + io) as u64));
        g.bench_function(BenchmarkId::new(v.name(), m), |b| {
            b.iter_custom(|it| time_on_device(&s, it, &mut run))
        });
        let t = time_on_device(&s, ITERS, &mut run);
        let (bw, bwc) = (gbps(wbytes, t, ITERS), gbps(wbytes, tc, ITERS));
        eprintln!(
            "gemv_dense {n}x{k} m={m:<2} {:<27} {:8.2} us  {bw:7.0} GB/s on weights = {:5.1}% of \
             copy ({bwc:.0} GB/s); {:.2}x cuBLAS f16 linear ({:.2} us)",
            v.name(),
            t.as_secs_f64() * 1e6 / ITERS as f64,
            100.0 * bw / bwc,
            t_cublas.as_secs_f64() / t.as_secs_f64(),
            t_cublas.as_secs_f64() * 1e6 / ITERS as f64,
        );
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("gemv_dense") else {
        return;
    };
    let mut blas = Blas::new(&gpu).unwrap();
    for &(n, k) in SHAPES {
        for m in [1, 16] {
            shape_group(c, &gpu, &mut blas, n, k, m);
        }
    }
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches
}
criterion_main!(group);
