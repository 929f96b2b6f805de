//! References for [`crate::gemv_dense`]: the three epilogues in f64, unrounded.
//!
//! `x` is `[m, k]` and weights `[rows, k]`, row-major, as slices of the storage type; every
//! function panics when a length does not match its shape (a test bug).

use crate::dtype::FloatDType;

/// `acc[t, r] = Σ_j x[t, j] · w[r, j]` in f64 for rows `r < rows` of `w`, `[m, rows]`.
fn matmul_t<T: FloatDType>(x: &[T], w: &[T], m: usize, rows: usize, k: usize) -> Vec<f64> {
    assert_eq!(x.len(), m * k, "reference::gemv_dense: x is not [m, k]");
    assert_eq!(
        w.len(),
        rows * k,
        "reference::gemv_dense: w is not [rows, k]"
    );
    let xd: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let wd: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    let mut y = vec![0f64; m * rows];
    for t in 0..m {
        let xr = &xd[t * k..(t + 1) * k];
        for r in 0..rows {
            y[t * rows + r] = wd[r * k..(r + 1) * k]
                .iter()
                .zip(xr)
                .map(|(a, b)| a * b)
                .sum();
        }
    }
    y
}

/// `y[t, r] = Σ_j x[t, j] · w[r, j] (+ bias[r])`, `w [n, k]`, `bias [n]`; returns `[m, n]`.
pub fn linear<T: FloatDType>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut y = matmul_t(x, w, m, n, k);
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "reference::gemv_dense::linear: bias is not [n]");
        for row in y.chunks_exact_mut(n.max(1)) {
            for (v, b) in row.iter_mut().zip(b) {
                *v += b.to_f64();
            }
        }
    }
    y
}

/// `silu(g) = g / (1 + e^(−g))` in f64.
pub fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

/// `out[t, r] = silu(x[t] · w[r]) · (x[t] · w[I + r])` with `w_gate_up [2I, k]` (gate rows
/// then up rows); returns `[m, I]`.
pub fn linear_swiglu<T: FloatDType>(
    x: &[T],
    w_gate_up: &[T],
    m: usize,
    i: usize,
    k: usize,
) -> Vec<f64> {
    let gu = matmul_t(x, w_gate_up, m, 2 * i, k);
    let mut out = vec![0f64; m * i];
    for t in 0..m {
        for r in 0..i {
            out[t * i + r] = silu(gu[t * 2 * i + r]) * gu[t * 2 * i + i + r];
        }
    }
    out
}

/// `residual[t, r] + Σ_j x[t, j] · w[r, j]` (the value `linear_add` writes, unrounded),
/// `residual [m, n]`; returns `[m, n]`.
pub fn linear_add<T: FloatDType>(
    x: &[T],
    w: &[T],
    residual: &[T],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    assert_eq!(
        residual.len(),
        m * n,
        "reference::gemv_dense: residual is not [m, n]"
    );
    let mut y = matmul_t(x, w, m, n, k);
    for (v, r) in y.iter_mut().zip(residual) {
        *v += r.to_f64();
    }
    y
}
