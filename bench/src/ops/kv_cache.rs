//! Table cases for `fl_kernels::kv_cache` (torch side: `torch_kv_cache.py`).
//!
//! K, V `[tokens, 8, 128]` f16 appended to a contiguous cache (`kv_append`) and to a paged
//! one with 16-slot blocks (`kv_append_paged`). Where the tokens go ([`layout`], mirrored by
//! the torch script): up to 64 tokens are a decode step (one token per sequence, positions
//! spread out); more are prefills of 4096-token sequences.
//!
//! `kv_rope_append`: the fused QKV split + RoPE + append ([`kv_cache::rope_append`]) from a
//! `[tokens, (32 + 2 kv) * 128]` f16 QKV row (7B: 32 kv heads; Llama-3-8B: 8) into a contiguous
//! cache, q written out; decode at 1, 16, 64 tokens and a 4096-token prefill.

use fl_kernels::kv_cache::{self, CacheLayout, KvCache, QkvSplit, RopeAppend, TokenSlots};
use fl_kernels::rope::RopeParams;
use fl_kernels::{f16, DeviceTensor};

use super::{bench_tensor, Case, Launch};

const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const BLOCK: usize = 16;
/// Positions per sequence in every case.
pub const MAX_SEQ: usize = 4096;

/// Where a case's tokens go.
pub struct Layout {
    /// Sequences in the cache.
    pub batch: usize,
    /// Positions per sequence (contiguous cache), `MAX_SEQ`.
    pub max_seq: usize,
    /// Sequence of each token.
    pub seq: Vec<i32>,
    /// Position of each token.
    pub pos: Vec<i32>,
    /// Paged: block table `[batch, max_seq / block]`, a fixed permutation of the blocks.
    pub table: Vec<i32>,
    /// Paged: blocks in the pool (`batch * max_seq / block`).
    pub num_blocks: usize,
}

/// The layout for `tokens` new tokens: decode (`tokens <= 64`: `tokens` sequences, token `i` at
/// position `1000 + 37 i`) or prefill (`tokens / 4096` sequences, positions `0..4096` each).
pub fn layout(tokens: usize, block: usize) -> Layout {
    let (batch, seq, pos): (usize, Vec<i32>, Vec<i32>) = if tokens <= 64 {
        (
            tokens,
            (0..tokens as i32).collect(),
            (0..tokens as i32).map(|i| 1000 + 37 * i).collect(),
        )
    } else {
        let b = tokens.div_ceil(MAX_SEQ);
        (
            b,
            (0..tokens).map(|i| (i / MAX_SEQ) as i32).collect(),
            (0..tokens).map(|i| (i % MAX_SEQ) as i32).collect(),
        )
    };
    let num_blocks = batch * MAX_SEQ / block;
    // 7919 is prime and never divides num_blocks here: i -> (7919 i + 13) mod n is a permutation.
    let table = (0..num_blocks)
        .map(|i| ((7919 * i + 13) % num_blocks) as i32)
        .collect();
    Layout {
        batch,
        max_seq: MAX_SEQ,
        seq,
        pos,
        table,
        num_blocks,
    }
}

fn case(tokens: usize, paged: bool) -> Case {
    let bytes =
        2 * tokens * KV_HEADS * HEAD_DIM * 4 + 8 * tokens + if paged { 4 * tokens } else { 0 };
    Case {
        op: if paged {
            "kv_append_paged"
        } else {
            "kv_append"
        },
        dtype: "f16",
        shape: format!("t{tokens}_kv{KV_HEADS}_d{HEAD_DIM}"),
        bytes: bytes as u64,
        make: Box::new(move |gpu| {
            let l = layout(tokens, BLOCK);
            let s = gpu.stream().clone();
            let k = bench_tensor::<f16>(gpu, &[tokens, KV_HEADS, HEAD_DIM], 1)?;
            let v = bench_tensor::<f16>(gpu, &[tokens, KV_HEADS, HEAD_DIM], 2)?;
            let seq = DeviceTensor::from_host(&s, &l.seq, &[tokens])?;
            let pos = DeviceTensor::from_host(&s, &l.pos, &[tokens])?;
            let l: Launch = if paged {
                let table = DeviceTensor::from_host(&s, &l.table, &[l.batch, MAX_SEQ / BLOCK])?;
                let mut cache =
                    KvCache::<f16>::zeros(&s, [l.num_blocks, KV_HEADS, BLOCK, HEAD_DIM])?;
                Box::new(move || {
                    let slots = TokenSlots {
                        seq_ids: &seq,
                        positions: &pos,
                    };
                    kv_cache::append_paged(&s, &k, &v, &slots, &table, &mut cache, None)
                })
            } else {
                let mut cache = KvCache::<f16>::zeros(&s, [l.batch, KV_HEADS, MAX_SEQ, HEAD_DIM])?;
                Box::new(move || {
                    let slots = TokenSlots {
                        seq_ids: &seq,
                        positions: &pos,
                    };
                    kv_cache::append(&s, &k, &v, &slots, &mut cache, None)
                })
            };
            Ok(l)
        }),
    }
}

/// rope_theta of the fused cases.
const THETA: f64 = 500_000.0;

fn rope_append_case(tokens: usize, q_heads: usize, kv_heads: usize) -> Case {
    let width = (q_heads + 2 * kv_heads) * HEAD_DIM;
    // qkv read; q, k, v written; slot indices read.
    let bytes = 2 * tokens * width * 2 + 8 * tokens;
    Case {
        op: "kv_rope_append",
        dtype: "f16",
        shape: format!("t{tokens}_q{q_heads}_kv{kv_heads}_d{HEAD_DIM}"),
        bytes: bytes as u64,
        make: Box::new(move |gpu| {
            let l = layout(tokens, BLOCK);
            let s = gpu.stream().clone();
            let qkv = bench_tensor::<f16>(gpu, &[tokens, width], 3)?;
            let seq = DeviceTensor::from_host(&s, &l.seq, &[tokens])?;
            let pos = DeviceTensor::from_host(&s, &l.pos, &[tokens])?;
            let mut q = DeviceTensor::<f16>::zeros(&s, &[tokens, q_heads, HEAD_DIM])?;
            let mut cache = KvCache::<f16>::zeros(&s, [l.batch, kv_heads, MAX_SEQ, HEAD_DIM])?;
            let rope = RopeParams::new(HEAD_DIM, THETA);
            Ok(Box::new(move || {
                let args = RopeAppend {
                    qkv: &qkv,
                    heads: QkvSplit { q_heads, kv_heads },
                    slots: TokenSlots {
                        seq_ids: &seq,
                        positions: &pos,
                    },
                    rope: &rope,
                    layout: CacheLayout::Contiguous,
                };
                kv_cache::rope_append(&s, &args, &mut q, None, &mut cache, None)
            }) as Launch)
        }),
    }
}

/// Contiguous and paged append at 1, 64 (decode), 4096 and 65536 (prefill) tokens; the fused
/// rope + append at 1, 16, 64 and 4096 tokens for the 7B and Llama-3-8B head counts.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for t in [1usize, 64, 4096, 65_536] {
        v.push(case(t, false));
        v.push(case(t, true));
    }
    for (hq, hkv) in [(32usize, 32usize), (32, 8)] {
        for t in [1usize, 16, 64, 4096] {
            v.push(rope_append_case(t, hq, hkv));
        }
    }
    v
}
