//! Table cases for `fl_kernels::embedding` (torch side: `torch_embedding.py`).

use fl_kernels::embedding::{self, DeviceStatus};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType, Gpu, Result};

use super::{bench_tensor, bench_values, Case, Launch};

/// Vocabulary of the bench table (LLaMA-2's).
pub const VOCAB: usize = 32000;

/// `n` deterministic token ids spread over `[0, vocab)`.
pub fn bench_ids(n: usize, vocab: usize, seed: u64) -> Vec<i32> {
    bench_values(n, seed)
        .into_iter()
        .map(|v| (((v.abs() - 0.05) / 0.95 * vocab as f32) as i32).clamp(0, vocab as i32 - 1))
        .collect()
}

/// A prepared lookup of `n` tokens from a `[VOCAB, hidden]` table (inputs never zero).
pub fn prepare<T: FloatDType>(gpu: &Gpu, n: usize, hidden: usize) -> Result<Launch> {
    let s = gpu.stream().clone();
    let table = bench_tensor::<T>(gpu, &[VOCAB, hidden], 11)?;
    let ids = DeviceTensor::from_host(&s, &bench_ids(n, VOCAB, 12), &[n])?;
    let mut out = DeviceTensor::<T>::zeros(&s, &[n, hidden])?;
    let mut status = DeviceStatus::new(&s)?;
    Ok(Box::new(move || {
        embedding::lookup(&s, &ids, &table, &mut out, &mut status)
    }))
}

fn case<T: FloatDType>(n: usize, hidden: usize) -> Case {
    Case {
        op: "embedding",
        dtype: T::NAME,
        shape: format!("n{n}_h{hidden}_v{VOCAB}"),
        // each output row read once from the table and written once
        bytes: (n * hidden * 2 * std::mem::size_of::<T>()) as u64,
        make: Box::new(move |gpu| prepare::<T>(gpu, n, hidden)),
    }
}

/// Lookups of 1, 16 (hidden 8192), 64, 4096 and 65536 tokens (f16), 65536 tokens (bf16).
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for n in [1usize, 64, 4096, 65536] {
        v.push(case::<f16>(n, 4096));
    }
    v.push(case::<f16>(16, 8192));
    v.push(case::<bf16>(65536, 4096));
    v
}
