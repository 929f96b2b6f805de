//! The op table: every kernel at the sizes RESULTS.md reports, for the side-by-side run
//! against PyTorch (`bench/scripts/compare.py`) and for `optable`.
//!
//! Each family module exposes `cases() -> Vec<Case>`. A case names the op, the dtype and
//! the shape in the same words the torch script uses (`bench/scripts/torch_<family>.py`),
//! so the two sides join on `key()`. Inputs are allocated only when the case is run.

use fl_kernels::{Gpu, Result};

pub mod activation;
pub mod attention;
pub mod attention_prefill;
pub mod elementwise;
pub mod embedding;
pub mod gemv;
pub mod gemv_dense;
pub mod kv_cache;
pub mod norm;
pub mod padding;
pub mod quant;
pub mod rope;
pub mod sampling;
pub mod softmax;

/// A prepared launch: queues one call of the op on the GPU's stream.
pub type Launch = Box<dyn FnMut() -> Result<()>>;

/// Allocates a case's inputs and returns its launch.
pub type Make = Box<dyn Fn(&Gpu) -> Result<Launch>>;

/// One (op, dtype, shape) point of the table.
pub struct Case {
    /// Op name, e.g. `rms_norm`.
    pub op: &'static str,
    /// `f32`, `f16` or `bf16`.
    pub dtype: &'static str,
    /// Shape in words, e.g. `65536x8192`.
    pub shape: String,
    /// Bytes the op must move: every input read once, every output written once.
    pub bytes: u64,
    /// Allocates inputs (random, non-zero) and returns the launch.
    pub make: Make,
}

impl Case {
    /// Join key shared with the torch side: `op|dtype|shape`.
    pub fn key(&self) -> String {
        format!("{}|{}|{}", self.op, self.dtype, self.shape)
    }
}

/// Every case of every family.
pub fn all() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(elementwise::cases());
    v.extend(attention::cases());
    v.extend(attention_prefill::cases());
    v.extend(gemv::cases());
    v.extend(gemv_dense::cases());
    v.extend(quant::cases());
    v.extend(norm::cases());
    v.extend(softmax::cases());
    v.extend(rope::cases());
    v.extend(sampling::cases());
    v.extend(kv_cache::cases());
    v.extend(embedding::cases());
    v.extend(activation::cases());
    v.extend(padding::cases());
    v
}

/// Deterministic pseudo-random values in ±[0.05, 1] for bench inputs (never zero).
pub fn bench_values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let m = 0.05 + 0.95 * u;
            if x & 1 == 0 {
                m
            } else {
                -m
            }
        })
        .collect()
}

/// A device tensor of `shape` filled with [`bench_values`] converted to `T`.
pub fn bench_tensor<T: fl_kernels::FloatDType>(
    gpu: &Gpu,
    shape: &[usize],
    seed: u64,
) -> Result<fl_kernels::DeviceTensor<T>> {
    let n: usize = shape.iter().product();
    let host: Vec<T> = bench_values(n, seed).into_iter().map(T::from_f32).collect();
    fl_kernels::DeviceTensor::from_host(gpu.stream(), &host, shape)
}
