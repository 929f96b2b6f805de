//! References for [`crate::kv_cache`](mod@crate::kv_cache).
//!
//! Each function appends one tensor (call it for K and for V) into a host copy of the cache and
//! returns the error-flag bits the kernel would set. Values are converted `I -> f32 -> C`, as
//! the kernels do (exact between our float types up to the final rounding).

use crate::dtype::FloatDType;
use crate::kv_cache::{ERR_BLOCK, ERR_POSITION, ERR_SEQUENCE};

/// The element offset of `(seq, pos)`'s head-0 row in a contiguous cache
/// `[batch, kv_heads, max_seq, head_dim]`, or the error bit.
pub fn contiguous_slot(cache_shape: [usize; 4], seq: i32, pos: i32) -> Result<usize, i32> {
    let [batch, kv_heads, max_seq, head_dim] = cache_shape;
    if seq < 0 || seq as usize >= batch {
        return Err(ERR_SEQUENCE);
    }
    if pos < 0 || pos as usize >= max_seq {
        return Err(ERR_POSITION);
    }
    Ok((seq as usize * kv_heads * max_seq + pos as usize) * head_dim)
}

/// The element offset of `(seq, pos)`'s head-0 row in a paged cache
/// `[num_blocks, kv_heads, block_size, head_dim]` with `block_table [batch, max_blocks]`
/// (row-major), or the error bit.
pub fn paged_slot(
    cache_shape: [usize; 4],
    block_table: &[i32],
    max_blocks: usize,
    seq: i32,
    pos: i32,
) -> Result<usize, i32> {
    let [num_blocks, kv_heads, block_size, head_dim] = cache_shape;
    let batch = block_table.len() / max_blocks.max(1);
    if seq < 0 || seq as usize >= batch {
        return Err(ERR_SEQUENCE);
    }
    if pos < 0 || pos as usize / block_size >= max_blocks {
        return Err(ERR_POSITION);
    }
    let b = block_table[seq as usize * max_blocks + pos as usize / block_size];
    if b < 0 || b as usize >= num_blocks {
        return Err(ERR_BLOCK);
    }
    Ok((b as usize * kv_heads * block_size + pos as usize % block_size) * head_dim)
}

/// Writes `x [tokens, kv_heads, head_dim]` into `cache` at the rows `slot(seq, pos)` gives
/// (heads `head_stride` apart); `layout = [kv_heads, head_dim, head_stride]`; returns the OR
/// of the error bits.
fn scatter<I: FloatDType, C: FloatDType>(
    cache: &mut [C],
    layout: [usize; 3],
    x: &[I],
    seq_ids: &[i32],
    positions: &[i32],
    slot: impl Fn(i32, i32) -> Result<usize, i32>,
) -> i32 {
    let [kv_heads, head_dim, head_stride] = layout;
    assert_eq!(
        seq_ids.len(),
        positions.len(),
        "reference::kv_cache: slot lengths differ"
    );
    assert_eq!(
        x.len(),
        seq_ids.len() * kv_heads * head_dim,
        "reference::kv_cache: x is not [tokens, kv_heads, head_dim]"
    );
    let mut flag = 0;
    for (t, (&s, &p)) in seq_ids.iter().zip(positions).enumerate() {
        match slot(s, p) {
            Err(bit) => flag |= bit,
            Ok(base) => {
                for h in 0..kv_heads {
                    let src = &x[(t * kv_heads + h) * head_dim..][..head_dim];
                    let dst = &mut cache[base + h * head_stride..][..head_dim];
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = C::from_f32(v.to_f32());
                    }
                }
            }
        }
    }
    flag
}

/// Appends `x [tokens, kv_heads, head_dim]` into a contiguous `cache` of shape
/// `cache_shape = [batch, kv_heads, max_seq, head_dim]`; returns the error-flag bits.
/// Panics on inconsistent lengths (a test bug).
pub fn append<I: FloatDType, C: FloatDType>(
    cache: &mut [C],
    cache_shape: [usize; 4],
    x: &[I],
    seq_ids: &[i32],
    positions: &[i32],
) -> i32 {
    let [_, kv_heads, max_seq, head_dim] = cache_shape;
    assert_eq!(cache.len(), cache_shape.iter().product::<usize>());
    scatter(
        cache,
        [kv_heads, head_dim, max_seq * head_dim],
        x,
        seq_ids,
        positions,
        |s, p| contiguous_slot(cache_shape, s, p),
    )
}

/// Appends `x [tokens, kv_heads, head_dim]` into a paged `cache` of shape
/// `cache_shape = [num_blocks, kv_heads, block_size, head_dim]` through
/// `block_table [batch, max_blocks]`; returns the error-flag bits.
/// Panics on inconsistent lengths (a test bug).
pub fn append_paged<I: FloatDType, C: FloatDType>(
    cache: &mut [C],
    cache_shape: [usize; 4],
    x: &[I],
    seq_ids: &[i32],
    positions: &[i32],
    block_table: &[i32],
    max_blocks: usize,
) -> i32 {
    let [_, kv_heads, block_size, head_dim] = cache_shape;
    assert_eq!(cache.len(), cache_shape.iter().product::<usize>());
    scatter(
        cache,
        [kv_heads, head_dim, block_size * head_dim],
        x,
        seq_ids,
        positions,
        |s, p| paged_slot(cache_shape, block_table, max_blocks, s, p),
    )
}
