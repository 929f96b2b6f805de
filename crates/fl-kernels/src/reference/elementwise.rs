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
