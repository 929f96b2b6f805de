//! # fl-kernels: fused CUDA kernels for LLaMA-family inference, one safe function each
//!
//! Each op is a hand-written CUDA kernel (compiled at build time by `fl-kernels-sys`)
//! behind a safe function that checks shapes and dtypes before it launches, queues the work
//! on the stream you pass and returns without waiting. Each has a CPU reference in
//! [`reference`](mod@crate::reference), used by the GPU tests, and is benchmarked with criterion in `bench/`.
//!
//! ```no_run
//! use fl_kernels::{elementwise, DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;                       // primary context + default stream
//! let s = gpu.stream();
//! let x = DeviceTensor::from_host(s, &vec![1.0f32; 4096], &[4, 1024])?;
//! let y = DeviceTensor::from_host(s, &vec![2.0f32; 4096], &[4, 1024])?;
//! let mut z = DeviceTensor::zeros(s, &[4, 1024])?;
//! elementwise::add(s, &x, &y, &mut z)?;         // queued, not waited for
//! assert!(z.to_host(s)?.iter().all(|&v| v == 3.0)); // the copy waits
//! # Ok::<(), fl_kernels::Error>(())
//! ```
//!
//! Supported GPUs: compute capability 8.0 and newer (SASS for sm_80, sm_86, sm_89,
//! sm_90a; PTX for compute_80). Dtypes: see [`DType`].
#![warn(missing_docs)]

mod dtype;
mod error;
mod gpu;
mod tensor;

pub mod activation;
pub mod allreduce;
pub mod attention;
pub mod attention_prefill;
pub mod beam;
pub mod elementwise;
pub mod embedding;
pub mod gemv;
pub mod gemv_dense;
pub mod ggml;
pub mod kv_cache;
pub mod norm;
pub mod padding;
pub mod quant;
pub mod reference;
pub mod rope;
pub mod sampling;
pub mod softmax;
#[cfg(feature = "testing")]
pub mod testing;

pub use cudarc;
pub use dtype::{DType, FloatDType, HalfDType};
pub use error::{Error, Result};
pub use gpu::{gpu_available, time_on_stream, Gpu, MIN_COMPUTE_CAPABILITY};
pub use half::{bf16, f16};
pub use tensor::DeviceTensor;

/// Version of the linked kernel library (major * 10000 + minor * 100 + patch).
pub fn kernels_version() -> i32 {
    // SAFETY: a plain function with no arguments and no side effects.
    unsafe { fl_kernels_sys::fl_kernels_version() }
}
