//! References for [`crate::kv_cache`](mod@crate::kv_cache).
//!
//! Each function appends one tensor (call it for K and for V) into a host copy of the cache and
//! returns the error-flag bits the kernel would set. Values are converted `I -> f32 -> C`, as
//! the kernels do (exact between our float types up to the final rounding).

use crate::dtype::FloatDType;
use crate::kv_cache::{ERR_BLOCK, ERR_POSITION, ERR_SEQUENCE};
use crate::reference::rope;
use crate::rope::RopeParams;

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

/// Reference of [`kv_cache::copy_blocks`](crate::kv_cache::copy_blocks) on one tensor (call it
/// for K and for V): `cache[dst] = cache[src]` for each row `(src, dst)` of `pairs` (`[n, 2]`
/// row-major) in a paged `cache` of shape `cache_shape = [num_blocks, kv_heads, block_size,
/// head_dim]`, every source read as it was before the call. A pair with an id outside
/// `0..num_blocks` copies nothing and sets [`ERR_BLOCK`]; returns the error-flag bits.
/// Panics on an odd `pairs` length or a cache of the wrong size (a test bug).
pub fn copy_blocks<C: FloatDType>(cache: &mut [C], cache_shape: [usize; 4], pairs: &[i32]) -> i32 {
    assert_eq!(cache.len(), cache_shape.iter().product::<usize>());
    assert_eq!(
        pairs.len() % 2,
        0,
        "reference::kv_cache: pairs is not [n, 2]"
    );
    let [num_blocks, kv_heads, block_size, head_dim] = cache_shape;
    let block = kv_heads * block_size * head_dim;
    let before = cache.to_vec();
    let valid = |b: i32| b >= 0 && (b as usize) < num_blocks;
    let mut flag = 0;
    for pair in pairs.chunks_exact(2) {
        let (src, dst) = (pair[0], pair[1]);
        if !valid(src) || !valid(dst) {
            flag |= ERR_BLOCK;
            continue;
        }
        cache[dst as usize * block..][..block]
            .copy_from_slice(&before[src as usize * block..][..block]);
    }
    flag
}

/// The cache layout for [`rope_append`].
#[derive(Clone, Copy, Debug)]
pub enum Layout<'a> {
    /// `cache_shape = [batch, kv_heads, max_seq, head_dim]`.
    Contiguous,
    /// `cache_shape = [num_blocks, kv_heads, block_size, head_dim]` through `block_table
    /// [batch, max_blocks]` (row-major).
    Paged {
        /// Block ids of each sequence.
        block_table: &'a [i32],
        /// Columns of the table.
        max_blocks: usize,
    },
}

/// What [`rope_append`] gives besides the caches: `q [tokens, q_heads, head_dim]`,
/// `k, v [tokens, kv_heads, head_dim]` in f64 (q and k rotated, unrounded), with every row of
/// a token whose slot is invalid set to NaN (the kernel does not write those), and the error
/// bits.
#[derive(Clone, Debug)]
pub struct RopeAppendOut {
    /// Rotated q, f64.
    pub q: Vec<f64>,
    /// Rotated k, f64.
    pub k: Vec<f64>,
    /// v as given, f64.
    pub v: Vec<f64>,
    /// Error-flag bits ([`ERR_SEQUENCE`], [`ERR_POSITION`], [`ERR_BLOCK`]).
    pub flag: i32,
}

/// Reference of [`kv_cache::rope_append`](crate::kv_cache::rope_append), composed of the
/// existing references: split `qkv [tokens, (q_heads + 2 kv_heads) * head_dim]` into q, k, v;
/// [`rope::apply`] (f64) on q and k; k rounded to `I` (what the
/// unfused `rope::apply` stores) and, with v, appended by [`append`] / [`append_paged`] into
/// `k_cache` / `v_cache` (converted to `C`). Rows of tokens whose slot is invalid are NaN in the
/// returned q, k, v, and nothing of theirs reaches the caches.
///
/// The cache values of k differ from the kernel's by the f32-vs-f64 rotation (at most one
/// rounding of `I` apart); v and untouched slots are exact. Panics on inconsistent lengths or
/// invalid params (a test bug).
#[allow(clippy::too_many_arguments)]
pub fn rope_append<I: FloatDType, C: FloatDType>(
    qkv: &[I],
    q_heads: usize,
    kv_heads: usize,
    rope: &RopeParams,
    seq_ids: &[i32],
    positions: &[i32],
    k_cache: &mut [C],
    v_cache: &mut [C],
    cache_shape: [usize; 4],
    layout: Layout<'_>,
) -> RopeAppendOut {
    let d = rope.head_dim;
    let tokens = positions.len();
    let row = (q_heads + 2 * kv_heads) * d;
    assert_eq!(
        qkv.len(),
        tokens * row,
        "reference::kv_cache::rope_append: qkv is not [tokens, (q_heads + 2 kv_heads) * head_dim]"
    );
    assert_eq!(
        seq_ids.len(),
        tokens,
        "reference::kv_cache::rope_append: seq_ids"
    );
    assert_eq!(
        cache_shape[1], kv_heads,
        "reference::kv_cache::rope_append: cache kv_heads"
    );
    assert_eq!(
        cache_shape[3], d,
        "reference::kv_cache::rope_append: cache head_dim"
    );
    let part = |from: usize, heads: usize| -> Vec<I> {
        (0..tokens)
            .flat_map(|t| qkv[t * row + from * d..][..heads * d].iter().copied())
            .collect()
    };
    let (q, k, v) = (
        part(0, q_heads),
        part(q_heads, kv_heads),
        part(q_heads + kv_heads, kv_heads),
    );
    let (mut q, _) = rope::apply(&q, q_heads, positions, rope, None);
    let (mut k, _) = rope::apply(&k, kv_heads, positions, rope, None);
    let mut v: Vec<f64> = v.iter().map(|x| x.to_f64()).collect();
    // k as the unfused rope::apply stores it (rounded to I), then appended.
    let k_i: Vec<I> = k.iter().map(|&x| I::from_f32(x as f32)).collect();
    let v_i: Vec<I> = v.iter().map(|&x| I::from_f32(x as f32)).collect();
    let flag = match layout {
        Layout::Contiguous => {
            append(k_cache, cache_shape, &k_i, seq_ids, positions)
                | append(v_cache, cache_shape, &v_i, seq_ids, positions)
        }
        Layout::Paged {
            block_table,
            max_blocks,
        } => {
            append_paged(
                k_cache,
                cache_shape,
                &k_i,
                seq_ids,
                positions,
                block_table,
                max_blocks,
            ) | append_paged(
                v_cache,
                cache_shape,
                &v_i,
                seq_ids,
                positions,
                block_table,
                max_blocks,
            )
        }
    };
    for (t, (&s, &p)) in seq_ids.iter().zip(positions).enumerate() {
        let bad = match layout {
            Layout::Contiguous => contiguous_slot(cache_shape, s, p).is_err(),
            Layout::Paged {
                block_table,
                max_blocks,
            } => paged_slot(cache_shape, block_table, max_blocks, s, p).is_err(),
        };
        if bad {
            q[t * q_heads * d..][..q_heads * d].fill(f64::NAN);
            k[t * kv_heads * d..][..kv_heads * d].fill(f64::NAN);
            v[t * kv_heads * d..][..kv_heads * d].fill(f64::NAN);
        }
    }
    RopeAppendOut { q, k, v, flag }
}
