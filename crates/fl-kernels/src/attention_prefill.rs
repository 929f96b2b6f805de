//! Causal prefill attention over packed, padding-free sequences: [`prefill`].
//!
//! CPU reference: [`crate::reference::attention_prefill`](mod@crate::reference::attention_prefill).

use cudarc::driver::CudaStream;
use fl_kernels_sys::fl_prefill_attention_args;
use std::sync::Arc;

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i32, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Head sizes the prefill kernel is instantiated for.
pub const PREFILL_HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];

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
/// cores for `f16`/`bf16`, on CUDA cores in f32 for `f32`).
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
    let qs = q.shape();
    if qs.len() != 3 {
        return Err(Error::Shape {
            arg: "q",
            expected: "[total_tokens, q_heads, head_dim]".into(),
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
    if params.max_seq_len == 0 || params.max_seq_len > total {
        return Err(Error::invalid(
            "params.max_seq_len",
            format!(
                "{} is not in 1..={total} (total_tokens)",
                params.max_seq_len
            ),
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
        max_seq_len: as_i32("params.max_seq_len", params.max_seq_len)?,
        scale: params.scale,
        window: as_i32("params.window", params.window.unwrap_or(0))?,
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
        fl_kernels_sys::fl_attention_prefill_kernel(&args, kernel.to_ffi(), raw_stream(stream))
    };
    check("attention_prefill::prefill", status)
}
