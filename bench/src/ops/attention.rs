//! Table cases for `fl_kernels::attention` (torch side: `torch_attention.py`).

use fl_kernels::attention::{self, DecodeParams, DecodeWorkspace, KvCache};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

/// Decode shapes of the issue: batch x context from 1 x 32768 to 64 x 4096, 32 q heads,
/// head_dim 128, 8 and 32 kv heads.
pub const DECODE_SHAPES: [(usize, usize); 5] =
    [(1, 32768), (4, 16384), (16, 8192), (64, 4096), (1, 4096)];

/// `batch` sequences of `len` keys in a contiguous cache of exactly `len` positions.
fn decode_case<T: FloatDType>(batch: usize, len: usize, hkv: usize) -> Case {
    let mut c = decode_cache_case::<T>(batch, len, hkv, len, None);
    c.op = "decode_attn";
    c.shape = format!("b{batch}_L{len}_q32_kv{hkv}_d128");
    c
}

/// `batch` sequences of `len` keys in a cache of `cap` positions, contiguous or paged (`block`
/// tokens per block, each sequence's blocks in order): what a continuous-batching runner's
/// decode graph, whose split layout covers the capacity, costs beside a cache sized to the
/// sequences.
fn decode_cache_case<T: FloatDType>(
    batch: usize,
    len: usize,
    hkv: usize,
    cap: usize,
    block: Option<usize>,
) -> Case {
    let (hq, d) = (32usize, 128usize);
    let es = std::mem::size_of::<T>();
    let kv_bytes = 2 * batch * hkv * len * d * es;
    let qo_bytes = 2 * batch * hq * d * es;
    let layout = block.map_or("contig".to_string(), |b| format!("paged{b}"));
    Case {
        op: "decode_attn_cache",
        dtype: T::NAME,
        shape: format!("b{batch}_L{len}_cap{cap}_{layout}_q{hq}_kv{hkv}_d{d}"),
        bytes: (kv_bytes + qo_bytes + 4 * batch) as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let q = bench_tensor::<T>(gpu, &[batch, hq, d], 1)?;
            let lens = DeviceTensor::from_host(&s, &vec![len as i32; batch], &[batch])?;
            let params = DecodeParams::new(d, cap);
            let mut out = DeviceTensor::<T>::zeros(&s, &[batch, hq, d])?;
            let l: Launch = match block {
                None => {
                    let k = bench_tensor::<T>(gpu, &[batch, hkv, cap, d], 2)?;
                    let v = bench_tensor::<T>(gpu, &[batch, hkv, cap, d], 3)?;
                    let cache = KvCache::Contiguous { k: &k, v: &v };
                    let bytes = attention::decode_workspace_bytes(&s, &q, &cache, &lens, &params)?;
                    let mut ws = DecodeWorkspace::new(&s, bytes)?;
                    Box::new(move || {
                        let cache = KvCache::Contiguous { k: &k, v: &v };
                        attention::decode(&s, &q, &cache, &lens, &params, &mut ws, &mut out)
                    })
                }
                Some(bs) => {
                    let nb = cap.div_ceil(bs);
                    let k = bench_tensor::<T>(gpu, &[batch * nb, hkv, bs, d], 2)?;
                    let v = bench_tensor::<T>(gpu, &[batch * nb, hkv, bs, d], 3)?;
                    let ids: Vec<i32> = (0..(batch * nb) as i32).collect();
                    let table = DeviceTensor::from_host(&s, &ids, &[batch, nb])?;
                    let cache = KvCache::Paged {
                        k: &k,
                        v: &v,
                        block_table: &table,
                    };
                    let bytes = attention::decode_workspace_bytes(&s, &q, &cache, &lens, &params)?;
                    let mut ws = DecodeWorkspace::new(&s, bytes)?;
                    Box::new(move || {
                        let cache = KvCache::Paged {
                            k: &k,
                            v: &v,
                            block_table: &table,
                        };
                        attention::decode(&s, &q, &cache, &lens, &params, &mut ws, &mut out)
                    })
                }
            };
            Ok(l)
        }),
    }
}

/// Decode attention at every shape, kv heads 8 and 32, f16 (and bf16 and f32 at one shape);
/// then one 140-key sequence in caches of 144 and 4,096 positions, and 64 sequences of 1,100
/// keys in caches of 1,104 and 4,096, contiguous and paged (16-token blocks; 64 too at batch
/// 64): the static engine's and the runner's decode steps on llama-2-7b / llama-3-8b heads.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &(b, l) in &DECODE_SHAPES {
        v.push(decode_case::<f16>(b, l, 8));
        v.push(decode_case::<f16>(b, l, 32));
    }
    v.push(decode_case::<bf16>(64, 4096, 8));
    v.push(decode_case::<f32>(64, 4096, 8));
    for &(batch, len, short_cap) in &[(1usize, 140usize, 144usize), (64, 1100, 1104)] {
        for &hkv in &[32usize, 8] {
            for &cap in &[short_cap, 4096] {
                for block in [None, Some(16)] {
                    v.push(decode_cache_case::<f16>(batch, len, hkv, cap, block));
                }
            }
            // Longer blocks: longer runs of adjacent keys per (block, head).
            if batch > 1 {
                v.push(decode_cache_case::<f16>(batch, len, hkv, 4096, Some(64)));
            }
        }
    }
    v
}
