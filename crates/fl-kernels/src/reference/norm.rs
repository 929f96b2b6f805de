//! References for [`crate::norm`](mod@crate::norm).
//!
//! Inputs are `[rows, hidden]` row-major slices; statistics and outputs are computed in f64
//! from the exact values of the inputs and returned unrounded (the kernels round once to
//! `T`), except the updated residual of [`add_rms_norm`], which is rounded as the kernel
//! rounds it.

use crate::dtype::FloatDType;

fn check_shapes(op: &str, len: usize, hidden: usize, w: usize) {
    assert!(hidden >= 1, "reference::{op}: hidden must be >= 1");
    assert_eq!(
        len % hidden,
        0,
        "reference::{op}: len not a multiple of hidden"
    );
    assert_eq!(
        w, hidden,
        "reference::{op}: weight length differs from hidden"
    );
}

/// RMSNorm of each row: `x / sqrt(mean(x^2) + eps) * weight`, in f64.
/// Panics only on inconsistent lengths (a test bug).
pub fn rms_norm<T: FloatDType>(x: &[T], weight: &[T], hidden: usize, eps: f32) -> Vec<f64> {
    check_shapes("rms_norm", x.len(), hidden, weight.len());
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(hidden) {
        let ms = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / hidden as f64;
        let rstd = 1.0 / (ms + eps as f64).sqrt();
        y.extend(
            row.iter()
                .zip(weight)
                .map(|(v, w)| v.to_f64() * rstd * w.to_f64()),
        );
    }
    y
}

/// Fused residual add + RMSNorm: returns `(new_residual, y)` with
/// `new_residual = T(residual + x)` (added in f32, rounded to `T`, as the kernel) and
/// `y = rms_norm(new_residual, weight)` in f64.
pub fn add_rms_norm<T: FloatDType>(
    x: &[T],
    residual: &[T],
    weight: &[T],
    hidden: usize,
    eps: f32,
) -> (Vec<T>, Vec<f64>) {
    assert_eq!(
        x.len(),
        residual.len(),
        "reference::add_rms_norm: lengths differ"
    );
    let new_res = super::elementwise::add(residual, x);
    let y = rms_norm(&new_res, weight, hidden, eps);
    (new_res, y)
}

/// LayerNorm of each row: `(x - mean) / sqrt(var + eps) * weight (+ bias)`, with the biased
/// variance computed in two passes, in f64.
pub fn layer_norm<T: FloatDType>(
    x: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    hidden: usize,
    eps: f32,
) -> Vec<f64> {
    check_shapes("layer_norm", x.len(), hidden, weight.len());
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            hidden,
            "reference::layer_norm: bias length differs from hidden"
        );
    }
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(hidden) {
        let mean = row.iter().map(|v| v.to_f64()).sum::<f64>() / hidden as f64;
        let var = row
            .iter()
            .map(|v| (v.to_f64() - mean) * (v.to_f64() - mean))
            .sum::<f64>()
            / hidden as f64;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        for (i, v) in row.iter().enumerate() {
            let b = bias.map_or(0.0, |b| b[i].to_f64());
            y.push((v.to_f64() - mean) * rstd * weight[i].to_f64() + b);
        }
    }
    y
}

/// Fused add-bias + residual + LayerNorm (BERT's post-LN sublayer end): returns
/// `(h, y)` with `h = T((f32(x) + f32(x_bias)) + f32(residual))` (the kernel's f32 sums and
/// one rounding; no bias term when `x_bias` is `None`) and `y = layer_norm(h, weight, bias)`
/// in f64. Panics only on inconsistent lengths (a test bug).
pub fn add_bias_layer_norm<T: FloatDType>(
    x: &[T],
    x_bias: Option<&[T]>,
    residual: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    hidden: usize,
    eps: f32,
) -> (Vec<T>, Vec<f64>) {
    assert_eq!(
        x.len(),
        residual.len(),
        "reference::add_bias_layer_norm: lengths differ"
    );
    check_shapes("add_bias_layer_norm", x.len(), hidden, weight.len());
    let h: Vec<T> = x
        .iter()
        .zip(residual)
        .enumerate()
        .map(|(i, (v, r))| {
            let mut s = v.to_f32();
            if let Some(b) = x_bias {
                s += b[i % hidden].to_f32();
            }
            T::from_f32(s + r.to_f32())
        })
        .collect();
    let y = layer_norm(&h, weight, bias, hidden, eps);
    (h, y)
}
