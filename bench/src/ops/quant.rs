//! Table cases for `fl_kernels::quant` and the int8 GEMM of `fl_blas` (torch side:
//! `torch_quant.py`).
//!
//! Keys: `quantize_per_token|bf16|TxW`, `rms_norm_quant|{f16,bf16}|TxH`,
//! `dequant_add_rms_norm_quant|bf16|TxH`, `dequant_add|bf16|TxW`,
//! `dequant_silu_mul_quant|i32|TxI` (I = inter; input `[T, 2I]`),
//! `dequant_rope|bf16|TxHQxHKVxD`, and the GEMMs `gemm_i8|i8|MxNxK`, `gemm|f16|MxNxK`
//! (bytes = operands read + output written once; compare their times, not GB/s).

use fl_blas::Blas;
use fl_kernels::quant::{self, Dequant, QkvHeads};
use fl_kernels::rope::RopeParams;
use fl_kernels::{bf16, f16, DeviceTensor, Error, Gpu, HalfDType, Result};

use super::{bench_tensor, bench_values, Case, Launch};

/// An int8 tensor of `shape` from [`bench_values`] (values in ±[6, 127], never zero).
pub fn bench_i8(gpu: &Gpu, shape: &[usize], seed: u64) -> Result<DeviceTensor<i8>> {
    let n: usize = shape.iter().product();
    let host: Vec<i8> = bench_values(n, seed)
        .into_iter()
        .map(|v| (v * 127.0).round() as i8)
        .collect();
    DeviceTensor::from_host(gpu.stream(), &host, shape)
}

/// An int32 GEMM output of `shape` from [`bench_values`] (values in ±[5e3, 1e5]).
pub fn bench_acc(gpu: &Gpu, shape: &[usize], seed: u64) -> Result<DeviceTensor<i32>> {
    let n: usize = shape.iter().product();
    let host: Vec<i32> = bench_values(n, seed)
        .into_iter()
        .map(|v| (v * 1e5) as i32)
        .collect();
    DeviceTensor::from_host(gpu.stream(), &host, shape)
}

/// Minimal bytes of a row op `name` on `[rows, h]` with activations of `es` bytes.
pub fn row_bytes(name: &str, rows: usize, h: usize, es: usize) -> u64 {
    let (n, r, h) = (rows * h, rows, h);
    (match name {
        // x read, q written, scale written
        "quantize_per_token" => n * es + n + 4 * r,
        // + weight
        "rms_norm_quant" => n * es + h * es + n + 4 * r,
        // acc, residual read; residual, q written; act scale, weight scale, weight read; scale written
        "dequant_add_rms_norm_quant" => 4 * n + 2 * n * es + n + 4 * h + h * es + 8 * r,
        // acc, residual read, residual written; scales read
        _ => 4 * n + 2 * n * es + 4 * h + 4 * r,
    }) as u64
}

/// Minimal bytes of `dequant_silu_mul_quant` on `[rows, 2·inter]` int32.
pub fn silu_bytes(rows: usize, inter: usize) -> u64 {
    (rows * 2 * inter * 4 + rows * inter + 2 * inter * 4 + 8 * rows) as u64
}

/// Minimal bytes of `dequant_rope` on `[rows, w]` (int32 in, `es`-byte out).
pub fn rope_bytes(rows: usize, w: usize, es: usize) -> u64 {
    (rows * w * (4 + es) + 4 * w + 8 * rows) as u64
}

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
const SILU_SIZES: &[(usize, usize)] = &[
    (1, 11008),
    (16, 11008),
    (64, 11008),
    (1, 28672),
    (64, 28672),
    (8192, 14336),
];
const ROPE_SIZES: &[(usize, usize, usize)] = &[
    (1, 32, 8),
    (16, 32, 8),
    (64, 32, 8),
    (1, 64, 8),
    (64, 64, 8),
    (16384, 32, 8),
];
const GEMM_SHAPES: &[(usize, usize, usize)] = &[
    (4096, 4096, 4096),
    (2048, 4096, 4096),
    (2048, 4096, 11008),
    (2048, 11008, 4096),
    (2048, 11008, 11008),
    (2048, 12288, 4096),
    (2048, 12288, 11008),
];

fn row_case<T: HalfDType>(op: &'static str, rows: usize, h: usize) -> Case {
    let es = std::mem::size_of::<T>();
    Case {
        op,
        dtype: T::NAME,
        shape: format!("{rows}x{h}"),
        bytes: row_bytes(op, rows, h, es),
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            // Inputs of the quantising ops ([rows, h] x) or of the dequantising ones (acc,
            // residual, scales); a 1-element stand-in for the other kind's.
            let deq = op.starts_with("dequant");
            let (xr, dr) = if deq { (1, rows) } else { (rows, 1) };
            let (xh, dh) = if deq { (1, h) } else { (h, 1) };
            let x = bench_tensor::<T>(gpu, &[xr, xh], 1)?;
            let w = bench_tensor::<T>(gpu, &[h], 2)?;
            let mut res = bench_tensor::<T>(gpu, &[dr, dh], 3)?;
            let acc = bench_acc(gpu, &[dr, dh], 4)?;
            let sa = DeviceTensor::<f32>::filled(&s, &[dr], 1e-3)?;
            let sw = DeviceTensor::<f32>::filled(&s, &[dh], 1e-4)?;
            let mut q = DeviceTensor::<i8>::zeros(&s, &[rows, h])?;
            let mut sc = DeviceTensor::<f32>::zeros(&s, &[rows])?;
            let l: Launch = Box::new(move || {
                let d = Dequant {
                    acc: &acc,
                    act_scale: &sa,
                    weight_scale: &sw,
                };
                match op {
                    "quantize_per_token" => quant::quantize_per_token(&s, &x, &mut q, &mut sc),
                    "rms_norm_quant" => quant::rms_norm_quant(&s, &x, &w, 1e-5, &mut q, &mut sc),
                    "dequant_add_rms_norm_quant" => quant::dequant_add_rms_norm_quant(
                        &s, d, &mut res, &w, 1e-5, &mut q, &mut sc,
                    ),
                    _ => quant::dequant_add(&s, d, &mut res),
                }
            });
            Ok(l)
        }),
    }
}

fn silu_case(rows: usize, inter: usize) -> Case {
    Case {
        op: "dequant_silu_mul_quant",
        dtype: "i32",
        shape: format!("{rows}x{inter}"),
        bytes: silu_bytes(rows, inter),
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let acc = bench_acc(gpu, &[rows, 2 * inter], 5)?;
            let sa = DeviceTensor::<f32>::filled(&s, &[rows], 1e-3)?;
            let sw = DeviceTensor::<f32>::filled(&s, &[2 * inter], 1e-4)?;
            let mut q = DeviceTensor::<i8>::zeros(&s, &[rows, inter])?;
            let mut sc = DeviceTensor::<f32>::zeros(&s, &[rows])?;
            let l: Launch = Box::new(move || {
                let d = Dequant {
                    acc: &acc,
                    act_scale: &sa,
                    weight_scale: &sw,
                };
                quant::dequant_silu_mul_quant(&s, d, &mut q, &mut sc)
            });
            Ok(l)
        }),
    }
}

fn rope_case<T: HalfDType>(rows: usize, hq: usize, hkv: usize) -> Case {
    let d = 128;
    let heads = QkvHeads {
        q_heads: hq,
        kv_heads: hkv,
    };
    let w = (hq + 2 * hkv) * d;
    Case {
        op: "dequant_rope",
        dtype: T::NAME,
        shape: format!("{rows}x{hq}x{hkv}x{d}"),
        bytes: rope_bytes(rows, w, std::mem::size_of::<T>()),
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let acc = bench_acc(gpu, &[rows, w], 6)?;
            let sa = DeviceTensor::<f32>::filled(&s, &[rows], 1e-3)?;
            let sw = DeviceTensor::<f32>::filled(&s, &[w], 1e-4)?;
            let pos: Vec<i32> = (0..rows as i32).map(|p| p * 7 % 8192).collect();
            let dpos = DeviceTensor::from_host(&s, &pos, &[rows])?;
            let mut out = DeviceTensor::<T>::zeros(&s, &[rows, w])?;
            let rope = RopeParams::new(d, 500_000.0);
            let l: Launch = Box::new(move || {
                let dq = Dequant {
                    acc: &acc,
                    act_scale: &sa,
                    weight_scale: &sw,
                };
                quant::dequant_rope(&s, dq, &dpos, heads, &rope, &mut out)
            });
            Ok(l)
        }),
    }
}

fn blas_err(e: fl_blas::Error) -> Error {
    Error::invalid("gemm", e.to_string())
}

fn gemm_i8_case(m: usize, n: usize, k: usize) -> Case {
    Case {
        op: "gemm_i8",
        dtype: "i8",
        shape: format!("{m}x{n}x{k}"),
        bytes: (m * k + n * k + 4 * m * n) as u64,
        make: Box::new(move |gpu| {
            let a = bench_i8(gpu, &[m, k], 1)?;
            let b = bench_i8(gpu, &[n, k], 2)?;
            let mut c = DeviceTensor::<i32>::zeros(gpu.stream(), &[m, n])?;
            let mut blas = Blas::new(gpu).map_err(blas_err)?;
            let l: Launch = Box::new(move || blas.gemm_i8(&a, &b, &mut c).map_err(blas_err));
            Ok(l)
        }),
    }
}

fn gemm_f16_case(m: usize, n: usize, k: usize) -> Case {
    Case {
        op: "gemm",
        dtype: "f16",
        shape: format!("{m}x{n}x{k}"),
        bytes: (2 * (m * k + n * k + m * n)) as u64,
        make: Box::new(move |gpu| {
            let a = bench_tensor::<f16>(gpu, &[m, k], 1)?;
            let b = bench_tensor::<f16>(gpu, &[n, k], 2)?;
            let mut c = DeviceTensor::<f16>::zeros(gpu.stream(), &[m, n])?;
            let mut blas = Blas::new(gpu).map_err(blas_err)?;
            let l: Launch = Box::new(move || blas.linear(&a, &b, None, &mut c).map_err(blas_err));
            Ok(l)
        }),
    }
}

/// The quant ops at decode sizes and one size past L2, and the int8 / f16 GEMMs.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &(r, h) in ROW_SIZES {
        v.push(row_case::<bf16>("quantize_per_token", r, h));
        v.push(row_case::<f16>("rms_norm_quant", r, h));
        v.push(row_case::<bf16>("rms_norm_quant", r, h));
    }
    for &(r, h) in DEQ_SIZES {
        v.push(row_case::<bf16>("dequant_add_rms_norm_quant", r, h));
        v.push(row_case::<bf16>("dequant_add", r, h));
    }
    for &(r, i) in SILU_SIZES {
        v.push(silu_case(r, i));
    }
    for &(r, hq, hkv) in ROPE_SIZES {
        v.push(rope_case::<bf16>(r, hq, hkv));
    }
    for &(m, n, k) in GEMM_SHAPES {
        v.push(gemm_i8_case(m, n, k));
        v.push(gemm_f16_case(m, n, k));
    }
    v
}
