//! INT8 W8A8: the int8 GEMM (`Blas::gemm_i8`, cuBLASLt IMMA) against the f16 GEMM
//! (`Blas::linear`) in the same group, and the fused (de)quantising kernels in GB/s next to
//! a device copy of the same traffic.
//!
//! GEMM throughput is `Throughput::Elements(2·m·n·k)`: criterion's `Telem/s` reads as TOPS
//! (int8) or TFLOP/s (f16). Shapes: 4096³ and m = 2048 × n ∈ {4096, 11008, 12288} ×
//! k ∈ {4096, 11008}. A one-line summary per shape (both rates and their ratio, target
//! int8 >= 1.5 x f16) is printed to stderr.
//!
//! Fused kernels: bytes = every input read once + every output written once; decode sizes
//! (1, 16, 64 tokens) and one size past L2 (>= 256 MB moved) per op.
//!
//! BERT encoder kernels (`encoder_*` groups, f16): `quantize_calibrated`, `layer_norm_quant`
//! (with bias and the f16 output y), `dequant_bias_add_layer_norm_quant` (both biases) at
//! BERT-base / BERT-large shapes `4096 x {768, 1024}`, `dequant_bias_gelu_quant` (erf, tanh)
//! at `4096 x {3072, 4096}`; `fl_dyn` with per-token scales, `fl_cal` with a calibrated amax,
//! beside a device copy of the same bytes.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::{bench_tensor, quant as qops};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_blas::Blas;
use fl_kernels::activation::GeluKind;
use fl_kernels::quant::{self, Dequant, LayerNormParams, QkvHeads, QuantOut};
use fl_kernels::rope::RopeParams;
use fl_kernels::{bf16, f16, DeviceTensor, Gpu, HalfDType};

fn gemm_shapes() -> Vec<(usize, usize, usize)> {
    let mut v = vec![(4096, 4096, 4096)];
    for n in [4096, 11008, 12288] {
        for k in [4096, 11008] {
            v.push((2048, n, k));
        }
    }
    v
}

fn gemm_group(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    let mut blas = Blas::new(gpu).unwrap();
    let mut g = c.benchmark_group("gemm_i8_vs_f16");
    for (i, (m, n, k)) in gemm_shapes().into_iter().enumerate() {
        let a8 = qops::bench_i8(gpu, &[m, k], 2 * i as u64 + 1).unwrap();
        let b8 = qops::bench_i8(gpu, &[n, k], 2 * i as u64 + 2).unwrap();
        let mut c32 = DeviceTensor::<i32>::zeros(&s, &[m, n]).unwrap();
        let a16 = bench_tensor::<f16>(gpu, &[m, k], 2 * i as u64 + 1).unwrap();
        let b16 = bench_tensor::<f16>(gpu, &[n, k], 2 * i as u64 + 2).unwrap();
        let mut c16 = DeviceTensor::<f16>::zeros(&s, &[m, n]).unwrap();
        let ops = 2 * (m * n * k) as u64;
        let id = format!("{m}x{n}x{k}");
        g.throughput(Throughput::Elements(ops));
        let mut run_i8 = || -> fl_kernels::Result<()> {
            if let Err(e) = blas.gemm_i8(&a8, &b8, &mut c32) {
                panic!("gemm_i8 failed: {e}");
            }
            Ok(())
        };
        g.bench_with_input(BenchmarkId::new("i8", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, &mut run_i8))
        });
        let t8 = time_on_device(&s, 20, &mut run_i8);
        let mut run_f16 = || -> fl_kernels::Result<()> {
            if let Err(e) = blas.linear(&a16, &b16, None, &mut c16) {
                panic!("gemm f16 failed: {e}");
            }
            Ok(())
        };
        g.bench_with_input(BenchmarkId::new("f16", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, &mut run_f16))
        });
        let t16 = time_on_device(&s, 20, &mut run_f16);
        let tops = ops as f64 * 20.0 / t8.as_secs_f64() / 1e12;
        let tflops = ops as f64 * 20.0 / t16.as_secs_f64() / 1e12;
        eprintln!(
            "gemm {id}: int8 {tops:.1} TOPS, f16 {tflops:.1} TFLOP/s, int8/f16 = {:.2}x (target >= 1.5x)",
            tops / tflops
        );
    }
    g.finish();
}

/// Decode sizes and one past L2 for the row ops (tokens, width).
const ROW_SIZES: &[(usize, usize)] = &[
    (1, 4096),
    (16, 4096),
    (64, 4096),
    (1, 8192),
    (64, 8192),
    (65536, 8192),
];
const DEQ_SIZES: &[(usize, usize)] = &[
    (1, 4096),
    (16, 4096),
    (64, 4096),
    (1, 8192),
    (64, 8192),
    (16384, 8192),
];
/// (tokens, inter) of the SwiGLU op.
const SILU_SIZES: &[(usize, usize)] = &[
    (1, 11008),
    (16, 11008),
    (64, 11008),
    (1, 28672),
    (64, 28672),
    (8192, 14336),
];
/// (tokens, q_heads, kv_heads) with head_dim 128 of the RoPE op.
const ROPE_SIZES: &[(usize, usize, usize)] = &[
    (1, 32, 8),
    (16, 32, 8),
    (64, 32, 8),
    (1, 64, 8),
    (64, 64, 8),
    (16384, 32, 8),
];

#[derive(Clone, Copy)]
enum Op {
    Quantize,
    RmsQuant,
    DeqAddRmsQuant,
    DeqAdd,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Quantize => "quantize_per_token",
            Op::RmsQuant => "rms_norm_quant",
            Op::DeqAddRmsQuant => "dequant_add_rms_norm_quant",
            Op::DeqAdd => "dequant_add",
        }
    }
}

fn row_group<T: HalfDType>(c: &mut Criterion, gpu: &Gpu, op: Op, sizes: &[(usize, usize)]) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("{}_{}", op.name(), T::NAME));
    for &(rows, h) in sizes {
        let id = format!("{rows}x{h}");
        // Inputs of the quantising ops ([rows, h] x) or of the dequantising ones (acc,
        // residual, scales); a 1-element stand-in for the other kind's.
        let deq = matches!(op, Op::DeqAddRmsQuant | Op::DeqAdd);
        let (xr, dr) = if deq { (1, rows) } else { (rows, 1) };
        let (xh, dh) = if deq { (1, h) } else { (h, 1) };
        let x = bench_tensor::<T>(gpu, &[xr, xh], 1).unwrap();
        let w = bench_tensor::<T>(gpu, &[h], 2).unwrap();
        let mut res = bench_tensor::<T>(gpu, &[dr, dh], 3).unwrap();
        let acc = qops::bench_acc(gpu, &[dr, dh], 4).unwrap();
        let sa = DeviceTensor::<f32>::filled(&s, &[dr], 1e-3).unwrap();
        let sw = DeviceTensor::<f32>::filled(&s, &[dh], 1e-4).unwrap();
        let mut q = DeviceTensor::<i8>::zeros(&s, &[rows, h]).unwrap();
        let mut sc = DeviceTensor::<f32>::zeros(&s, &[rows]).unwrap();
        let bytes = qops::row_bytes(op.name(), rows, h, std::mem::size_of::<T>());
        g.throughput(Throughput::Bytes(bytes));
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
            bch.iter_custom(|it| {
                time_on_device(&s, it, || {
                    let d = Dequant {
                        acc: &acc,
                        act_scale: &sa,
                        weight_scale: &sw,
                    };
                    match op {
                        Op::Quantize => quant::quantize_per_token(&s, &x, &mut q, &mut sc),
                        Op::RmsQuant => quant::rms_norm_quant(&s, &x, &w, 1e-5, &mut q, &mut sc),
                        Op::DeqAddRmsQuant => quant::dequant_add_rms_norm_quant(
                            &s, d, &mut res, &w, 1e-5, &mut q, &mut sc,
                        ),
                        Op::DeqAdd => quant::dequant_add(&s, d, &mut res),
                    }
                })
            })
        });
        let mut cp = CopyProbe::new(gpu, (bytes / 2) as usize).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn silu_group(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group("dequant_silu_mul_quant");
    for &(rows, inter) in SILU_SIZES {
        let id = format!("{rows}x{inter}");
        let acc = qops::bench_acc(gpu, &[rows, 2 * inter], 5).unwrap();
        let sa = DeviceTensor::<f32>::filled(&s, &[rows], 1e-3).unwrap();
        let sw = DeviceTensor::<f32>::filled(&s, &[2 * inter], 1e-4).unwrap();
        let mut q = DeviceTensor::<i8>::zeros(&s, &[rows, inter]).unwrap();
        let mut sc = DeviceTensor::<f32>::zeros(&s, &[rows]).unwrap();
        let bytes = qops::silu_bytes(rows, inter);
        g.throughput(Throughput::Bytes(bytes));
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
            bch.iter_custom(|it| {
                time_on_device(&s, it, || {
                    let d = Dequant {
                        acc: &acc,
                        act_scale: &sa,
                        weight_scale: &sw,
                    };
                    quant::dequant_silu_mul_quant(&s, d, &mut q, &mut sc)
                })
            })
        });
        let mut cp = CopyProbe::new(gpu, (bytes / 2) as usize).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn rope_group<T: HalfDType>(c: &mut Criterion, gpu: &Gpu) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("dequant_rope_{}", T::NAME));
    let d = 128;
    let rope = RopeParams::new(d, 500_000.0);
    for &(rows, hq, hkv) in ROPE_SIZES {
        let heads = QkvHeads {
            q_heads: hq,
            kv_heads: hkv,
        };
        let w = heads.width(d).unwrap();
        let id = format!("{rows}x{hq}x{hkv}x{d}");
        let acc = qops::bench_acc(gpu, &[rows, w], 6).unwrap();
        let sa = DeviceTensor::<f32>::filled(&s, &[rows], 1e-3).unwrap();
        let sw = DeviceTensor::<f32>::filled(&s, &[w], 1e-4).unwrap();
        let pos: Vec<i32> = (0..rows as i32).map(|p| p * 7 % 8192).collect();
        let dpos = DeviceTensor::from_host(&s, &pos, &[rows]).unwrap();
        let mut out = DeviceTensor::<T>::zeros(&s, &[rows, w]).unwrap();
        let bytes = qops::rope_bytes(rows, w, std::mem::size_of::<T>());
        g.throughput(Throughput::Bytes(bytes));
        g.bench_with_input(BenchmarkId::new("fl", &id), &id, |bch, _| {
            bch.iter_custom(|it| {
                time_on_device(&s, it, || {
                    let dq = Dequant {
                        acc: &acc,
                        act_scale: &sa,
                        weight_scale: &sw,
                    };
                    quant::dequant_rope(&s, dq, &dpos, heads, &rope, &mut out)
                })
            })
        });
        let mut cp = CopyProbe::new(gpu, (bytes / 2) as usize).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

/// (tokens, hidden) of the encoder's LayerNorm ops: BERT-base and BERT-large.
const ENC_LN_SIZES: &[(usize, usize)] = &[(4096, 768), (4096, 1024)];
/// (tokens, width) of the FFN GELU op: BERT-base and BERT-large.
const ENC_FFN_SIZES: &[(usize, usize)] = &[(4096, 3072), (4096, 4096)];

#[derive(Clone, Copy)]
enum EncOp {
    QuantizeCalibrated,
    LayerNormQuant,
    DeqBiasAddLnQuant,
    DeqBiasGeluQuant(GeluKind),
}

impl EncOp {
    fn name(self) -> String {
        match self {
            EncOp::QuantizeCalibrated => "quantize_calibrated".into(),
            EncOp::LayerNormQuant => "layer_norm_quant".into(),
            EncOp::DeqBiasAddLnQuant => "dequant_bias_add_layer_norm_quant".into(),
            EncOp::DeqBiasGeluQuant(k) => format!("dequant_bias_gelu_quant_{}", k.name()),
        }
    }

    /// Minimal bytes on `[rows, h]` with `es`-byte activations: every input read once, every
    /// output written once (the calibrated amax's 4 bytes left out).
    fn bytes(self, rows: usize, h: usize, es: usize) -> u64 {
        let (n, r) = (rows * h, rows);
        (match self {
            // x read; q, scale written
            EncOp::QuantizeCalibrated => n * es + n + 4 * r,
            // x, weight, bias read; y, q, scale written
            EncOp::LayerNormQuant => 2 * n * es + 2 * h * es + n + 4 * r,
            // acc, act scale, weight scale, bias, residual, LN weight and bias read; residual,
            // q, scale written
            EncOp::DeqBiasAddLnQuant => 4 * n + 2 * n * es + 4 * h + 3 * h * es + n + 8 * r,
            // acc, act scale, weight scale, bias read; q, scale written
            EncOp::DeqBiasGeluQuant(_) => 4 * n + 4 * h + h * es + n + 8 * r,
        }) as u64
    }
}

fn encoder_group<T: HalfDType>(c: &mut Criterion, gpu: &Gpu, op: EncOp, sizes: &[(usize, usize)]) {
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group(format!("encoder_{}_{}", op.name(), T::NAME));
    for &(rows, h) in sizes {
        let id = format!("{rows}x{h}");
        let deq = matches!(op, EncOp::DeqBiasAddLnQuant | EncOp::DeqBiasGeluQuant(_));
        let (xr, dr) = if deq { (1, rows) } else { (rows, 1) };
        let (xh, dh) = if deq { (1, h) } else { (h, 1) };
        let x = bench_tensor::<T>(gpu, &[xr, xh], 1).unwrap();
        let w = bench_tensor::<T>(gpu, &[h], 2).unwrap();
        let b = bench_tensor::<T>(gpu, &[h], 3).unwrap();
        let bias = bench_tensor::<T>(gpu, &[h], 4).unwrap();
        let mut y = DeviceTensor::<T>::zeros(&s, &[xr, xh]).unwrap();
        let mut res = bench_tensor::<T>(gpu, &[dr, dh], 5).unwrap();
        let acc = qops::bench_acc(gpu, &[dr, dh], 6).unwrap();
        let sa = DeviceTensor::<f32>::filled(&s, &[dr], 1e-3).unwrap();
        let sw = DeviceTensor::<f32>::filled(&s, &[dh], 1e-4).unwrap();
        let amax = DeviceTensor::<f32>::filled(&s, &[1], 4.0).unwrap();
        let mut q = DeviceTensor::<i8>::zeros(&s, &[rows, h]).unwrap();
        let mut sc = DeviceTensor::<f32>::zeros(&s, &[rows]).unwrap();
        let bytes = op.bytes(rows, h, std::mem::size_of::<T>());
        g.throughput(Throughput::Bytes(bytes));
        for calibrated in [false, true] {
            let name = if calibrated { "fl_cal" } else { "fl_dyn" };
            if !calibrated && matches!(op, EncOp::QuantizeCalibrated) {
                continue; // quantize_per_token is its dynamic counterpart (row groups above)
            }
            g.bench_with_input(BenchmarkId::new(name, &id), &id, |bch, _| {
                bch.iter_custom(|it| {
                    time_on_device(&s, it, || {
                        let d = Dequant {
                            acc: &acc,
                            act_scale: &sa,
                            weight_scale: &sw,
                        };
                        let ln = LayerNormParams {
                            weight: &w,
                            bias: Some(&b),
                            eps: 1e-12,
                        };
                        let out = if calibrated {
                            QuantOut::calibrated(&mut q, &mut sc, &amax)
                        } else {
                            QuantOut::per_token(&mut q, &mut sc)
                        };
                        match op {
                            EncOp::QuantizeCalibrated => {
                                quant::quantize_calibrated(&s, &x, &amax, out.q, out.scale)
                            }
                            EncOp::LayerNormQuant => {
                                quant::layer_norm_quant(&s, &x, ln, Some(&mut y), out)
                            }
                            EncOp::DeqBiasAddLnQuant => quant::dequant_bias_add_layer_norm_quant(
                                &s,
                                d,
                                Some(&bias),
                                &mut res,
                                ln,
                                out,
                            ),
                            EncOp::DeqBiasGeluQuant(k) => {
                                quant::dequant_bias_gelu_quant(&s, d, Some(&bias), k, out)
                            }
                        }
                    })
                })
            });
        }
        let mut cp = CopyProbe::new(gpu, (bytes / 2) as usize).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", &id), &id, |bch, _| {
            bch.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("quant") else {
        return;
    };
    gemm_group(c, &gpu);
    row_group::<bf16>(c, &gpu, Op::Quantize, ROW_SIZES);
    row_group::<f16>(c, &gpu, Op::RmsQuant, ROW_SIZES);
    row_group::<bf16>(c, &gpu, Op::RmsQuant, ROW_SIZES);
    row_group::<bf16>(c, &gpu, Op::DeqAddRmsQuant, DEQ_SIZES);
    row_group::<bf16>(c, &gpu, Op::DeqAdd, DEQ_SIZES);
    silu_group(c, &gpu);
    rope_group::<bf16>(c, &gpu);
    encoder_group::<f16>(c, &gpu, EncOp::QuantizeCalibrated, ENC_LN_SIZES);
    encoder_group::<f16>(c, &gpu, EncOp::LayerNormQuant, ENC_LN_SIZES);
    encoder_group::<bf16>(c, &gpu, EncOp::LayerNormQuant, ENC_LN_SIZES);
    encoder_group::<f16>(c, &gpu, EncOp::DeqBiasAddLnQuant, ENC_LN_SIZES);
    encoder_group::<f16>(
        c,
        &gpu,
        EncOp::DeqBiasGeluQuant(GeluKind::Erf),
        ENC_FFN_SIZES,
    );
    encoder_group::<f16>(
        c,
        &gpu,
        EncOp::DeqBiasGeluQuant(GeluKind::Tanh),
        ENC_FFN_SIZES,
    );
}

criterion_group! {
    name = group_quant;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(500));
    targets = benches
}
criterion_main!(group_quant);
