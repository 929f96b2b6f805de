//! References for [`crate::activation`](mod@crate::activation).
//!
//! The textbook formulas in f64, from the inputs as stored (`T` widened exactly); where the
//! kernel adds a bias in f32 before the activation, so does the reference. Results are f64
//! (the kernel rounds once, to `T`), except [`bias_add`], which rounds like the kernel.

use crate::activation::GeluKind;
use crate::dtype::FloatDType;

/// `silu(x) = x / (1 + exp(-x))` in f64 (`-0` for `x < -709`, where `exp(-x)` is ∞).
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `silu(gate[i]) * up[i]` in f64. Panics only if the lengths differ (a test bug).
pub fn swiglu<T: FloatDType>(gate: &[T], up: &[T]) -> Vec<f64> {
    assert_eq!(gate.len(), up.len(), "reference::swiglu: lengths differ");
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| silu(g.to_f64()) * u.to_f64())
        .collect()
}

/// SwiGLU of fused `[gate | up]` rows: `x` is `[rows, 2 * inter]`, the result
/// `[rows, inter]` with `out[r, j] = silu(x[r, j]) * x[r, inter + j]`.
/// Panics only if `x.len()` is not a multiple of `2 * inter` (a test bug).
pub fn swiglu_fused<T: FloatDType>(x: &[T], inter: usize) -> Vec<f64> {
    if inter == 0 {
        return Vec::new();
    }
    assert_eq!(
        x.len() % (2 * inter),
        0,
        "reference::swiglu_fused: x is not [rows, 2 * inter]"
    );
    x.chunks_exact(2 * inter)
        .flat_map(|row| swiglu(&row[..inter], &row[inter..]))
        .collect()
}

/// The error function in f64 (absolute error about 1e-16; relative about 1e-15 for
/// `|x| >= 1e-300`).
///
/// `|x| < 1.5`: the series `erf(x) = 2/√π e^(-x²) Σ 2^n x^(2n+1) / (1·3·…·(2n+1))` (positive
/// terms, no cancellation); `|x| >= 1.5`: `1 - erfc(|x|)` with the sign of `x`.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return f64::NAN;
    }
    if a < 1.5 {
        erf_series(x)
    } else {
        (1.0 - erfc_cf(a)).copysign(x)
    }
}

/// The complementary error function `erfc(x) = 1 - erf(x)` in f64, relatively accurate in
/// the right tail (`x >= 1.5` by a continued fraction), down to the f64 underflow.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x >= 1.5 {
        erfc_cf(x)
    } else {
        // erf(x) < erf(1.5) < 0.967: at most ~1.5 digits are lost to the subtraction.
        1.0 - erf(x)
    }
}

fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut term = x; // 2^n x^(2n+1) / (2n+1)!!
    let mut sum = x;
    let mut n = 0.0;
    while term.abs() > sum.abs() * 1e-17 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
        if n > 500.0 {
            break;
        }
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-x2).exp() * sum
}

/// erfc(x) for x >= 1.5: `e^(-x²)/√π / (x + (1/2)/(x + 1/(x + (3/2)/(x + …))))`, evaluated
/// backwards from a fixed depth (120 levels reach f64 precision from x = 1.5 on).
fn erfc_cf(x: f64) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    let mut t = x;
    for k in (1..=120).rev() {
        t = x + (k as f64 / 2.0) / t;
    }
    (-x * x).exp() / (std::f64::consts::PI.sqrt() * t)
}

/// `gelu(x)` in f64: `Tanh`: `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` (evaluated as
/// the equal `x / (1 + exp(-2 sqrt(2/π) (x + 0.044715 x³)))`, accurate for `x << 0`);
/// `Erf`: `x Φ(x) = 0.5 x erfc(-x / √2)` (the same as `0.5 x (1 + erf(x / √2))`, accurate
/// for `x << 0` too).
pub fn gelu_scalar(x: f64, kind: GeluKind) -> f64 {
    match kind {
        GeluKind::Tanh => {
            // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)): the same number, without the
            // cancellation of 1 + tanh(u) for u << 0 (which would give 0 below x ~ -6).
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x / (1.0 + (-2.0 * u).exp())
        }
        GeluKind::Erf => 0.5 * x * erfc(-x * std::f64::consts::FRAC_1_SQRT_2),
    }
}

/// `gelu(x[r, c] + bias[c])` (the sum in f32, as the kernel does it; the GELU in f64), or
/// `gelu(x[i])` without a bias. With a bias, `x` is `[rows, bias.len()]`.
/// Panics only if `x.len()` is not a multiple of `bias.len()` (a test bug).
pub fn gelu<T: FloatDType>(x: &[T], bias: Option<&[T]>, kind: GeluKind) -> Vec<f64> {
    match bias {
        None => x.iter().map(|&v| gelu_scalar(v.to_f64(), kind)).collect(),
        Some(b) => {
            if b.is_empty() {
                assert!(x.is_empty(), "reference::gelu: x is not [rows, bias.len()]");
                return Vec::new();
            }
            assert_eq!(
                x.len() % b.len(),
                0,
                "reference::gelu: x is not [rows, bias.len()]"
            );
            x.chunks_exact(b.len())
                .flat_map(|row| {
                    row.iter()
                        .zip(b)
                        .map(move |(&v, &c)| gelu_scalar((v.to_f32() + c.to_f32()) as f64, kind))
                })
                .collect()
        }
    }
}

/// `x[r, c] + bias[c]` in f32, rounded to `T` (exactly what the kernel computes); `x` is
/// `[rows, bias.len()]`. Panics only if `x.len()` is not a multiple of `bias.len()`.
pub fn bias_add<T: FloatDType>(x: &[T], bias: &[T]) -> Vec<T> {
    if bias.is_empty() {
        assert!(
            x.is_empty(),
            "reference::bias_add: x is not [rows, bias.len()]"
        );
        return Vec::new();
    }
    assert_eq!(
        x.len() % bias.len(),
        0,
        "reference::bias_add: x is not [rows, bias.len()]"
    );
    x.chunks_exact(bias.len())
        .flat_map(|row| {
            row.iter()
                .zip(bias)
                .map(|(&v, &c)| T::from_f32(v.to_f32() + c.to_f32()))
        })
        .collect()
}
