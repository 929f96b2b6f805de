//! CPU references of every op, in plain Rust.
//!
//! Each function here computes what the GPU op of the same name computes, in f32 or f64
//! (never in the storage type), rounding to the storage type only where the kernel does.
//! GPU tests compare against these; proptests check their properties on the CPU.

pub mod activation;
pub mod attention;
pub mod attention_prefill;
pub mod elementwise;
pub mod embedding;
pub mod gemv;
pub mod gemv_dense;
pub mod ggml;
pub mod kv_cache;
pub mod norm;
pub mod padding;
pub mod quant;
pub mod rope;
pub mod softmax;
