//! Criterion benches of the attention_prefill family (placeholder).
fn main() {}
