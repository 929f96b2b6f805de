//! # fl-blas: matrix products for FasterLLaMA-rs
//!
//! A row-major GEMM over cuBLASLt, shaped for `nn.Linear` weights:
//!
//! `C[m, n] = alpha · A[m, k] · B[n, k]ᵀ (+ bias[n]) (+ beta · C)`
//!
//! with `f32` (optionally TF32), `f16` and `bf16` storage and f32 accumulation, strided
//! batches (`[batch, m, k]`, with B per batch entry or shared), the bias fused in cuBLASLt's
//! epilogue, and an algorithm cache (heuristic by default, [`Blas::autotune`] to time the
//! candidates, saved to and loaded from a JSON file keyed by GPU and cuBLASLt version).
//!
//! Row-major data is used as stored: cuBLASLt (column-major) computes `Cᵀ = B · Aᵀ`, so no
//! copy or transpose is made.
//!
//! ```no_run
//! use fl_blas::Blas;
//! use fl_kernels::{bf16, DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;
//! let s = gpu.stream();
//! let mut blas = Blas::new(&gpu)?;
//! let x = DeviceTensor::<bf16>::filled(s, &[16, 4096], bf16::from_f32(0.5))?;      // [tokens, in]
//! let w = DeviceTensor::<bf16>::filled(s, &[11008, 4096], bf16::from_f32(0.01))?;  // [out, in]
//! let mut y = DeviceTensor::<bf16>::zeros(s, &[16, 11008])?;                        // [tokens, out]
//! blas.linear(&x, &w, None, &mut y)?;      // queued on gpu.stream(), not waited for
//! blas.save_algo_cache("algos.json")?;     // the algorithm chosen for this shape
//! # Ok::<(), fl_blas::Error>(())
//! ```
//!
//! INT8 W8A8: [`Blas::gemm_i8`] (int8 × int8 → int32 on IMMA tensor cores) and
//! [`QuantLinear`] (per-channel quantised weights); the fused (de)quantising kernels around
//! it are in [`fl_kernels::quant`]. Weight-only quantised GEMV (int8, int4, Q8_0, Q4_0) is
//! [`fl_kernels::gemv`]: hand-written kernels, so it lives with the others.
#![warn(missing_docs)]

pub mod cache;
mod dtype;
mod error;
mod ffi;
mod gemm;
pub mod int8;
pub mod reference;

pub use cache::{AlgoCache, CacheKey, CacheLoad, CachedAlgo, GemmShape};
pub use dtype::{GemmDType, GemmType};
pub use error::{Error, Result};
pub use fl_kernels::{DeviceTensor, Gpu};
pub use gemm::{AutotuneResult, Blas, GemmParams, WORKSPACE_BYTES};
pub use int8::QuantLinear;

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
