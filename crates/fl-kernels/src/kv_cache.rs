//! KV-cache append: this step's K and V (after RoPE) written into a contiguous cache
//! ([`append`]) or a paged, vLLM-style cache ([`append_paged`]), held in a [`KvCache`].
//!
//! New tokens are packed, `[tokens, kv_heads, head_dim]`, and each names its slot by a
//! sequence index and a position ([`TokenSlots`]: two `i32 [tokens]` device tensors; the
//! positions are the ones RoPE takes). This one form covers decode (one token per sequence),
//! prefill of one or several sequences, and mixed ragged batches.
//!
//! Slots that do not exist (a position past the cache, a sequence outside the batch, a block id
//! outside the pool) cannot be checked on the host, since positions live on the device: the
//! kernel skips such a token and sets a bit ([`ERR_SEQUENCE`], [`ERR_POSITION`],
//! [`ERR_BLOCK`]) in an optional error flag, an `i32 [1]` device tensor (see
//! [`check_error_flag`]). Everything the host knows (shapes, sizes) is checked before launch.
//!
//! [`rope_append`] fuses the step before: it takes the fused QKV GEMM output, applies rotary
//! embedding to q and k, writes q out and k, v into the cache, in one launch.
//!
//! [`copy_blocks`] copies whole blocks of a paged cache (copy-on-write of blocks shared by
//! forked sequences or beams), every pair of a step in one launch.
//!
//! CPU references: [`crate::reference::kv_cache`](mod@crate::reference::kv_cache).

use std::sync::Arc;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::dtype::FloatDType;
use crate::error::check;
use crate::rope::RopeParams;
use crate::tensor::{as_i32, as_i64, check_flag_bits, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Error-flag bit: a token's sequence index was `< 0` or `>= batch`.
pub const ERR_SEQUENCE: i32 = fl_kernels_sys::FL_KV_ERR_SEQUENCE as i32;
/// Error-flag bit: a position was `< 0`, `>= max_seq` (contiguous) or past the block table
/// (paged).
pub const ERR_POSITION: i32 = fl_kernels_sys::FL_KV_ERR_POSITION as i32;
/// Error-flag bit: a block id from the block table (paged append) or a `src` / `dst` of
/// [`copy_blocks`] was `< 0` or `>= num_blocks`.
pub const ERR_BLOCK: i32 = fl_kernels_sys::FL_KV_ERR_BLOCK as i32;

/// The K and V caches of one layer, two 4-D tensors of the same shape.
///
/// Contiguous layout (for [`append`]): `[batch, kv_heads, max_seq, head_dim]`.
/// Paged layout (for [`append_paged`]): `[num_blocks, kv_heads, block_size, head_dim]`.
///
/// ```no_run
/// use fl_kernels::{kv_cache::KvCache, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let cache = KvCache::<f16>::zeros(gpu.stream(), [4, 8, 4096, 128])?;
/// assert_eq!(cache.shape(), [4, 8, 4096, 128]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[derive(Debug)]
pub struct KvCache<C: FloatDType> {
    k: DeviceTensor<C>,
    v: DeviceTensor<C>,
}

impl<C: FloatDType> KvCache<C> {
    /// Both tensors, to be written by a launcher of another module (k, v).
    pub(crate) fn parts_mut(&mut self) -> (&mut DeviceTensor<C>, &mut DeviceTensor<C>) {
        (&mut self.k, &mut self.v)
    }

    /// Wraps two tensors. Errors: [`Error::Shape`] naming `k` when it is not 4-D, or `v`
    /// when its shape differs from `k`'s.
    pub fn new(k: DeviceTensor<C>, v: DeviceTensor<C>) -> Result<Self> {
        if k.shape().len() != 4 {
            return Err(Error::Shape {
                arg: "k",
                expected: "4-D [batch or num_blocks, kv_heads, max_seq or block_size, head_dim]"
                    .into(),
                got: k.shape().to_vec(),
            });
        }
        expect_shape("v", &v, k.shape())?;
        Ok(KvCache { k, v })
    }

    /// Two zero-filled tensors of `shape`.
    pub fn zeros(stream: &Arc<CudaStream>, shape: [usize; 4]) -> Result<Self> {
        Self::new(
            DeviceTensor::zeros(stream, &shape)?,
            DeviceTensor::zeros(stream, &shape)?,
        )
    }

    /// The shape of each of the two tensors.
    pub fn shape(&self) -> [usize; 4] {
        let s = self.k.shape();
        [s[0], s[1], s[2], s[3]]
    }

    /// The K cache.
    pub fn k(&self) -> &DeviceTensor<C> {
        &self.k
    }

    /// The V cache.
    pub fn v(&self) -> &DeviceTensor<C> {
        &self.v
    }

    /// Gives the two tensors back, `(k, v)`.
    pub fn into_parts(self) -> (DeviceTensor<C>, DeviceTensor<C>) {
        (self.k, self.v)
    }
}

/// Where each new token goes: `seq_ids[t]` (its sequence, the cache's batch row) and
/// `positions[t]` (its position in that sequence), both `i32 [tokens]` on the device.
#[derive(Clone, Copy, Debug)]
pub struct TokenSlots<'a> {
    /// Sequence index of each token.
    pub seq_ids: &'a DeviceTensor<i32>,
    /// Position of each token in its sequence.
    pub positions: &'a DeviceTensor<i32>,
}

/// Device pointer of an optional error flag (`i32 [1]`), null when absent.
pub(crate) fn flag_ptr<'a>(
    stream: &'a CudaStream,
    flag: Option<&'a mut DeviceTensor<i32>>,
) -> Result<(u64, Option<SyncOnDrop<'a>>)> {
    match flag {
        None => Ok((0, None)),
        Some(f) => {
            expect_shape("err_flag", f, &[1])?;
            let (p, g) = f.ptr_mut(stream);
            Ok((p, Some(g)))
        }
    }
}

/// New K/V and slots checked against the cache's `kv_heads` and `head_dim`: returns `tokens`.
fn check_new<I: FloatDType>(
    k: &DeviceTensor<I>,
    v: &DeviceTensor<I>,
    slots: &TokenSlots<'_>,
    kv_heads: usize,
    head_dim: usize,
) -> Result<usize> {
    let tokens = match k.shape() {
        &[t, h, d] if h == kv_heads && d == head_dim => t,
        _ => {
            return Err(Error::Shape {
                arg: "k",
                expected: format!(
                    "[tokens, {kv_heads}, {head_dim}] (kv_heads, head_dim of the cache)"
                ),
                got: k.shape().to_vec(),
            })
        }
    };
    expect_shape("v", v, k.shape())?;
    expect_shape("seq_ids", slots.seq_ids, &[tokens])?;
    expect_shape("positions", slots.positions, &[tokens])?;
    as_i32("kv_heads * head_dim", kv_heads.saturating_mul(head_dim))?;
    Ok(tokens)
}

/// Appends `k` and `v` to a contiguous cache: for each token `t` with `s = seq_ids[t]`,
/// `p = positions[t]` and each head `h`:
/// `cache.k[s, h, p, :] = k[t, h, :]`, `cache.v[s, h, p, :] = v[t, h, :]`,
/// converted from `I` to `C` through f32 (round to nearest even). Nothing else is written.
///
/// Shapes: `k, v [tokens, kv_heads, head_dim]`; `slots.seq_ids, slots.positions [tokens]`;
/// `cache` `[batch, kv_heads, max_seq, head_dim]`; `err_flag [1]`. Dtypes: `I`, `C` any of `f32`,
/// `f16`, `bf16` (usually equal, or f32 → f16 / bf16). Each (sequence, position) must appear at
/// most once per call (else one of the writes wins, unspecified which).
///
/// Errors: [`Error::Shape`] naming `k` (not `[tokens, kv_heads, head_dim]` of the cache), `v`,
/// `seq_ids`, `positions` or `err_flag`; [`Error::InvalidArgument`] naming `cache` when it is
/// empty and there are tokens; [`Error::TooLarge`] for `batch` / `kv_heads * head_dim` past
/// `i32`. On the device a token with `s` outside `0..batch` or `p` outside `0..max_seq` is not
/// written and sets [`ERR_SEQUENCE`] / [`ERR_POSITION`] in `err_flag` when given.
///
/// ```no_run
/// use fl_kernels::{kv_cache::{self, KvCache, TokenSlots}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let mut cache = KvCache::<f16>::zeros(s, [2, 8, 4096, 128])?;
/// // decode step: one token for each of the two sequences, at positions 17 and 5
/// let k = DeviceTensor::<f16>::zeros(s, &[2, 8, 128])?;
/// let v = DeviceTensor::<f16>::zeros(s, &[2, 8, 128])?;
/// let seq_ids = DeviceTensor::from_host(s, &[0i32, 1], &[2])?;
/// let positions = DeviceTensor::from_host(s, &[17i32, 5], &[2])?;
/// let mut flag = DeviceTensor::<i32>::zeros(s, &[1])?;
/// let slots = TokenSlots { seq_ids: &seq_ids, positions: &positions };
/// kv_cache::append(s, &k, &v, &slots, &mut cache, Some(&mut flag))?;
/// kv_cache::check_error_flag(s, &flag)?; // waits; Err if a slot did not exist
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn append<I: FloatDType, C: FloatDType>(
    stream: &CudaStream,
    k: &DeviceTensor<I>,
    v: &DeviceTensor<I>,
    slots: &TokenSlots<'_>,
    cache: &mut KvCache<C>,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let [batch, kv_heads, max_seq, head_dim] = cache.shape();
    let tokens = check_new(k, v, slots, kv_heads, head_dim)?;
    let batch_i = as_i32("batch", batch)?;
    let (pf, _gf) = flag_ptr(stream, err_flag)?;
    if tokens == 0 {
        return Ok(());
    }
    if cache.k.is_empty() {
        return Err(Error::invalid(
            "cache",
            format!("shape {:?} holds no slot", cache.shape()),
        ));
    }
    let t = as_i64("k", tokens)?;
    let (pk, _gk) = k.ptr(stream);
    let (pv, _gv) = v.ptr(stream);
    let (ps, _gs) = slots.seq_ids.ptr(stream);
    let (pp, _gp) = slots.positions.ptr(stream);
    let (pkc, _gkc) = cache.k.ptr_mut(stream);
    let (pvc, _gvc) = cache.v.ptr_mut(stream);
    // SAFETY: k and v hold tokens * kv_heads * head_dim elements of I, seq_ids and positions
    // `tokens` i32, the caches batch * kv_heads * max_seq * head_dim elements of C (shapes checked
    // above); the kernel writes only slots with s < batch and p < max_seq. The flag is one i32 or
    // null. Buffers live until the guards drop, after the launch is queued on `stream`.
    let status = unsafe {
        fl_kernels_sys::fl_kv_append(
            I::ID,
            pk as _,
            pv as _,
            (kv_heads * head_dim) as i64,
            (kv_heads * head_dim) as i64,
            t,
            kv_heads as i32,
            head_dim as i32,
            ps as _,
            pp as _,
            C::ID,
            pkc as _,
            pvc as _,
            batch_i,
            max_seq as i64,
            pf as _,
            raw_stream(stream),
        )
    };
    check("kv_cache::append", status)
}

/// `(batch, max_blocks_per_seq)` of a block table, checked: [`Error::Shape`] naming
/// `block_table` unless it is 2-D with at least one column.
pub(crate) fn block_table_dims(block_table: &DeviceTensor<i32>) -> Result<(usize, usize)> {
    match *block_table.shape() {
        [b, m] if m > 0 => Ok((b, m)),
        _ => Err(Error::Shape {
            arg: "block_table",
            expected: "[batch, max_blocks_per_seq] with max_blocks_per_seq >= 1".into(),
            got: block_table.shape().to_vec(),
        }),
    }
}

/// Appends `k` and `v` to a paged cache (vLLM layout): the token of sequence `s` at position `p`
/// goes to block `b = block_table[s, p / block_size]`, slot `p % block_size`:
/// `cache.k[b, h, p % block_size, :] = k[t, h, :]` (same for `v`), converted from `I` to `C`.
///
/// Shapes: `k, v [tokens, kv_heads, head_dim]`; `slots` `[tokens]` each;
/// `block_table [batch, max_blocks_per_seq]` (i32); `cache`
/// `[num_blocks, kv_heads, block_size, head_dim]`; `err_flag [1]`.
///
/// Errors: as [`append`], plus [`Error::Shape`] naming `block_table` when it is not 2-D or
/// has no column. On the device a token with `s` outside `0..batch`, a negative `p` or one with
/// `p / block_size >= max_blocks_per_seq`, or a block id outside `0..num_blocks` is not written
/// and sets [`ERR_SEQUENCE`], [`ERR_POSITION`] or [`ERR_BLOCK`] in `err_flag` when given.
///
/// ```no_run
/// use fl_kernels::{kv_cache::{self, KvCache, TokenSlots}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// // 64 blocks of 16 slots; one sequence owning blocks 7 and 3 (positions 0..32)
/// let mut cache = KvCache::<f16>::zeros(s, [64, 8, 16, 128])?;
/// let table = DeviceTensor::from_host(s, &[7i32, 3], &[1, 2])?;
/// let k = DeviceTensor::<f16>::zeros(s, &[1, 8, 128])?;
/// let v = DeviceTensor::<f16>::zeros(s, &[1, 8, 128])?;
/// let seq_ids = DeviceTensor::from_host(s, &[0i32], &[1])?;
/// let positions = DeviceTensor::from_host(s, &[20i32], &[1])?; // block 3, slot 4
/// let slots = TokenSlots { seq_ids: &seq_ids, positions: &positions };
/// kv_cache::append_paged(s, &k, &v, &slots, &table, &mut cache, None)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn append_paged<I: FloatDType, C: FloatDType>(
    stream: &CudaStream,
    k: &DeviceTensor<I>,
    v: &DeviceTensor<I>,
    slots: &TokenSlots<'_>,
    block_table: &DeviceTensor<i32>,
    cache: &mut KvCache<C>,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let [num_blocks, kv_heads, block_size, head_dim] = cache.shape();
    let tokens = check_new(k, v, slots, kv_heads, head_dim)?;
    let (batch, max_blocks) = block_table_dims(block_table)?;
    let batch_i = as_i32("batch", batch)?;
    let max_blocks_i = as_i32("block_table", max_blocks)?;
    let block_size_i = as_i32("block_size", block_size)?;
    let (pf, _gf) = flag_ptr(stream, err_flag)?;
    if tokens == 0 {
        return Ok(());
    }
    if cache.k.is_empty() {
        return Err(Error::invalid(
            "cache",
            format!("shape {:?} holds no slot", cache.shape()),
        ));
    }
    if batch == 0 {
        return Err(Error::Shape {
            arg: "block_table",
            expected: "[batch, max_blocks_per_seq] with batch >= 1 (there are tokens)".into(),
            got: block_table.shape().to_vec(),
        });
    }
    let t = as_i64("k", tokens)?;
    let (pk, _gk) = k.ptr(stream);
    let (pv, _gv) = v.ptr(stream);
    let (ps, _gs) = slots.seq_ids.ptr(stream);
    let (pp, _gp) = slots.positions.ptr(stream);
    let (pt, _gt) = block_table.ptr(stream);
    let (pkc, _gkc) = cache.k.ptr_mut(stream);
    let (pvc, _gvc) = cache.v.ptr_mut(stream);
    // SAFETY: as in `append`; the block table holds batch * max_blocks i32 and the kernel reads
    // entry (s, p / block_size) only for s < batch and p / block_size < max_blocks, and writes
    // only blocks < num_blocks.
    let status = unsafe {
        fl_kernels_sys::fl_kv_append_paged(
            I::ID,
            pk as _,
            pv as _,
            (kv_heads * head_dim) as i64,
            (kv_heads * head_dim) as i64,
            t,
            kv_heads as i32,
            head_dim as i32,
            ps as _,
            pp as _,
            pt as _,
            batch_i,
            max_blocks_i,
            C::ID,
            pkc as _,
            pvc as _,
            num_blocks as i64,
            block_size_i,
            pf as _,
            raw_stream(stream),
        )
    };
    check("kv_cache::append_paged", status)
}

/// Largest block [`copy_blocks`] takes, in elements (the launcher's grid holds 65,535 chunks of
/// 1,024 words, and a word is at least one element).
const MAX_COPY_BLOCK_ELEMS: usize = 65_535 * 1_024;

/// Copies whole blocks of a paged cache, K and V, in one launch: for each row `(src, dst)` of
/// `pairs`,
///
/// ```text
/// cache.k[dst, :, :, :] = cache.k[src, :, :, :],   cache.v[dst, :, :, :] = cache.v[src, :, :, :]
/// ```
///
/// bit for bit (a raw copy). This is the copy-on-write step of a block manager: before a
/// sequence appends into a partial block it shares with a fork (beams, `n > 1` sampling), it
/// moves to a fresh block, and the runner copies the shared block into it before the step's KV
/// writes (queue this first on the same stream). Whole blocks are copied, whatever prefix of
/// slots is filled.
///
/// Shapes: `pairs [n, 2]` (i32, row-major `src, dst`); `cache` `[num_blocks, kv_heads,
/// block_size, head_dim]`; `err_flag [1]`. Dtypes: `C` any of `f32`, `f16`, `bf16`.
/// Precondition (what a block manager guarantees): the `dst` ids are distinct and none is also
/// a `src` in the same call; `src` ids may repeat (one block copied to several forks). If it is
/// broken the copied contents are unspecified (nothing outside the cache is touched).
/// `n == 0` launches nothing.
///
/// Errors: [`Error::Shape`] naming `pairs` (not `[n, 2]`) or `err_flag`;
/// [`Error::InvalidArgument`] naming `cache` when it is empty and there are pairs;
/// [`Error::TooLarge`] naming `pairs` (`n` past `i32`), `kv_heads`, `block_size`, `head_dim`
/// (past `i32`) or `cache` (a block of more than 65,535 × 1,024 elements). On the device a
/// pair with `src` or `dst` outside `0..num_blocks` copies nothing and sets [`ERR_BLOCK`] in
/// `err_flag` when given (see [`check_error_flag`]).
///
/// ```no_run
/// use fl_kernels::{kv_cache::{self, KvCache}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// // 64 blocks of 16 slots; three beams share the partial block 5: two move to fresh blocks
/// let mut cache = KvCache::<f16>::zeros(s, [64, 8, 16, 128])?;
/// let pairs = DeviceTensor::from_host(s, &[5i32, 12, 5, 13], &[2, 2])?;
/// let mut flag = DeviceTensor::<i32>::zeros(s, &[1])?;
/// kv_cache::copy_blocks(s, &pairs, &mut cache, Some(&mut flag))?;
/// kv_cache::check_error_flag(s, &flag)?; // waits; Err if a block id was outside the pool
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn copy_blocks<C: FloatDType>(
    stream: &CudaStream,
    pairs: &DeviceTensor<i32>,
    cache: &mut KvCache<C>,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let n = match pairs.shape() {
        &[n, 2] => n,
        _ => {
            return Err(Error::Shape {
                arg: "pairs",
                expected: "[n, 2] (src, dst block ids)".into(),
                got: pairs.shape().to_vec(),
            })
        }
    };
    let n_i = as_i32("pairs", n)?;
    let [num_blocks, kv_heads, block_size, head_dim] = cache.shape();
    let kv_heads_i = as_i32("kv_heads", kv_heads)?;
    let block_size_i = as_i32("block_size", block_size)?;
    let head_dim_i = as_i32("head_dim", head_dim)?;
    let (pf, _gf) = flag_ptr(stream, err_flag)?;
    if n == 0 {
        return Ok(());
    }
    if cache.k.is_empty() {
        return Err(Error::invalid(
            "cache",
            format!("shape {:?} holds no block", cache.shape()),
        ));
    }
    // The cache exists in memory, so this product cannot overflow.
    let block_elems = kv_heads * block_size * head_dim;
    if block_elems > MAX_COPY_BLOCK_ELEMS {
        return Err(Error::TooLarge {
            arg: "cache",
            value: block_elems,
            limit: MAX_COPY_BLOCK_ELEMS,
        });
    }
    let (pp, _gp) = pairs.ptr(stream);
    let (pkc, _gkc) = cache.k.ptr_mut(stream);
    let (pvc, _gvc) = cache.v.ptr_mut(stream);
    // SAFETY: pairs holds n * 2 i32; the caches num_blocks * kv_heads * block_size * head_dim
    // elements of C each (checked above), and the kernel reads and writes only blocks whose ids
    // are in 0..num_blocks. The flag is one i32 or null. Buffers live until the guards drop,
    // after the launch is queued on `stream`.
    let status = unsafe {
        fl_kernels_sys::fl_kv_copy_blocks(
            C::ID,
            pkc as _,
            pvc as _,
            num_blocks as i64,
            kv_heads_i,
            block_size_i,
            head_dim_i,
            pp as _,
            n_i,
            pf as _,
            raw_stream(stream),
        )
    };
    check("kv_cache::copy_blocks", status)
}

/// Reads an error flag written by [`append`], [`append_paged`], [`rope_append`] or
/// [`copy_blocks`] (waits for `stream`): `Ok` when it is 0, else [`Error::DeviceCheck`]
/// listing what was found. The flag is not cleared; zero it (e.g. `copy_from_host(s, &[0])`)
/// to reuse it.
///
/// Errors: also [`Error::Shape`] naming `err_flag` when it is not `[1]`.
pub fn check_error_flag(stream: &Arc<CudaStream>, err_flag: &DeviceTensor<i32>) -> Result<()> {
    check_flag_bits(
        stream,
        err_flag,
        "kv_cache",
        &[
            (ERR_SEQUENCE, "a sequence index outside the batch"),
            (ERR_POSITION, "a position outside the cache"),
            (ERR_BLOCK, "a block id outside the block pool"),
        ],
        "those tokens (or block copies) were not written",
    )
}

/// Head counts of a fused QKV row for [`rope_append`]: per token `q_heads` q heads, then
/// `kv_heads` k heads, then `kv_heads` v heads (the layout of one GEMM with the stacked
/// `[q; k; v]` weight; the same type as [`quant::QkvHeads`](crate::quant::QkvHeads)).
pub type QkvSplit = crate::quant::QkvHeads;

/// Heads per fused QKV row, `q_heads + 2 kv_heads`, checked: [`Error::InvalidArgument`]
/// naming `heads` when there is no kv head or the row (`* head_dim` elements) passes
/// `i32::MAX`. Shared by [`rope_append`] and `gemv_dense::linear_rope_append`.
pub(crate) fn qkv_row_heads(heads: QkvSplit, head_dim: usize) -> Result<usize> {
    let QkvSplit { q_heads, kv_heads } = heads;
    if kv_heads == 0 {
        return Err(Error::invalid(
            "heads",
            format!("{heads:?}: need at least one kv head"),
        ));
    }
    kv_heads
        .checked_mul(2)
        .and_then(|h| h.checked_add(q_heads))
        .filter(|&h| {
            h.checked_mul(head_dim)
                .is_some_and(|w| w <= i32::MAX as usize)
        })
        .ok_or_else(|| {
            Error::invalid(
                "heads",
                format!("{heads:?}: (q_heads + 2 kv_heads) * head_dim must be <= i32::MAX"),
            )
        })
}

/// Which cache layout [`rope_append`] (and
/// [`gemv_dense::linear_rope_append`](crate::gemv_dense::linear_rope_append)) writes.
#[derive(Clone, Copy, Debug)]
pub enum CacheLayout<'a> {
    /// `[batch, kv_heads, max_seq, head_dim]`, as [`append`].
    Contiguous,
    /// `[num_blocks, kv_heads, block_size, head_dim]` through `block_table [batch,
    /// max_blocks_per_seq]` (i32), as [`append_paged`].
    Paged {
        /// Block ids of each sequence, row-major `[batch, max_blocks_per_seq]`.
        block_table: &'a DeviceTensor<i32>,
    },
}

/// The inputs of [`rope_append`]: the fused QKV GEMM output, how it splits, where each token
/// goes, the rotary configuration and the cache layout.
#[derive(Clone, Copy, Debug)]
pub struct RopeAppend<'a, I: FloatDType> {
    /// `[tokens, (q_heads + 2 kv_heads) * head_dim]` or `[tokens, q_heads + 2 kv_heads,
    /// head_dim]`: per token the q heads, then the k heads, then the v heads.
    pub qkv: &'a DeviceTensor<I>,
    /// Head counts.
    pub heads: QkvSplit,
    /// Sequence and position of each token (the positions also give the rotary angles).
    pub slots: TokenSlots<'a>,
    /// Rotary embedding (`rope.head_dim` is the head size).
    pub rope: &'a RopeParams,
    /// Cache layout (and block table).
    pub layout: CacheLayout<'a>,
}

/// Fused QKV split + rotary embedding + KV-cache append, one launch (in place of
/// [`rope::apply`](crate::rope::apply) on q and k followed by [`append`] /
/// [`append_paged`]).
///
/// With `q, k, v` the three parts of token `t`'s `qkv` row, `s = seq_ids[t]`,
/// `p = positions[t]` and `R` the rotation of [`rope::apply`](crate::rope::apply) at position
/// `p` (f32 angle `p · inv_freq[i]`, accurate sincos, `x0' = x0·cos − x1·sin`,
/// `x1' = x1·cos + x0·sin` with one fma each, rounded to `I`; elements past `rotary_dim`
/// copied):
///
/// ```text
/// q_out[t, h, :]           = R(q[t, h, :])                  h < q_heads
/// cache.k[slot(s, p), h, :] = C(R(k[t, h, :]))               h < kv_heads
/// cache.v[slot(s, p), h, :] = C(v[t, h, :])
/// k_out[t, h, :] = R(k[t, h, :]),  v_out[t, h, :] = v[t, h, :]   (when k_v_out is given)
/// ```
///
/// where `slot` is `[s, h, p]` (contiguous) or `[block_table[s, p / block_size], h,
/// p % block_size]` (paged), and `C(x)` converts `I → f32 → C`. The result is bit for bit that
/// of the unfused pair. Prefill passes `k_v_out` (the prefill attention reads this pass's packed
/// k and v); decode passes `None`.
///
/// Shapes: `qkv` as [`RopeAppend::qkv`]; `slots` `[tokens]` each; `q_out [tokens, q_heads,
/// head_dim]`; `k_out, v_out [tokens, kv_heads, head_dim]`; `cache` as [`CacheLayout`] with
/// the same `kv_heads` and `head_dim`; `err_flag [1]`. Dtypes: `I`, `C` any of `f32`, `f16`,
/// `bf16`. Each (sequence, position) at most once per call.
///
/// Errors: those of [`RopeParams::validate`]; [`Error::InvalidArgument`] naming `heads` (no kv
/// head, or the row width overflows) or `cache` (empty while there are tokens);
/// [`Error::Shape`] naming `qkv`, `seq_ids`, `positions`, `q_out`, `k_out`, `v_out`, `cache`
/// (kv_heads or head_dim differ), `block_table` or `err_flag`; [`Error::TooLarge`] for sizes
/// past `i32`. On the device a token whose slot does not exist (sequence outside `0..batch`, a
/// negative position, one past the cache or the block table, a block id outside the pool)
/// writes nothing at all (neither `q_out`, `k_out`, `v_out` nor the cache) and sets
/// [`ERR_SEQUENCE`], [`ERR_POSITION`] or [`ERR_BLOCK`] in `err_flag` when given (see
/// [`check_error_flag`]).
///
/// ```no_run
/// use fl_kernels::kv_cache::{self, CacheLayout, KvCache, QkvSplit, RopeAppend, TokenSlots};
/// use fl_kernels::{rope::RopeParams, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// // Llama-3-8B decode step: two sequences, one token each, at positions 17 and 5
/// let (heads, d) = (QkvSplit { q_heads: 32, kv_heads: 8 }, 128);
/// let qkv = DeviceTensor::<f16>::zeros(s, &[2, (32 + 2 * 8) * d])?; // the QKV GEMM output
/// let seq_ids = DeviceTensor::from_host(s, &[0i32, 1], &[2])?;
/// let positions = DeviceTensor::from_host(s, &[17i32, 5], &[2])?;
/// let rope = RopeParams::new(d, 500_000.0);
/// let mut q = DeviceTensor::<f16>::zeros(s, &[2, 32, d])?;
/// let mut cache = KvCache::<f16>::zeros(s, [2, 8, 4096, d])?;
/// let mut flag = DeviceTensor::<i32>::zeros(s, &[1])?;
/// let args = RopeAppend {
///     qkv: &qkv,
///     heads,
///     slots: TokenSlots { seq_ids: &seq_ids, positions: &positions },
///     rope: &rope,
///     layout: CacheLayout::Contiguous,
/// };
/// kv_cache::rope_append(s, &args, &mut q, None, &mut cache, Some(&mut flag))?;
/// kv_cache::check_error_flag(s, &flag)?; // waits; Err if a slot did not exist
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rope_append<I: FloatDType, C: FloatDType>(
    stream: &CudaStream,
    args: &RopeAppend<'_, I>,
    q_out: &mut DeviceTensor<I>,
    k_v_out: Option<(&mut DeviceTensor<I>, &mut DeviceTensor<I>)>,
    cache: &mut KvCache<C>,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let rope = args.rope;
    let p = rope.to_ffi()?;
    let d = rope.head_dim;
    let QkvSplit { q_heads, kv_heads } = args.heads;
    let row_heads = qkv_row_heads(args.heads, d)?;
    let width = row_heads * d;
    let tokens = match *args.qkv.shape() {
        [t, w] if w == width => t,
        [t, h, e] if h == row_heads && e == d => t,
        _ => {
            return Err(Error::Shape {
                arg: "qkv",
                expected: format!(
                    "[tokens, {width}] or [tokens, {row_heads}, {d}] ((q_heads + 2 kv_heads) \
                     heads of head_dim)"
                ),
                got: args.qkv.shape().to_vec(),
            })
        }
    };
    expect_shape("seq_ids", args.slots.seq_ids, &[tokens])?;
    expect_shape("positions", args.slots.positions, &[tokens])?;
    expect_shape("q_out", q_out, &[tokens, q_heads, d])?;
    let kv_shape = [tokens, kv_heads, d];
    let k_v_out = match k_v_out {
        None => None,
        Some((ko, vo)) => {
            expect_shape("k_out", ko, &kv_shape)?;
            expect_shape("v_out", vo, &kv_shape)?;
            Some((ko, vo))
        }
    };
    let [c0, c_heads, c_slots, c_dim] = cache.shape();
    if c_heads != kv_heads || c_dim != d {
        return Err(Error::Shape {
            arg: "cache",
            expected: format!(
                "[batch or num_blocks, {kv_heads}, max_seq or block_size, {d}] (kv_heads of \
                 heads, head_dim of rope)"
            ),
            got: cache.shape().to_vec(),
        });
    }
    // (batch, max_seq, block_table, max_blocks)
    let paged = match args.layout {
        CacheLayout::Contiguous => None,
        CacheLayout::Paged { block_table } => {
            let (b, m) = block_table_dims(block_table)?;
            Some((block_table, b, m))
        }
    };
    let batch = paged.map_or(c0, |(_, b, _)| b);
    let batch_i = as_i32("batch", batch)?;
    let max_blocks_i = as_i32("block_table", paged.map_or(0, |(_, _, m)| m))?;
    let block_size_i = match paged {
        Some(_) => as_i32("block_size", c_slots)?,
        None => 0,
    };
    let (pf, _gf) = flag_ptr(stream, err_flag)?;
    if tokens == 0 {
        return Ok(());
    }
    if cache.k.is_empty() {
        return Err(Error::invalid(
            "cache",
            format!("shape {:?} holds no slot", cache.shape()),
        ));
    }
    if batch == 0 {
        return Err(Error::Shape {
            arg: "block_table",
            expected: "[batch, max_blocks_per_seq] with batch >= 1 (there are tokens)".into(),
            got: paged.map_or(vec![], |(t, _, _)| t.shape().to_vec()),
        });
    }
    let t = as_i64("qkv", tokens)?;
    let (pqkv, _g1) = args.qkv.ptr(stream);
    let (ps, _g2) = args.slots.seq_ids.ptr(stream);
    let (pp, _g3) = args.slots.positions.ptr(stream);
    let (pq, _g4) = q_out.ptr_mut(stream);
    let (pko, _g5, pvo, _g6) = match k_v_out {
        None => (0, None, 0, None),
        Some((ko, vo)) => {
            let (a, ga) = ko.ptr_mut(stream);
            let (b, gb) = vo.ptr_mut(stream);
            (a, Some(ga), b, Some(gb))
        }
    };
    let (pkc, _g7) = cache.k.ptr_mut(stream);
    let (pvc, _g8) = cache.v.ptr_mut(stream);
    let status = match paged {
        None => {
            // SAFETY: qkv holds tokens * width elements of I, q_out tokens * q_heads * head_dim,
            // k_out / v_out (or null) tokens * kv_heads * head_dim, seq_ids and positions
            // `tokens` i32, the caches batch * kv_heads * max_seq * head_dim elements of C (all
            // checked above); the kernel writes only slots with s < batch and p < max_seq. `p`
            // lives across the call (the launcher copies the frequencies). The flag is one i32
            // or null. The guards keep every buffer alive until the launch is queued.
            unsafe {
                fl_kernels_sys::fl_kv_rope_append(
                    I::ID,
                    pqkv as _,
                    width as i64,
                    t,
                    q_heads as i32,
                    kv_heads as i32,
                    &p,
                    ps as _,
                    pp as _,
                    pq as _,
                    pko as _,
                    pvo as _,
                    C::ID,
                    pkc as _,
                    pvc as _,
                    batch_i,
                    c_slots as i64,
                    pf as _,
                    raw_stream(stream),
                )
            }
        }
        Some((table, _, _)) => {
            let (pt, _gt) = table.ptr(stream);
            // SAFETY: as above; the block table holds batch * max_blocks i32 and the kernel
            // reads entry (s, p / block_size) only for s < batch and p / block_size <
            // max_blocks, and writes only blocks < num_blocks of the cache.
            unsafe {
                fl_kernels_sys::fl_kv_rope_append_paged(
                    I::ID,
                    pqkv as _,
                    width as i64,
                    t,
                    q_heads as i32,
                    kv_heads as i32,
                    &p,
                    ps as _,
                    pp as _,
                    pq as _,
                    pko as _,
                    pvo as _,
                    pt as _,
                    batch_i,
                    max_blocks_i,
                    C::ID,
                    pkc as _,
                    pvc as _,
                    c0 as i64,
                    block_size_i,
                    pf as _,
                    raw_stream(stream),
                )
            }
        }
    };
    check("kv_cache::rope_append", status)
}
