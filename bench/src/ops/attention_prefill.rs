//! Table cases for `fl_kernels::attention_prefill` (torch side: `torch_attention_prefill.py`).

use fl_kernels::attention::KvCache;
use fl_kernels::attention_prefill::{self, PagedPrefillParams, PrefillParams};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

/// Sequence lengths of the issue; each point runs `batch = max(1, 16384 / len)` sequences
/// of that length (about 16k tokens), 32 q heads, 8 kv heads, head_dim 128.
pub const PREFILL_LENS: [usize; 6] = [512, 1024, 2048, 4096, 8192, 16384];

/// (batch, len) of one point.
pub fn shape(len: usize) -> (usize, usize) {
    ((16384 / len).max(1), len)
}

/// FLOPs of one point (see `attention_prefill::prefill_flops`).
pub fn flops(batch: usize, len: usize, hq: usize, d: usize) -> u64 {
    attention_prefill::prefill_flops(&vec![len; batch], hq, d)
}

/// The op-table key's shape part, e.g. `b4xL4096xh32/8xd128`.
pub fn shape_key(batch: usize, len: usize, hq: usize, hkv: usize, d: usize) -> String {
    format!("b{batch}xL{len}xh{hq}/{hkv}xd{d}")
}

/// A prepared launch of one point (inputs allocated here).
pub fn make<T: FloatDType>(
    gpu: &fl_kernels::Gpu,
    batch: usize,
    len: usize,
    hq: usize,
    hkv: usize,
    d: usize,
) -> fl_kernels::Result<Launch> {
    let s = gpu.stream().clone();
    let total = batch * len;
    let q = bench_tensor::<T>(gpu, &[total, hq, d], 1)?;
    let k = bench_tensor::<T>(gpu, &[total, hkv, d], 2)?;
    let v = bench_tensor::<T>(gpu, &[total, hkv, d], 3)?;
    let cu: Vec<i32> = (0..=batch).map(|b| (b * len) as i32).collect();
    let cu = DeviceTensor::from_host(&s, &cu, &[batch + 1])?;
    let params = PrefillParams::new(d, len);
    let mut out = DeviceTensor::<T>::zeros(&s, &[total, hq, d])?;
    Ok(Box::new(move || {
        attention_prefill::prefill(&s, &q, &k, &v, &cu, &mut out, &params)
    }))
}

fn prefill_case<T: FloatDType>(len: usize) -> Case {
    let (hq, hkv, d) = (32usize, 8usize, 128usize);
    let (batch, len) = shape(len);
    let total = batch * len;
    // q, k, v read once, out written once (the op is compute-bound; see the bench for TFLOP/s)
    let bytes =
        (2 * total * hq * d + 2 * total * hkv * d) * std::mem::size_of::<T>() + 4 * (batch + 1);
    Case {
        op: "attn_prefill",
        dtype: T::NAME,
        shape: shape_key(batch, len, hq, hkv, d),
        bytes: bytes as u64,
        make: Box::new(move |gpu| make::<T>(gpu, batch, len, hq, hkv, d)),
    }
}

/// Prefill attention at every length in f16, bf16 at 4096, f32 (CUDA cores) at 1024.
pub fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = PREFILL_LENS
        .iter()
        .map(|&l| prefill_case::<f16>(l))
        .collect();
    v.push(prefill_case::<bf16>(4096));
    v.push(prefill_case::<f32>(1024));
    v
}

/// Paged prefill points `(batch, new tokens per sequence, cached tokens before them)`: eight
/// 512-token chunks over 3,584 cached tokens (chunked prefill at 4k context) and one
/// 2,048-token first chunk.
pub const PAGED_POINTS: [(usize, usize, usize); 2] = [(8, 512, 3584), (1, 2048, 0)];

/// Tokens per block of the paged bench cache.
pub const PAGED_BLOCK: usize = 16;

/// FLOPs of one paged point (see `attention_prefill::prefill_paged_flops`).
pub fn paged_flops(batch: usize, q_len: usize, prefix: usize, hq: usize, d: usize) -> u64 {
    attention_prefill::prefill_paged_flops(&vec![q_len; batch], &vec![prefix + q_len; batch], hq, d)
}

/// The op-table key's shape part of a paged point, e.g. `b8xQ512+3584xh32/8xd128xbs16`.
pub fn paged_shape_key(
    batch: usize,
    q_len: usize,
    prefix: usize,
    hq: usize,
    hkv: usize,
    d: usize,
) -> String {
    format!("b{batch}xQ{q_len}+{prefix}xh{hq}/{hkv}xd{d}xbs{PAGED_BLOCK}")
}

/// A prepared launch of one paged point: a pool of exactly the blocks the batch uses,
/// assigned to the sequences in an interleaved (non-contiguous) order.
pub fn make_paged<T: FloatDType>(
    gpu: &fl_kernels::Gpu,
    (batch, q_len, prefix): (usize, usize, usize),
    hq: usize,
    hkv: usize,
    d: usize,
) -> fl_kernels::Result<Launch> {
    let s = gpu.stream().clone();
    let total = batch * q_len;
    let ctx = prefix + q_len;
    let per_seq = ctx.div_ceil(PAGED_BLOCK);
    let num_blocks = batch * per_seq;
    let q = bench_tensor::<T>(gpu, &[total, hq, d], 1)?;
    let k = bench_tensor::<T>(gpu, &[num_blocks, hkv, PAGED_BLOCK, d], 2)?;
    let v = bench_tensor::<T>(gpu, &[num_blocks, hkv, PAGED_BLOCK, d], 3)?;
    // Block j of sequence b is block j * batch + b of the pool.
    let table: Vec<i32> = (0..batch)
        .flat_map(|b| (0..per_seq).map(move |j| (j * batch + b) as i32))
        .collect();
    let table = DeviceTensor::from_host(&s, &table, &[batch, per_seq])?;
    let cu: Vec<i32> = (0..=batch).map(|b| (b * q_len) as i32).collect();
    let cu = DeviceTensor::from_host(&s, &cu, &[batch + 1])?;
    let ctx_lens = DeviceTensor::from_host(&s, &vec![ctx as i32; batch], &[batch])?;
    let params = PagedPrefillParams::new(d, q_len);
    let mut out = DeviceTensor::<T>::zeros(&s, &[total, hq, d])?;
    Ok(Box::new(move || {
        let cache = KvCache::Paged {
            k: &k,
            v: &v,
            block_table: &table,
        };
        attention_prefill::prefill_paged(&s, &q, &cache, &cu, &ctx_lens, &mut out, &params)
    }))
}
