//! Table cases for `fl_kernels::rope` (torch side: `torch_rope.py`).
//!
//! Q `[tokens, 32, 128]` and K `[tokens, 8, 128]` rotated in place, rotate-half, theta 500000:
//! `rope` computes the angles, `rope_table` reads a 65536-position cos/sin table. Positions:
//! up to 64 tokens are a decode step (token `i` at `1000 + 37 i`), more a prefill `0..tokens`.

use fl_kernels::rope::{self, RopeParams, RopeTable};
use fl_kernels::{bf16, f16, DeviceTensor, FloatDType};

use super::{bench_tensor, Case, Launch};

const Q_HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
/// Positions covered by the table.
pub const MAX_POS: usize = 65_536;
/// rope_theta of every case.
pub const THETA: f64 = 500_000.0;

/// The positions of `tokens` tokens (see the module docs).
pub fn positions(tokens: usize) -> Vec<i32> {
    if tokens <= 64 {
        (0..tokens as i32).map(|i| 1000 + 37 * i).collect()
    } else {
        (0..tokens as i32).collect()
    }
}

fn case<T: FloatDType>(tokens: usize, table: bool) -> Case {
    let bytes =
        2 * tokens * (Q_HEADS + KV_HEADS) * HEAD_DIM * std::mem::size_of::<T>() + 4 * tokens;
    Case {
        op: if table { "rope_table" } else { "rope" },
        dtype: T::NAME,
        shape: format!("t{tokens}_q{Q_HEADS}_kv{KV_HEADS}_d{HEAD_DIM}"),
        bytes: bytes as u64,
        make: Box::new(move |gpu| {
            let s = gpu.stream().clone();
            let params = RopeParams::new(HEAD_DIM, THETA);
            let mut q = bench_tensor::<T>(gpu, &[tokens, Q_HEADS, HEAD_DIM], 1)?;
            let mut k = bench_tensor::<T>(gpu, &[tokens, KV_HEADS, HEAD_DIM], 2)?;
            let pos = DeviceTensor::from_host(&s, &positions(tokens), &[tokens])?;
            let l: Launch = if table {
                let t = RopeTable::new(&s, &params, MAX_POS)?;
                Box::new(move || rope::apply_with_table(&s, &mut q, &mut k, &pos, &t, None))
            } else {
                Box::new(move || rope::apply(&s, &mut q, &mut k, &pos, &params, None))
            };
            Ok(l)
        }),
    }
}

/// Both paths at 1, 64, 4096 and 65536 tokens, f16 and bf16.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for t in [1usize, 64, 4096, 65_536] {
        for table in [false, true] {
            v.push(case::<f16>(t, table));
            v.push(case::<bf16>(t, table));
        }
    }
    v
}
