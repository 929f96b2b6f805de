//! References for [`crate::elementwise`].

use crate::dtype::FloatDType;

/// `a[i] + b[i]` in f32, rounded to `T`. Panics only if the lengths differ (a test bug).
pub fn add<T: FloatDType>(a: &[T], b: &[T]) -> Vec<T> {
    assert_eq!(a.len(), b.len(), "reference::add: lengths differ");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| T::from_f32(x.to_f32() + y.to_f32()))
        .collect()
}

/// `src[i]` converted to `D` through f32 (exact for every pair of our float types, as
/// f32 holds f16 and bf16 exactly).
pub fn cast<S: FloatDType, D: FloatDType>(src: &[S]) -> Vec<D> {
    src.iter().map(|&x| D::from_f32(x.to_f32())).collect()
}

/// Reference for [`crate::allreduce`]: `Σ_r parts[r][i]` summed in f32 in rank order and
/// rounded to `T` once. Panics only if the parts' lengths differ (a test bug).
pub fn sum_ranks<T: FloatDType>(parts: &[&[T]]) -> Vec<T> {
    let n = parts.first().map_or(0, |p| p.len());
    assert!(
        parts.iter().all(|p| p.len() == n),
        "reference::sum_ranks: lengths differ"
    );
    (0..n)
        .map(|i| T::from_f32(parts.iter().fold(0.0f32, |acc, p| acc + p[i].to_f32())))
        .collect()
}
