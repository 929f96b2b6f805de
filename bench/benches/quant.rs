//! Criterion benches of the quant family (placeholder).
fn main() {}
