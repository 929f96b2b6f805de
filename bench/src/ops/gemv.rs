//! Table cases for `fl_kernels::gemv` (torch side: `torch_gemv.py`, which runs the fp16
//! `F.linear` of the same shape under each key: torch has no equal quantised kernel).
//!
//! Keys: `gemv_<format>|f16|<m>x<n>x<k>`; bytes = weight bytes (values + scales + zeros) +
//! x + y.

use fl_kernels::gemv::{self, QuantFormat, QuantWeight};
use fl_kernels::{f16, DeviceTensor};

use super::{bench_tensor, bench_values, Case, Launch};

/// (n, k) of the LLaMA-7B projections and LM head.
pub const SHAPES: &[(usize, usize)] = &[(4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096)];

/// Token counts.
pub const TOKENS: &[usize] = &[1, 16];

/// The formats of the table.
pub fn formats() -> Vec<QuantFormat> {
    vec![
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
    ]
}

fn op_name(f: QuantFormat) -> &'static str {
    match f {
        QuantFormat::Int8 => "gemv_int8",
        QuantFormat::Int4 {
            zero_point: false, ..
        } => "gemv_int4_g128",
        QuantFormat::Int4 {
            zero_point: true, ..
        } => "gemv_int4zp_g128",
        QuantFormat::Q8_0 => "gemv_q8_0",
        QuantFormat::Q4_0 => "gemv_q4_0",
        QuantFormat::Q4_K => "gemv_q4_k",
        QuantFormat::Q5_K => "gemv_q5_k",
        QuantFormat::Q6_K => "gemv_q6_k",
    }
}

fn case(f: QuantFormat, m: usize, n: usize, k: usize) -> Case {
    Case {
        op: op_name(f),
        dtype: "f16",
        shape: format!("{m}x{n}x{k}"),
        bytes: (f.weight_bytes(n, k) + 2 * (m * k + m * n)) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let q = gemv::quantize(&bench_values(n * k, 7), n, k, f)?;
            let w = QuantWeight::upload(&s, &q)?;
            let x = bench_tensor::<f16>(gpu, &[m, k], 1)?;
            let mut y = DeviceTensor::<f16>::zeros(&s, &[m, n])?;
            let l: Launch = Box::new(move || gemv::gemv(&s, &x, &w, &mut y));
            Ok(l)
        }),
    }
}

/// Every format at m = 1 and 16 tokens for each shape.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &(n, k) in SHAPES {
        for &m in TOKENS {
            for f in formats() {
                v.push(case(f, m, n, k));
            }
        }
    }
    v
}
