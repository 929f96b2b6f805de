//! Weight-only quantised GEMV (`fl_kernels::gemv`): time and
//! GB/s on the weight bytes, next to a device copy of the same bytes and cuBLAS in the
//! activations' dtype (`fl_blas::Blas::linear`, fp16 or bf16) on the same matrix.
//!
//! Shapes (n x k): 4096x4096, 11008x4096, 4096x11008, 32000x4096 at m = 1 and 16 tokens;
//! formats int8, int4 (group 128, symmetric and with zero point), Q8_0, Q4_0, and the K-quants
//! Q4_K, Q5_K, Q6_K (GGUF super-blocks of 144 / 176 / 210 bytes per 256 values, as a GGUF file
//! holds them: ggml's reference quantiser on the first rows, repeated).
//! Throughput is `Throughput::Bytes(weight bytes (values + scales + zeros) + x + y)`; for
//! cuBLAS its 16-bit weight + x + y. Weights (and copy buffers) rotate through enough copies to
//! move >= 256 MB per cycle, so each call reads its weights from HBM as in a real decode
//! step (a lone 8 MB weight would stay in the 50 MB L2 across iterations).
//! One summary line per case also goes to stderr: GB/s, % of the copy, speed-up vs cuBLAS,
//! each time the median of three batches of 50 launches.
//! `FL_GEMV_BENCH_SHAPES=22016x4096,12288x4096`: those n x k instead (quick or not).
//! Activations f16 (default), or per `FL_GEMV_BENCH_DTYPE=bf16` / `=both` (cuBLAS then runs
//! the same dtype; bf16 rows are named `<format>/bf16` in the summary lines and
//! `gemv_<n>x<k>_m<m>_bf16` in criterion's groups).
//! `FL_GEMV_BENCH_QUICK=1`: m = 1 and int8 / int4 only; `FL_GEMV_BENCH_QUICK=gguf`: m = 1 and
//! Q8_0 / Q4_0 only; `FL_GEMV_BENCH_QUICK=kquant`: m = 1 and Q4_K / Q5_K / Q6_K only;
//! `FL_GEMV_BENCH_QUICK=q4`: m = 1, int4 g32 (the bytes per value of Q4_0) and Q4_0. `FL_GEMV_BENCH_M=2,8,16` (comma-separated, 1..=16): those token counts
//! instead (quick or not).
//! At 4096x4096 and 11008x4096, int8 and int4 g128 also run with each kernel forced
//! (`<format>_fma` / `<format>_mma`: CUDA cores vs tensor cores, `gemv::gemv_with_path`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::{bench_tensor, bench_values};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_blas::Blas;
use fl_kernels::cudarc::driver::CudaStream;
use fl_kernels::gemv::{self, QuantFormat, QuantWeight, QuantizedHost, Scales};
use fl_kernels::{bf16, f16, DeviceTensor, Gpu, HalfDType};

const SHAPES: &[(usize, usize)] = &[(4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096)];
const ROTATE_BYTES: usize = 256 << 20;

/// `FL_GEMV_BENCH_QUICK=1`: one token and int8 / int4 only; `=gguf`: one token and Q8_0 /
/// Q4_0 only; `=kquant`: one token and Q4_K / Q5_K / Q6_K only; `=q4`: int4 g32 and Q4_0, the
/// same bytes per value in two layouts (kernel A/B sweeps in one GPU call).
fn quick_mode() -> Option<String> {
    std::env::var("FL_GEMV_BENCH_QUICK")
        .ok()
        .filter(|v| v == "1" || v == "gguf" || v == "kquant" || v == "q4")
}

fn is_kquant(f: &QuantFormat) -> bool {
    matches!(f, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K)
}
fn quick() -> bool {
    quick_mode().is_some()
}

/// The token counts to run: `FL_GEMV_BENCH_M` (entries outside 1..=16 or not numbers are
/// dropped with a notice), else 1 and 16 (1 in quick mode).
fn token_counts() -> Vec<usize> {
    match std::env::var("FL_GEMV_BENCH_M") {
        Ok(v) => v
            .split(',')
            .filter_map(|e| match e.trim().parse::<usize>() {
                Ok(m) if (1..=16).contains(&m) => Some(m),
                _ => {
                    eprintln!("FL_GEMV_BENCH_M: ignoring {e:?} (token counts are 1..=16)");
                    None
                }
            })
            .collect(),
        Err(_) if quick() => vec![1],
        Err(_) => vec![1, 16],
    }
}

/// The shapes to run: `FL_GEMV_BENCH_SHAPES` (comma-separated `NxK`, e.g. `22016x4096,12288x4096`;
/// entries that do not parse, or with k % 256 != 0, are dropped with a notice), else SHAPES.
fn shapes() -> Vec<(usize, usize)> {
    match std::env::var("FL_GEMV_BENCH_SHAPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|e| {
                let p = e.trim().split_once('x').and_then(|(a, b)| {
                    Some((
                        a.trim().parse::<usize>().ok()?,
                        b.trim().parse::<usize>().ok()?,
                    ))
                });
                match p {
                    Some((n, k)) if n > 0 && k > 0 && k % 256 == 0 => Some((n, k)),
                    _ => {
                        eprintln!(
                            "FL_GEMV_BENCH_SHAPES: ignoring {e:?} (NxK, k a multiple of 256)"
                        );
                        None
                    }
                }
            })
            .collect(),
        Err(_) => SHAPES.to_vec(),
    }
}

/// The activation types to run: `FL_GEMV_BENCH_DTYPE` = `f16` (default), `bf16` or `both`
/// (anything else: f16, with a notice).
fn dtypes() -> (bool, bool) {
    match std::env::var("FL_GEMV_BENCH_DTYPE").as_deref() {
        Err(_) | Ok("f16") => (true, false),
        Ok("bf16") => (false, true),
        Ok("both") => (true, true),
        Ok(v) => {
            eprintln!("FL_GEMV_BENCH_DTYPE: ignoring {v:?} (f16, bf16 or both); running f16");
            (true, false)
        }
    }
}

fn formats() -> Vec<QuantFormat> {
    let mut v = vec![
        QuantFormat::Int8,
        QuantFormat::Int4 {
            group: 128,
            zero_point: false,
        },
        QuantFormat::Int4 {
            group: 128,
            zero_point: true,
        },
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];
    match quick_mode().as_deref() {
        Some("1") => v.retain(|f| matches!(f, QuantFormat::Int8 | QuantFormat::Int4 { .. })),
        Some("kquant") => v.retain(is_kquant),
        Some("q4") => {
            v = vec![
                QuantFormat::Int4 {
                    group: 32,
                    zero_point: false,
                },
                QuantFormat::Q4_0,
            ]
        }
        Some(_) => v.retain(|f| matches!(f, QuantFormat::Q8_0 | QuantFormat::Q4_0)),
        None => {}
    }
    v
}

/// `host` (`[n, k]`) in `f`. The K-quants' reference quantiser (a search per sub-block) is
/// slow on the host, so they quantise the first 256 rows and repeat them: every row is still
/// a row of real blocks, and each copy of the weight is read from HBM all the same.
fn quantized(host: &[f32], n: usize, k: usize, f: QuantFormat) -> QuantizedHost {
    if !is_kquant(&f) || n <= 256 {
        return gemv::quantize(host, n, k, f).unwrap();
    }
    let head = gemv::quantize(&host[..256 * k], 256, k, f).unwrap();
    let row = head.data().len() / 256;
    let data: Vec<u8> = (0..n)
        .flat_map(|r| {
            head.data()[(r % 256) * row..(r % 256 + 1) * row]
                .iter()
                .copied()
        })
        .collect();
    QuantizedHost::new(f, n, k, data, Scales::None, Vec::new()).unwrap()
}

/// How many copies of `bytes` make up >= ROTATE_BYTES.
fn copies(bytes: usize) -> usize {
    ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, 64)
}

/// `iters` launches of `f` timed on the device after a few untimed ones, so the printed lines
/// hold without criterion's own warm-up (first-call costs: cuBLAS's heuristic and module
/// loading took ~150 ms on an H100 when criterion's runs were filtered out): the median of
/// three such batches, since one batch of cuBLAS or of the copy now and then runs far off its
/// usual time, which skewed the ratios.
fn timed(
    s: &CudaStream,
    iters: u64,
    mut f: impl FnMut() -> fl_kernels::Result<()>,
) -> std::time::Duration {
    let _ = time_on_device(s, 5, &mut f);
    let mut t = [(); 3].map(|_| time_on_device(s, iters, &mut f));
    t.sort();
    t[1]
}

fn gbps(bytes: usize, t: std::time::Duration, iters: u64) -> f64 {
    bytes as f64 * iters as f64 / t.as_secs_f64() / 1e9
}

fn shape_group<T: HalfDType + fl_blas::GemmType>(
    c: &mut Criterion,
    gpu: &Gpu,
    blas: &mut Blas,
    n: usize,
    k: usize,
    m: usize,
) {
    let s = gpu.stream().clone();
    let bf = T::NAME == "bf16";
    let sfx = if bf { "/bf16" } else { "" };
    let mut g = c.benchmark_group(format!(
        "gemv_{n}x{k}_m{m}{}",
        if bf { "_bf16" } else { "" }
    ));
    let x = bench_tensor::<T>(gpu, &[m, k], 1).unwrap();
    let mut y = DeviceTensor::<T>::zeros(&s, &[m, n]).unwrap();
    let io = 2 * (m * k + m * n);
    const ITERS: u64 = 50;

    // cuBLAS in the activations' dtype on the same matrix.
    let wbytes16 = 2 * n * k;
    let ws: Vec<DeviceTensor<T>> = (0..copies(wbytes16))
        .map(|i| bench_tensor::<T>(gpu, &[n, k], 10 + i as u64).unwrap())
        .collect();
    let mut i = 0usize;
    let mut cublas = || {
        i = (i + 1) % ws.len();
        if let Err(e) = blas.linear(&x, &ws[i], None, &mut y) {
            panic!("cuBLAS linear failed: {e}");
        }
        Ok(())
    };
    g.throughput(Throughput::Bytes((wbytes16 + io) as u64));
    g.bench_function(BenchmarkId::new(format!("cublas_{}", T::NAME), m), |b| {
        b.iter_custom(|it| time_on_device(&s, it, &mut cublas))
    });
    let t_cublas = timed(&s, ITERS, &mut cublas);
    drop(ws);

    let host = bench_values(n * k, 7);
    for f in formats() {
        if k % f.k_multiple() != 0 {
            continue;
        }
        let q = quantized(&host, n, k, f);
        let bytes = q.num_bytes();
        let wq: Vec<QuantWeight> = (0..copies(bytes))
            .map(|_| QuantWeight::upload(&s, &q).unwrap())
            .collect();
        let mut i = 0usize;
        let mut run = || {
            i = (i + 1) % wq.len();
            gemv::gemv(&s, &x, &wq[i], &mut y)
        };
        g.throughput(Throughput::Bytes((bytes + io) as u64));
        g.bench_function(BenchmarkId::new(f.name(), m), |b| {
            b.iter_custom(|it| time_on_device(&s, it, &mut run))
        });
        let t = timed(&s, ITERS, &mut run);
        drop(wq);

        let mut probes: Vec<CopyProbe> = (0..copies(bytes))
            .map(|_| CopyProbe::new(gpu, bytes / 2).unwrap())
            .collect();
        let mut j = 0usize;
        let mut copy = || {
            j = (j + 1) % probes.len();
            probes[j].copy(&s)
        };
        g.bench_function(BenchmarkId::new(format!("copy_{}", f.name()), m), |b| {
            b.iter_custom(|it| time_on_device(&s, it, &mut copy))
        });
        let tc = timed(&s, ITERS, &mut copy);
        let (bw, bwc) = (gbps(bytes, t, ITERS), gbps(bytes, tc, ITERS));
        eprintln!(
            "gemv {n}x{k} m={m} {:<12} {:8.2} us  {bw:7.0} GB/s on weights = {:5.1}% of copy \
             ({bwc:.0} GB/s); {:.2}x cuBLAS {} ({:.2} us)",
            format!("{}{sfx}", f.name()),
            t.as_secs_f64() * 1e6 / ITERS as f64,
            100.0 * bw / bwc,
            t_cublas.as_secs_f64() / t.as_secs_f64(),
            T::NAME,
            t_cublas.as_secs_f64() * 1e6 / ITERS as f64,
        );
    }

    // The two kernels forced (tensor cores vs CUDA-core FMAs) on the decode shapes, for the
    // lead's A/B of the automatic choice.
    if !quick() && [(4096, 4096), (11008, 4096)].contains(&(n, k)) {
        let fmts = [
            QuantFormat::Int8,
            QuantFormat::Int4 {
                group: 128,
                zero_point: false,
            },
        ];
        for f in fmts {
            let q = gemv::quantize(&host, n, k, f).unwrap();
            let bytes = q.num_bytes();
            let wq: Vec<QuantWeight> = (0..copies(bytes))
                .map(|_| QuantWeight::upload(&s, &q).unwrap())
                .collect();
            let mut times = Vec::new();
            for (name, path) in [("fma", gemv::GemvPath::Fma), ("mma", gemv::GemvPath::Mma)] {
                let mut i = 0usize;
                let mut run = || {
                    i = (i + 1) % wq.len();
                    gemv::gemv_with_path(&s, &x, &wq[i], &mut y, path)
                };
                g.throughput(Throughput::Bytes((bytes + io) as u64));
                g.bench_function(BenchmarkId::new(format!("{}_{name}", f.name()), m), |b| {
                    b.iter_custom(|it| time_on_device(&s, it, &mut run))
                });
                times.push(timed(&s, ITERS, &mut run));
            }
            eprintln!(
                "gemv {n}x{k} m={m} {:<12} fma {:8.2} us  mma {:8.2} us  ({:.2}x)",
                format!("{}{sfx}", f.name()),
                times[0].as_secs_f64() * 1e6 / ITERS as f64,
                times[1].as_secs_f64() * 1e6 / ITERS as f64,
                times[0].as_secs_f64() / times[1].as_secs_f64(),
            );
        }
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("gemv") else {
        return;
    };
    let mut blas = Blas::new(&gpu).unwrap();
    let (half, brain) = dtypes();
    for (n, k) in shapes() {
        for m in token_counts() {
            if half {
                shape_group::<f16>(c, &gpu, &mut blas, n, k, m);
            }
            if brain {
                shape_group::<bf16>(c, &gpu, &mut blas, n, k, m);
            }
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
