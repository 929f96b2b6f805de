//! # fl-blas: matrix products for FasterLLaMA-rs
//!
//! Planned scope (issue 4, not built yet): a row-major GEMM API over cuBLASLt
//! (fp32/fp16/bf16, fused bias, strided batches) with an algorithm cache, INT8 W8A8 GEMMs
//! with fused quantisation, and weight-only quantised GEMV for decode.
//!
//! Today the crate only re-exports the shared types so that the layering
//! (engine -> blas -> kernels -> sys) is in place.

pub use fl_kernels::{DeviceTensor, Error, Gpu, Result};
