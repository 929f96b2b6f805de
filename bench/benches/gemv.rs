//! Criterion benches of the gemv family (placeholder).
fn main() {}
