//! References for [`crate::softmax`](mod@crate::softmax).

use crate::dtype::FloatDType;

/// Softmax of each row of `[rows, n]` with temperature, in f64 (unrounded):
/// `exp((x - max) / t) / sum exp((x - max) / t)`.
///
/// Special values, as the kernel defines them: a row of only `-inf` gives zeros; `-inf`
/// elements give 0; a row holding any NaN or `+inf` gives all NaN.
/// Panics only if `n == 0` or `x.len()` is not a multiple of `n` (a test bug).
pub fn softmax<T: FloatDType>(x: &[T], n: usize, temperature: f32) -> Vec<f64> {
    assert!(n >= 1, "reference::softmax: n must be >= 1");
    assert_eq!(
        x.len() % n,
        0,
        "reference::softmax: len not a multiple of n"
    );
    let t = temperature as f64;
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let v: Vec<f64> = row.iter().map(|a| a.to_f64()).collect();
        if v.iter().any(|a| a.is_nan() || *a == f64::INFINITY) {
            y.extend(std::iter::repeat_n(f64::NAN, n));
            continue;
        }
        let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            y.extend(std::iter::repeat_n(0.0, n));
            continue;
        }
        let e: Vec<f64> = v.iter().map(|a| ((a - m) / t).exp()).collect();
        let s: f64 = e.iter().sum();
        y.extend(e.iter().map(|a| a / s));
    }
    y
}
