//! Table cases for `fl_kernels::gemv_dense` (torch side: `torch_gemv_dense.py`).
//!
//! Keys: `gemv_dense_linear|f16|<m>x<n>x<k>` (y = x · Wᵀ, W [n, k]),
//! `gemv_dense_swiglu|f16|<m>x<I>x<k>` (W [2I, k] gate rows then up rows, out [m, I]) and
//! `gemv_dense_add|f16|<m>x<n>x<k>` (residual [m, n] += x · Wᵀ); bytes = weight + x + output
//! (+ the residual read).

use fl_kernels::{f16, gemv_dense, DeviceTensor};

use super::{bench_tensor, Case, Launch};

/// (n, k) of the LLaMA-7B projections (q/k/v/o, fused qkv, stacked gate/up, down, LM head)
/// and a small GQA k/v projection.
pub const SHAPES: &[(usize, usize)] = &[
    (4096, 4096),
    (12288, 4096),
    (22016, 4096),
    (4096, 11008),
    (32000, 4096),
    (1024, 4096),
];

/// Token counts.
pub const TOKENS: &[usize] = &[1, 16];

fn linear(m: usize, n: usize, k: usize) -> Case {
    Case {
        op: "gemv_dense_linear",
        dtype: "f16",
        shape: format!("{m}x{n}x{k}"),
        bytes: (2 * (n * k + m * k + m * n)) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let w = bench_tensor::<f16>(gpu, &[n, k], 7)?;
            let x = bench_tensor::<f16>(gpu, &[m, k], 1)?;
            let mut y = DeviceTensor::<f16>::zeros(&s, &[m, n])?;
            let l: Launch = Box::new(move || gemv_dense::linear(&s, &x, &w, None, &mut y));
            Ok(l)
        }),
    }
}

fn swiglu(m: usize, i: usize, k: usize) -> Case {
    Case {
        op: "gemv_dense_swiglu",
        dtype: "f16",
        shape: format!("{m}x{i}x{k}"),
        bytes: (2 * (2 * i * k + m * k + m * i)) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let w = bench_tensor::<f16>(gpu, &[2 * i, k], 7)?;
            let x = bench_tensor::<f16>(gpu, &[m, k], 1)?;
            let mut out = DeviceTensor::<f16>::zeros(&s, &[m, i])?;
            let l: Launch = Box::new(move || gemv_dense::linear_swiglu(&s, &x, &w, &mut out));
            Ok(l)
        }),
    }
}

fn add(m: usize, n: usize, k: usize) -> Case {
    Case {
        op: "gemv_dense_add",
        dtype: "f16",
        shape: format!("{m}x{n}x{k}"),
        bytes: (2 * (n * k + m * k + 2 * m * n)) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let w = bench_tensor::<f16>(gpu, &[n, k], 7)?;
            let x = bench_tensor::<f16>(gpu, &[m, k], 1)?;
            let mut res = bench_tensor::<f16>(gpu, &[m, n], 3)?;
            let l: Launch = Box::new(move || gemv_dense::linear_add(&s, &x, &w, &mut res));
            Ok(l)
        }),
    }
}

/// `linear` at every shape, `swiglu` on the gate/up weight, `add` on the o / down
/// projections; m = 1 and 16.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &(n, k) in SHAPES {
        for &m in TOKENS {
            v.push(linear(m, n, k));
            if n == 22016 {
                v.push(swiglu(m, n / 2, k));
            }
            if n == 4096 {
                v.push(add(m, n, k));
            }
        }
    }
    v
}
