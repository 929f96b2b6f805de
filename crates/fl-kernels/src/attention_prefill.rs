//! Causal prefill attention over packed, padding-free sequences: [`prefill`]; its non-causal
//! twin for encoders: [`prefill_bidirectional`]; new tokens over a (paged) KV cache that
//! already holds their prefix: [`prefill_paged`].
//!
//! CPU reference: [`crate::reference::attention_prefill`](mod@crate::reference::attention_prefill).

use cudarc::driver::CudaStream;
use fl_kernels_sys::fl_prefill_attention_args;
use std::sync::Arc;

use crate::attention::KvCache;
use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i32, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Head sizes the prefill kernel is instantiated for.
pub const PREFILL_HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];

/// Head sizes the non-causal prefill ([`prefill_bidirectional`]) is instantiated for: the
/// encoders' (MiniLM 32; BERT-base / large, RoBERTa, XLM-R 64; 128).
pub const PREFILL_BIDIRECTIONAL_HEAD_DIMS: [usize; 3] = [32, 64, 128];

/// Knobs of [`prefill`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillParams {
    /// Softmax scale, finite and `> 0`; usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Host-known upper bound on every sequence length in `cu_seqlens` (e.g. the longest
    /// prompt of the batch), in `1..=total_tokens`. It sizes the grid. **Precondition**: no
    /// sequence is longer (the kernel cannot check device data without a sync); rows of a
    /// longer sequence past `max_seq_len` would be left unwritten.
    pub max_seq_len: usize,
    /// Sliding window (Mistral): query `i` attends to keys `i - w + 1 ..= i` only. `None`:
    /// all earlier keys of its sequence.
    pub window: Option<usize>,
}

impl PrefillParams {
    /// `scale = 1/sqrt(head_dim)`, no window.
    pub fn new(head_dim: usize, max_seq_len: usize) -> Self {
        PrefillParams {
            scale: 1.0 / (head_dim as f32).sqrt(),
            max_seq_len,
            window: None,
        }
    }
}

/// FLOPs of one [`prefill`] call as the benches count them: `4 · head_dim · q_heads ·
/// Σ_b L_b (L_b + 1) / 2` (the QKᵀ and PV products over the causal pairs, each multiply-add
/// counted as 2, each causal pair counted once; a window is ignored).
pub fn prefill_flops(seq_lens: &[usize], q_heads: usize, head_dim: usize) -> u64 {
    let pairs: u64 = seq_lens
        .iter()
        .map(|&l| (l as u64) * (l as u64 + 1) / 2)
        .sum();
    4 * head_dim as u64 * q_heads as u64 * pairs
}

/// Causal prefill attention over a packed, padding-free batch (flash attention: on tensor
/// cores for `f16`/`bf16`, on CUDA cores in f32 for `f32`). Encoders (no causal mask):
/// [`prefill_bidirectional`].
///
/// Kernels: on Hopper (sm_90) with `head_dim` 128 in `f16`/`bf16`, a FlashAttention-3-style
/// kernel (TMA copies issued by a producer warpgroup, wgmma, the P·V product of one key tile
/// overlapped with the softmax of the next); everywhere else an mma.sync kernel
/// (FlashAttention-2 style). The Hopper kernel reads
/// K/V in 128-token boxes, which may take rows of the next sequence in the batch: they are
/// masked out, but a NaN or infinity in them would reach this sequence's output (0 · ∞).
///
/// Sequence `b` owns tokens `s = cu_seqlens[b] .. cu_seqlens[b + 1]` of the packed tensors.
/// For its query at position `i` and q head `h`:
///
/// `out[s + i, h] = Σ_j softmax_j(scale · q[s + i, h] · k[s + j, h / g]) · v[s + j, h / g]`
///
/// over `j ≤ i` (causal) and, with a window `w`, `j > i − w`; `g = q_heads / kv_heads`
/// (grouped-query attention; MHA and MQA are `g = 1` and `g = q_heads`), K/V read in place
/// for the whole group. f32 softmax and accumulation; no `[L, L]` score matrix, no
/// workspace. `f16`/`bf16` round the softmax weights to the dtype for `P·V` (as
/// FlashAttention does); `f32` keeps every step in f32 (no TF32), ~1e-6 from an f64
/// reference.
///
/// Shapes: `q`, `out`: `[total_tokens, q_heads, head_dim]`; `k`, `v`: `[total_tokens,
/// kv_heads, head_dim]`; `cu_seqlens`: `[batch + 1]` i32 prefix offsets on the device
/// (`cu[0] = 0`, non-decreasing, `cu[batch] ≤ total_tokens`). `head_dim` in
/// [`PREFILL_HEAD_DIMS`]. Dtypes: `f32`, `f16`, `bf16` (one for all four tensors).
/// Whatever `cu_seqlens` holds, the kernel never reads or writes outside the tensors (ranges
/// are clamped to `total_tokens`); tokens that no sequence covers are not written. See [`PrefillParams::max_seq_len`] for the one
/// precondition on the device data.
///
/// Errors, before any launch: [`Error::Shape`] / [`Error::InvalidArgument`] naming the
/// argument (`q` for a bad rank or head_dim, `k` for a rank, token count, head_dim or
/// q_heads that is not a multiple of kv_heads, `v`, `out`, `cu_seqlens`,
/// `params.max_seq_len` when 0 or above total_tokens, `params.scale`, `params.window`).
///
/// ```no_run
/// use fl_kernels::{attention_prefill::{self, PrefillParams}, DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (hq, hkv, d) = (32, 8, 128);
/// let lens = [300usize, 7, 1000];
/// let total: usize = lens.iter().sum();
/// let cu: Vec<i32> = std::iter::once(0)
///     .chain(lens.iter().scan(0, |acc, &l| { *acc += l as i32; Some(*acc) }))
///     .collect();
/// let q = DeviceTensor::<f16>::zeros(s, &[total, hq, d])?;
/// let k = DeviceTensor::<f16>::zeros(s, &[total, hkv, d])?;
/// let v = DeviceTensor::<f16>::zeros(s, &[total, hkv, d])?;
/// let cu_seqlens = DeviceTensor::from_host(s, &cu, &[lens.len() + 1])?;
/// let mut out = DeviceTensor::<f16>::zeros(s, &[total, hq, d])?;
/// let params = PrefillParams::new(d, 1000);
/// attention_prefill::prefill(s, &q, &k, &v, &cu_seqlens, &mut out, &params)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn prefill<T: FloatDType>(
    stream: &Arc<CudaStream>,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    cu_seqlens: &DeviceTensor<i32>,
    out: &mut DeviceTensor<T>,
    params: &PrefillParams,
) -> Result<()> {
    prefill_with_kernel(
        stream,
        q,
        k,
        v,
        cu_seqlens,
        out,
        params,
        PrefillKernel::Auto,
    )
}

/// Which kernel [`prefill_with_kernel`] runs (for tests: both give the same result up to f32
/// summation order). [`PrefillKernel::Auto`] is what [`prefill`] does: the wgmma + TMA kernel
/// on Hopper at `head_dim` 128 in `f16`/`bf16`, the mma.sync kernel everywhere else.
/// [`PrefillKernel::MmaSync`] takes the mma.sync kernel for every call, which is what runs
/// before Hopper, so tests reach it at `head_dim` 128 on a Hopper GPU too.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// The automatic choice.
    Auto,
    /// The mma.sync kernel (f32: its CUDA-core version) for every call.
    MmaSync,
}

impl PrefillKernel {
    /// Both kernels, for tests that cover each.
    pub const ALL: [PrefillKernel; 2] = [PrefillKernel::Auto, PrefillKernel::MmaSync];

    fn to_ffi(self) -> i32 {
        (match self {
            PrefillKernel::Auto => fl_kernels_sys::FL_PREFILL_KERNEL_AUTO,
            PrefillKernel::MmaSync => fl_kernels_sys::FL_PREFILL_KERNEL_MMA_SYNC,
        }) as i32
    }
}

/// [`prefill`] with the kernel forced. For tests.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn prefill_with_kernel<T: FloatDType>(
    stream: &Arc<CudaStream>,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    cu_seqlens: &DeviceTensor<i32>,
    out: &mut DeviceTensor<T>,
    params: &PrefillParams,
    kernel: PrefillKernel,
) -> Result<()> {
    let mode = Mode::Causal {
        window: params.window,
    };
    let (scale, max_seq_len) = (params.scale, params.max_seq_len);
    launch_packed(
        stream,
        [q, k, v],
        cu_seqlens,
        out,
        (scale, max_seq_len),
        mode,
        kernel,
    )
}

/// The mask of a packed prefill launch.
#[derive(Clone, Copy)]
enum Mode {
    /// Keys `j ≤ i` (and `j > i − w` with a window `w`).
    Causal { window: Option<usize> },
    /// Every key of the sequence.
    Bidirectional,
}

/// Checks and launches one packed prefill ([`prefill`] or [`prefill_bidirectional`]).
fn launch_packed<T: FloatDType>(
    stream: &Arc<CudaStream>,
    [q, k, v]: [&DeviceTensor<T>; 3],
    cu_seqlens: &DeviceTensor<i32>,
    out: &mut DeviceTensor<T>,
    (scale, max_seq_len): (f32, usize),
    mode: Mode,
    kernel: PrefillKernel,
) -> Result<()> {
    let head_dims: &[usize] = match mode {
        Mode::Causal { .. } => &PREFILL_HEAD_DIMS,
        Mode::Bidirectional => &PREFILL_BIDIRECTIONAL_HEAD_DIMS,
    };
    let qs = q.shape();
    if qs.len() != 3 {
        return Err(Error::Shape {
            arg: "q",
            expected: "[total_tokens, q_heads, head_dim]".into(),
            got: qs.to_vec(),
        });
    }
    let (total, q_heads, head_dim) = (qs[0], qs[1], qs[2]);
    if !head_dims.contains(&head_dim) {
        return Err(Error::invalid(
            "q",
            format!("head_dim {head_dim} is not one of {head_dims:?}"),
        ));
    }
    let ks = k.shape();
    if ks.len() != 3 || ks[0] != total || ks[2] != head_dim {
        return Err(Error::Shape {
            arg: "k",
            expected: format!("[{total}, kv_heads, {head_dim}]"),
            got: ks.to_vec(),
        });
    }
    let kv_heads = ks[1];
    if kv_heads == 0 || q_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::invalid(
            "k",
            format!("q_heads {q_heads} is not a positive multiple of kv_heads {kv_heads}"),
        ));
    }
    expect_shape("v", v, ks)?;
    expect_shape("out", out, qs)?;
    let cs = cu_seqlens.shape();
    if cs.len() != 1 || cs[0] < 2 {
        return Err(Error::Shape {
            arg: "cu_seqlens",
            expected: "[batch + 1] with batch >= 1".into(),
            got: cs.to_vec(),
        });
    }
    let batch = cs[0] - 1;
    if batch > 65535 {
        return Err(Error::TooLarge {
            arg: "cu_seqlens",
            value: batch,
            limit: 65535,
        });
    }
    if max_seq_len == 0 || max_seq_len > total {
        return Err(Error::invalid(
            "params.max_seq_len",
            format!("{max_seq_len} is not in 1..={total} (total_tokens)"),
        ));
    }
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::invalid(
            "params.scale",
            format!("{scale} is not finite and positive"),
        ));
    }
    let window = match mode {
        Mode::Causal { window: Some(0) } => {
            return Err(Error::invalid(
                "params.window",
                "must be at least 1 (or None)",
            ));
        }
        Mode::Causal { window } => window.unwrap_or(0),
        Mode::Bidirectional => 0,
    };
    let mut args = fl_prefill_attention_args {
        dtype: T::ID,
        batch: batch as i32,
        q_heads: as_i32("q", q_heads)?,
        kv_heads: as_i32("k", kv_heads)?,
        head_dim: head_dim as i32,
        total_tokens: as_i32("q", total)?,
        q: std::ptr::null(),
        k: std::ptr::null(),
        v: std::ptr::null(),
        out: std::ptr::null_mut(),
        cu_seqlens: std::ptr::null(),
        max_seq_len: as_i32("params.max_seq_len", max_seq_len)?,
        scale,
        window: as_i32("params.window", window)?,
    };
    let (pq, _g1) = q.ptr(stream);
    let (pk, _g2) = k.ptr(stream);
    let (pv, _g3) = v.ptr(stream);
    let (pc, _g4) = cu_seqlens.ptr(stream);
    let (po, _g5) = out.ptr_mut(stream);
    args.q = pq as _;
    args.k = pk as _;
    args.v = pv as _;
    args.cu_seqlens = pc as _;
    args.out = po as _;
    // SAFETY: every pointer refers to a live buffer whose shape was checked against the
    // args above; the guards keep them alive until the launch has been queued.
    let status = unsafe {
        match mode {
            Mode::Causal { .. } => fl_kernels_sys::fl_attention_prefill_kernel(
                &args,
                kernel.to_ffi(),
                raw_stream(stream),
            ),
            Mode::Bidirectional => fl_kernels_sys::fl_attention_prefill_bidirectional_kernel(
                &args,
                kernel.to_ffi(),
                raw_stream(stream),
            ),
        }
    };
    match mode {
        Mode::Causal { .. } => check("attention_prefill::prefill", status),
        Mode::Bidirectional => check("attention_prefill::prefill_bidirectional", status),
    }
}

/// Knobs of [`prefill_bidirectional`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BidirectionalPrefillParams {
    /// Softmax scale, finite and `> 0`; usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Host-known upper bound on every sequence length in `cu_seqlens`, in
    /// `1..=total_tokens`; it sizes the grid. **Precondition** as
    /// [`PrefillParams::max_seq_len`]: no sequence is longer (its rows past `max_seq_len`
    /// would be left unwritten).
    pub max_seq_len: usize,
}

impl BidirectionalPrefillParams {
    /// `scale = 1/sqrt(head_dim)`.
    pub fn new(head_dim: usize, max_seq_len: usize) -> Self {
        BidirectionalPrefillParams {
            scale: 1.0 / (head_dim as f32).sqrt(),
            max_seq_len,
        }
    }
}

/// FLOPs of one [`prefill_bidirectional`] call as the benches count them: `4 · head_dim ·
/// q_heads · Σ_b L_b²` (the QKᵀ and PV products over every (query, key) pair of each
/// sequence, each multiply-add counted as 2).
pub fn prefill_bidirectional_flops(seq_lens: &[usize], q_heads: usize, head_dim: usize) -> u64 {
    let pairs: u64 = seq_lens.iter().map(|&l| (l as u64) * (l as u64)).sum();
    4 * head_dim as u64 * q_heads as u64 * pairs
}

/// Non-causal (bidirectional) prefill attention over a packed, padding-free batch: the
/// encoder attention of BERT, RoBERTa and their embedding / reranker models, with the
/// padding removed (FasterTransformer's Effective Transformer: `cu_seqlens` in, no padded
/// token computed). [`prefill`]'s kernels and numerics, with every query attending to every
/// key of its own sequence.
///
/// Sequence `b` owns tokens `s = cu_seqlens[b] .. cu_seqlens[b + 1]` (length `L_b`) of the
/// packed tensors. For its query at position `i` and q head `h`:
///
/// `out[s + i, h] = Σ_j softmax_j(scale · q[s + i, h] · k[s + j, h / g]) · v[s + j, h / g]`
///
/// over all `j` in `0..L_b`; `g = q_heads / kv_heads` (GQA; MHA `g = 1`). No window. f32
/// softmax and accumulation; `f16`/`bf16` on tensor cores with the softmax weights rounded to
/// the dtype for `P·V`, `f32` on CUDA cores in f32. Kernels as [`prefill`]: on Hopper at
/// `head_dim` 128 in `f16`/`bf16` the wgmma + TMA kernel (which reads K/V in 128-token boxes
/// that may take rows of the next sequence: masked out, but a NaN or infinity there would
/// reach this sequence's output), else the mma.sync kernel.
///
/// Shapes and dtypes as [`prefill`]: `q`, `out`: `[total_tokens, q_heads, head_dim]`; `k`,
/// `v`: `[total_tokens, kv_heads, head_dim]`; `cu_seqlens`: `[batch + 1]` i32 prefix offsets on
/// the device; `head_dim` in [`PREFILL_BIDIRECTIONAL_HEAD_DIMS`]; `f32`, `f16` or `bf16`.
/// Whatever `cu_seqlens` holds, nothing outside the tensors is read or written; tokens no
/// sequence covers are not written.
///
/// Errors, before any launch: as [`prefill`] (`q` also for a head_dim outside
/// [`PREFILL_BIDIRECTIONAL_HEAD_DIMS`], `params.max_seq_len`, `params.scale`).
///
/// ```no_run
/// use fl_kernels::attention_prefill::{self, BidirectionalPrefillParams};
/// use fl_kernels::{DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// // BERT-base: 12 heads of 64; three sentences of 128, 37 and 5 tokens, no padding.
/// let (h, d) = (12, 64);
/// let lens = [128usize, 37, 5];
/// let total: usize = lens.iter().sum();
/// let cu: Vec<i32> = std::iter::once(0)
///     .chain(lens.iter().scan(0, |acc, &l| { *acc += l as i32; Some(*acc) }))
///     .collect();
/// let q = DeviceTensor::<f16>::zeros(s, &[total, h, d])?;
/// let k = DeviceTensor::<f16>::zeros(s, &[total, h, d])?;
/// let v = DeviceTensor::<f16>::zeros(s, &[total, h, d])?;
/// let cu_seqlens = DeviceTensor::from_host(s, &cu, &[lens.len() + 1])?;
/// let mut out = DeviceTensor::<f16>::zeros(s, &[total, h, d])?;
/// let params = BidirectionalPrefillParams::new(d, 128);
/// attention_prefill::prefill_bidirectional(s, &q, &k, &v, &cu_seqlens, &mut out, &params)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn prefill_bidirectional<T: FloatDType>(
    stream: &Arc<CudaStream>,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    cu_seqlens: &DeviceTensor<i32>,
    out: &mut DeviceTensor<T>,
    params: &BidirectionalPrefillParams,
) -> Result<()> {
    prefill_bidirectional_with_kernel(
        stream,
        q,
        k,
        v,
        cu_seqlens,
        out,
        params,
        PrefillKernel::Auto,
    )
}

/// [`prefill_bidirectional`] with the kernel forced. For tests.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn prefill_bidirectional_with_kernel<T: FloatDType>(
    stream: &Arc<CudaStream>,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    cu_seqlens: &DeviceTensor<i32>,
    out: &mut DeviceTensor<T>,
    params: &BidirectionalPrefillParams,
    kernel: PrefillKernel,
) -> Result<()> {
    launch_packed(
        stream,
        [q, k, v],
        cu_seqlens,
        out,
        (params.scale, params.max_seq_len),
        Mode::Bidirectional,
        kernel,
    )
}

/// Knobs of [`prefill_paged`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PagedPrefillParams {
    /// Softmax scale, finite and `> 0`; usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Host-known upper bound on every sequence's number of new tokens (`cu_seqlens_q[b + 1]
    /// − cu_seqlens_q[b]`), in `0..=total_q` (0: nothing to do). It sizes the grid.
    /// **Precondition**: no sequence has more (its later rows would be left unwritten).
    pub max_q_len: usize,
    /// Sliding window (Mistral): the token at position `p` attends to positions
    /// `p − w + 1 ..= p` only. `None`: all earlier positions.
    pub window: Option<usize>,
}

impl PagedPrefillParams {
    /// `scale = 1/sqrt(head_dim)`, no window.
    pub fn new(head_dim: usize, max_q_len: usize) -> Self {
        PagedPrefillParams {
            scale: 1.0 / (head_dim as f32).sqrt(),
            max_q_len,
            window: None,
        }
    }
}

/// FLOPs of one [`prefill_paged`] call as the benches count them: `4 · head_dim · q_heads ·
/// Σ_b Σ_i (p_{b,i} + 1)` over the new tokens `i` of sequence `b` at positions
/// `p_{b,i} = ctx_b − q_b + i` (each token's causal keys counted once; a window is ignored).
/// `q_lens[b] ≤ ctx_lens[b]`.
pub fn prefill_paged_flops(
    q_lens: &[usize],
    ctx_lens: &[usize],
    q_heads: usize,
    head_dim: usize,
) -> u64 {
    let pairs: u64 = q_lens
        .iter()
        .zip(ctx_lens)
        .map(|(&q, &c)| {
            let (q, c) = (q as u64, c as u64);
            // Σ_{p = c−q}^{c−1} (p + 1) = q·c − q(q − 1)/2
            q * c - q * q.saturating_sub(1) / 2
        })
        .sum();
    4 * head_dim as u64 * q_heads as u64 * pairs
}

/// Causal prefill attention of new query tokens over a KV cache that already holds them
/// (chunked prefill, prefix-cache hits, and decode tokens in the same launch): the
/// mma.sync flash-attention kernel of [`prefill`] with its K/V tiles gathered through the
/// block table (FlashInfer's `BatchPrefillWithPagedKVCache`).
///
/// Sequence `b` has `q_b = cu_seqlens_q[b + 1] − cu_seqlens_q[b]` new tokens, rows
/// `s = cu_seqlens_q[b] ..` of the packed `q` / `out`, at positions `ctx_b − q_b ..
/// ctx_b − 1` with `ctx_b = ctx_lens[b]`; the cache holds the K/V of all `ctx_b` positions,
/// the new tokens' included (append them first with
/// [`kv_cache::append_paged`](crate::kv_cache::append_paged)). For new token `i` (position
/// `p = ctx_b − q_b + i`) and q head `h`:
///
/// `out[s + i, h] = Σ_j softmax_j(scale · q[s + i, h] · K[b, h / g, j]) · V[b, h / g, j]`
///
/// over the cached positions `j ≤ p` and, with a window `w`, `j > p − w`; `g = q_heads /
/// kv_heads` (GQA; MHA and MQA are `g = 1` and `g = q_heads`). `K[b, ·, j]` is read as
/// [`attention::decode`](crate::attention::decode) reads the same [`KvCache`]: paged, slot
/// `j % block_size` of block `block_table[b][j / block_size]` (any `block_size ≥ 1`);
/// contiguous, position `j` of cache row `b`. `q_b = 1` is a decode token; `q_b = 0` writes
/// nothing. Numerics as [`prefill`]'s mma.sync kernel: f32 softmax and accumulation,
/// `f16`/`bf16` on tensor cores with `P` rounded to the dtype, `f32` on CUDA cores in f32.
///
/// Shapes: `q`, `out`: `[total_q, q_heads, head_dim]`; `cu_seqlens_q`: `[batch + 1]` i32
/// prefix offsets on the device (non-decreasing; clamped to `total_q`); `ctx_lens`:
/// `[batch]` i32 on the device, each `≥ q_b` (a smaller one gives zeros for the rows before
/// position 0) and clamped to the cache capacity (`block_size · max_blocks_per_seq`, or
/// `max_seq`); cache per [`KvCache`] (`Contiguous`: `[batch' ≥ batch, kv_heads, max_seq,
/// head_dim]`; `Paged`: `[num_blocks, kv_heads, block_size, head_dim]` and a block table
/// `[batch, max_blocks_per_seq]`). `head_dim` in [`PREFILL_HEAD_DIMS`]. Dtypes: `f32`,
/// `f16`, `bf16`, one for `q`, the cache and `out`. A block id outside `0..num_blocks` is
/// never read (its keys read as zero vectors); table entries past `ceil(ctx_b /
/// block_size)` are never read. Rows of `out` no sequence covers are not written.
///
/// Errors, before any launch: [`Error::Shape`] / [`Error::InvalidArgument`] naming the
/// argument (`q` for a bad rank or head_dim or q_heads not a multiple of kv_heads,
/// `cache.k`, `cache.v`, `cache.block_table` (shape, or a capacity above `i32::MAX`),
/// `cu_seqlens_q`, `ctx_lens`, `out`, `params.max_q_len` above total_q, `params.scale`,
/// `params.window`).
///
/// ```no_run
/// use fl_kernels::attention::KvCache;
/// use fl_kernels::attention_prefill::{self, PagedPrefillParams};
/// use fl_kernels::{DeviceTensor, Gpu, f16};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (hq, hkv, d, block) = (32, 8, 128, 16);
/// // Sequence 0: a 512-token chunk after 1,000 cached tokens; sequence 1: one decode token.
/// let (q_lens, ctx) = ([512usize, 1], [1512i32, 301]);
/// let (total, max_blocks, num_blocks) = (513, 128, 256);
/// let q = DeviceTensor::<f16>::zeros(s, &[total, hq, d])?;
/// let k = DeviceTensor::<f16>::zeros(s, &[num_blocks, hkv, block, d])?;
/// let v = DeviceTensor::<f16>::zeros(s, &[num_blocks, hkv, block, d])?;
/// let table: Vec<i32> = (0..2 * max_blocks as i32).collect();
/// let block_table = DeviceTensor::from_host(s, &table, &[2, max_blocks])?;
/// let cu = DeviceTensor::from_host(s, &[0i32, 512, 513], &[3])?;
/// let ctx_lens = DeviceTensor::from_host(s, &ctx, &[2])?;
/// let mut out = DeviceTensor::<f16>::zeros(s, &[total, hq, d])?;
/// let cache = KvCache::Paged { k: &k, v: &v, block_table: &block_table };
/// let params = PagedPrefillParams::new(d, q_lens[0]);
/// attention_prefill::prefill_paged(s, &q, &cache, &cu, &ctx_lens, &mut out, &params)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn prefill_paged<T: FloatDType>(
    stream: &Arc<CudaStream>,
    q: &DeviceTensor<T>,
    cache: &KvCache<'_, T>,
    cu_seqlens_q: &DeviceTensor<i32>,
    ctx_lens: &DeviceTensor<i32>,
    out: &mut DeviceTensor<T>,
    params: &PagedPrefillParams,
) -> Result<()> {
    let qs = q.shape();
    if qs.len() != 3 {
        return Err(Error::Shape {
            arg: "q",
            expected: "[total_q, q_heads, head_dim]".into(),
            got: qs.to_vec(),
        });
    }
    let (total, q_heads, head_dim) = (qs[0], qs[1], qs[2]);
    if !PREFILL_HEAD_DIMS.contains(&head_dim) {
        return Err(Error::invalid(
            "q",
            format!("head_dim {head_dim} is not one of {PREFILL_HEAD_DIMS:?}"),
        ));
    }
    expect_shape("out", out, qs)?;
    let cs = cu_seqlens_q.shape();
    if cs.len() != 1 || cs[0] < 2 {
        return Err(Error::Shape {
            arg: "cu_seqlens_q",
            expected: "[batch + 1] with batch >= 1".into(),
            got: cs.to_vec(),
        });
    }
    let batch = cs[0] - 1;
    if batch > 65535 {
        return Err(Error::TooLarge {
            arg: "cu_seqlens_q",
            value: batch,
            limit: 65535,
        });
    }
    expect_shape("ctx_lens", ctx_lens, &[batch])?;
    let (k, v, table) = match *cache {
        KvCache::Contiguous { k, v } => (k, v, None),
        KvCache::Paged { k, v, block_table } => (k, v, Some(block_table)),
    };
    let ks = k.shape();
    let contiguous_ok = table.is_some() || ks.first().is_some_and(|&b| b >= batch);
    if ks.len() != 4 || ks[3] != head_dim || ks[0] == 0 || ks[2] == 0 || !contiguous_ok {
        return Err(Error::Shape {
            arg: "cache.k",
            expected: if table.is_some() {
                format!("[num_blocks, kv_heads, block_size, {head_dim}]")
            } else {
                format!("[batch >= {batch}, kv_heads, max_seq, {head_dim}]")
            },
            got: ks.to_vec(),
        });
    }
    expect_shape("cache.v", v, ks)?;
    let (num_blocks, kv_heads, block) = (ks[0], ks[1], ks[2]);
    if kv_heads == 0 || q_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::invalid(
            "q",
            format!("q_heads {q_heads} is not a positive multiple of kv_heads {kv_heads}"),
        ));
    }
    let max_blocks = match table {
        Some(t) => {
            let bt = t.shape();
            if bt.len() != 2 || bt[0] != batch || bt[1] == 0 {
                return Err(Error::Shape {
                    arg: "cache.block_table",
                    expected: format!("[{batch}, max_blocks_per_seq >= 1]"),
                    got: bt.to_vec(),
                });
            }
            if block.saturating_mul(bt[1]) > i32::MAX as usize {
                return Err(Error::TooLarge {
                    arg: "cache.block_table",
                    value: block.saturating_mul(bt[1]),
                    limit: i32::MAX as usize,
                });
            }
            bt[1]
        }
        None => 1,
    };
    if params.max_q_len > total {
        return Err(Error::invalid(
            "params.max_q_len",
            format!("{} is above total_q {total}", params.max_q_len),
        ));
    }
    if !(params.scale.is_finite() && params.scale > 0.0) {
        return Err(Error::invalid(
            "params.scale",
            format!("{} is not finite and positive", params.scale),
        ));
    }
    if params.window == Some(0) {
        return Err(Error::invalid(
            "params.window",
            "must be at least 1 (or None)",
        ));
    }
    let mut args = fl_kernels_sys::fl_prefill_paged_attention_args {
        dtype: T::ID,
        batch: batch as i32,
        q_heads: as_i32("q", q_heads)?,
        kv_heads: as_i32("cache.k", kv_heads)?,
        head_dim: head_dim as i32,
        total_q: as_i32("q", total)?,
        q: std::ptr::null(),
        k: std::ptr::null(),
        v: std::ptr::null(),
        out: std::ptr::null_mut(),
        cu_seqlens_q: std::ptr::null(),
        ctx_lens: std::ptr::null(),
        max_q_len: as_i32("params.max_q_len", params.max_q_len)?,
        layout: if table.is_some() {
            fl_kernels_sys::fl_kv_layout::FL_KV_PAGED
        } else {
            fl_kernels_sys::fl_kv_layout::FL_KV_CONTIGUOUS
        },
        kv_block_size: as_i32("cache.k", block)?,
        block_table: std::ptr::null(),
        max_blocks_per_seq: as_i32("cache.block_table", max_blocks)?,
        num_blocks: as_i32("cache.k", num_blocks)?,
        scale: params.scale,
        window: as_i32("params.window", params.window.unwrap_or(0))?,
    };
    let (pq, _g1) = q.ptr(stream);
    let (pk, _g2) = k.ptr(stream);
    let (pv, _g3) = v.ptr(stream);
    let (pc, _g4) = cu_seqlens_q.ptr(stream);
    let (pl, _g5) = ctx_lens.ptr(stream);
    let table_ptr = table.map(|t| t.ptr(stream));
    let (po, _g6) = out.ptr_mut(stream);
    args.q = pq as _;
    args.k = pk as _;
    args.v = pv as _;
    args.cu_seqlens_q = pc as _;
    args.ctx_lens = pl as _;
    args.block_table = table_ptr
        .as_ref()
        .map_or(std::ptr::null(), |(p, _)| *p as _);
    args.out = po as _;
    // SAFETY: every pointer refers to a live buffer whose shape was checked against the
    // args above; the guards keep them alive until the launch has been queued.
    let status = unsafe { fl_kernels_sys::fl_attention_prefill_paged(&args, raw_stream(stream)) };
    check("attention_prefill::prefill_paged", status)
}
