//! Table cases for `fl_kernels::embedding` (torch side: `torch_embedding.py`).

use fl_kernels::embedding::{self, DeviceStatus};
use fl_kernels::gemv::{self, QuantFormat, QuantWeight, QuantizedHost};
use fl_kernels::reference::ggml::random_blocks;
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

/// A prepared lookup of `n` tokens straight from a quantised `[VOCAB, hidden]` table
/// (`gemv::embedding`, f16 out). K-quant tables are random blocks: quantising 131M values
/// through the reference K-quant quantiser takes tens of seconds, and a lookup's time does not
/// depend on the values.
pub fn prepare_quant(gpu: &Gpu, n: usize, hidden: usize, format: QuantFormat) -> Result<Launch> {
    let s = gpu.stream().clone();
    let q = match (format, format.ggml_type()) {
        (QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K, Some(ty)) => {
            let blocks = random_blocks(ty, VOCAB * hidden / 256, 13);
            QuantizedHost::from_ggml(ty, VOCAB, hidden, blocks)?
        }
        _ => gemv::quantize(&bench_values(VOCAB * hidden, 13), VOCAB, hidden, format)?,
    };
    let table = QuantWeight::upload(&s, &q)?;
    let ids = DeviceTensor::from_host(&s, &bench_ids(n, VOCAB, 12), &[n])?;
    let mut out = DeviceTensor::<f16>::zeros(&s, &[n, hidden])?;
    let mut status = DeviceStatus::new(&s)?;
    Ok(Box::new(move || {
        gemv::embedding(&s, &ids, &table, &mut out, &mut status)
    }))
}

/// Bytes a quantised lookup moves: the rows' quantised bytes read, f16 written.
pub fn quant_bytes(n: usize, hidden: usize, format: QuantFormat) -> usize {
    format.weight_bytes(n, hidden) + n * hidden * 2
}

fn quant_case(n: usize, hidden: usize, format: QuantFormat) -> Case {
    Case {
        op: "embedding_quant",
        dtype: <f16 as fl_kernels::DType>::NAME,
        shape: format!("n{n}_h{hidden}_v{VOCAB}_{}", format.name()),
        bytes: quant_bytes(n, hidden, format) as u64,
        make: Box::new(move |gpu| prepare_quant(gpu, n, hidden, format)),
    }
}

/// Lookups of 1, 16 (hidden 8192), 64, 4096 and 65536 tokens (f16), 65536 tokens (bf16);
/// from quantised tables (Q8_0, Q4_0, Q4_K, Q6_K): 1 and 4096 tokens.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for n in [1usize, 64, 4096, 65536] {
        v.push(case::<f16>(n, 4096));
    }
    v.push(case::<f16>(16, 8192));
    v.push(case::<bf16>(65536, 4096));
    for format in [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
    ] {
        for n in [1usize, 4096] {
            v.push(quant_case(n, 4096, format));
        }
    }
    v
}
