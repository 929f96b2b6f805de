//! Dense (f16 / bf16) GEMV / small GEMM for decode, with fused epilogues: [`linear`]
//! (`y = x · Wᵀ (+ bias)`), [`linear_swiglu`] (`out = silu(x · W_gateᵀ) ⊙ (x · W_upᵀ)`, the
//! gate/up half of a LLaMA MLP in one pass over the stacked weight) and [`linear_add`]
//! (`residual += x · Wᵀ`, in place). [`rms_norm_linear`] and [`rms_norm_linear_swiglu`]
//! also fuse the RMSNorm of their input in front (`x = rms_norm(h)` is computed as `h` is
//! loaded and never written), which saves a kernel per projection in a decode step.
//! [`linear_rope_append`] is the QKV projection of a decode step with the rotary embedding
//! (interleaved pairs, which a lane holds side by side) and the KV-cache append in its
//! epilogue, optionally after the fused RMSNorm: the whole attention input in one kernel.
//!
//! For `m` = 1..=[`MAX_M`] tokens (decode); above that a GEMM (cuBLASLt) is the right tool.
//! `W [n, k]` is row-major (output-major, like `nn.Linear.weight`); `x`, `W`, bias and the
//! output share one dtype, f16 or bf16. Products are accumulated in f32 (on the tensor
//! cores) and every output is rounded once to `T` after its epilogue. Memory-bound: one pass
//! over the weight bytes, shared by all `m` tokens.
//!
//! `k` must be a positive multiple of 8 (16-byte rows: the kernel has no scalar path); any
//! `n` works. CPU references: [`crate::reference::gemv_dense`](mod@crate::reference::gemv_dense).
//!
//! ```no_run
//! use fl_kernels::{f16, gemv_dense, DeviceTensor, Gpu};
//! let gpu = Gpu::new(0)?;
//! let s = gpu.stream();
//! let (n, k) = (4096, 4096);
//! let w = DeviceTensor::from_host(s, &vec![f16::from_f32(0.01); n * k], &[n, k])?;
//! let x = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
//! let mut y = DeviceTensor::<f16>::zeros(s, &[1, n])?;
//! gemv_dense::linear(s, &x, &w, None, &mut y)?;
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use cudarc::driver::CudaStream;
use fl_kernels_sys::fl_gemv_dense_epilogue as Epi;

use crate::dtype::HalfDType;
use crate::error::check;
use crate::kv_cache::{CacheLayout, KvCache, QkvSplit, TokenSlots};
use crate::rope::{RopeParams, RopeStyle};
use crate::tensor::{as_i32, as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// The largest number of tokens (`m`, rows of `x`) one call takes.
pub const MAX_M: usize = fl_kernels_sys::FL_GEMV_DENSE_MAX_M as usize;

/// The multiple `k` (the row length of `x` and `W`) must be of.
pub const K_MULTIPLE: usize = 8;

/// Checks `x` (`[m, k]`, `m <= MAX_M`, `k` a positive multiple of 8) and returns `(m, k)`.
fn check_x<T: HalfDType>(x: &DeviceTensor<T>) -> Result<(usize, usize)> {
    if x.shape().len() != 2 {
        return Err(Error::Shape {
            arg: "x",
            expected: "[m, k]".into(),
            got: x.shape().to_vec(),
        });
    }
    let (m, k) = (x.shape()[0], x.shape()[1]);
    if m > MAX_M {
        return Err(Error::TooLarge {
            arg: "x",
            value: m,
            limit: MAX_M,
        });
    }
    if k == 0 || k % K_MULTIPLE != 0 {
        return Err(Error::invalid(
            "x",
            format!("k = {k} must be a positive multiple of {K_MULTIPLE} (16-byte rows)"),
        ));
    }
    Ok((m, k))
}

/// Checks a weight `[rows, k]` (rows a multiple of `row_multiple`) and returns `rows`.
fn check_w<T: HalfDType>(
    arg: &'static str,
    w: &DeviceTensor<T>,
    k: usize,
    row_multiple: usize,
) -> Result<usize> {
    let s = w.shape();
    if s.len() != 2 || s[1] != k || s[0] % row_multiple != 0 {
        let expected = if row_multiple == 2 {
            format!("[2 * I, {k}] (k of x; gate rows then up rows)")
        } else {
            format!("[n, {k}] (k of x)")
        };
        return Err(Error::Shape {
            arg,
            expected,
            got: s.to_vec(),
        });
    }
    Ok(s[0])
}

/// The RMSNorm fused in front of [`rms_norm_linear`] / [`rms_norm_linear_swiglu`]:
/// `x[t, j] = h[t, j] · rstd[t] · weight[j]` with `rstd[t] = 1 / sqrt(mean_j h[t, j]² + eps)`,
/// the same f32 formula and single rounding to `T` as [`crate::norm::rms_norm`].
#[derive(Debug, Clone, Copy)]
pub struct RmsNorm<'a, T: HalfDType> {
    /// `gamma [k]`.
    pub weight: &'a DeviceTensor<T>,
    /// Added to the mean square; positive and finite.
    pub eps: f32,
}

/// Launches one epilogue; shapes already checked (`y` is `[m, n]`).
#[allow(clippy::too_many_arguments)]
fn launch<T: HalfDType>(
    stream: &CudaStream,
    op: &'static str,
    epi: Epi,
    x: &DeviceTensor<T>,
    norm: Option<RmsNorm<'_, T>>,
    w: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    y: &mut DeviceTensor<T>,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    if let Some(nm) = &norm {
        expect_shape("norm.weight", nm.weight, &[k])?;
        crate::tensor::check_eps(nm.eps)?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (mi, ni, ki) = (as_i64("x", m)?, as_i64("w", n)?, as_i64("x", k)?);
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = w.ptr(stream);
    let (pb, _gb) = crate::tensor::opt_ptr(bias, stream);
    let (pg, _gg) = crate::tensor::opt_ptr(norm.map(|nm| nm.weight), stream);
    let (py, _gy) = y.ptr_mut(stream);
    // SAFETY: x holds m·k, w n·k (2n·k for SwiGLU), bias n, gamma k and y m·n elements of T
    // (shapes checked by the caller and above); every buffer lives until its guard drops,
    // after the launch is queued on `stream`. y is borrowed mutably, so it is a distinct
    // allocation from x, w, bias and gamma (no overlap).
    let status = unsafe {
        match &norm {
            None => fl_kernels_sys::fl_gemv_dense(
                T::ID,
                epi,
                px as _,
                pw as _,
                pb as _,
                py as _,
                mi,
                ni,
                ki,
                raw_stream(stream),
            ),
            Some(nm) => fl_kernels_sys::fl_gemv_dense_rms_norm(
                T::ID,
                epi,
                px as _,
                pg as _,
                nm.eps,
                pw as _,
                pb as _,
                py as _,
                mi,
                ni,
                ki,
                raw_stream(stream),
            ),
        }
    };
    check(op, status)
}

/// `y[t, r] = Σ_j x[t, j] · w[r, j] (+ bias[r])`: the linear layer `y = x · wᵀ (+ b)`.
///
/// Shapes: `x [m, k]` with `m` in 0..=[`MAX_M`] (`m = 0` does nothing) and `k` a positive
/// multiple of [`K_MULTIPLE`]; `w [n, k]`; `bias [n]`; `y [m, n]`. Dtypes: all f16 or all
/// bf16. f32 accumulation; the bias is added in f32 and `y` rounded once.
///
/// Errors: [`Error::TooLarge`] naming `x` when `m > MAX_M`; [`Error::InvalidArgument`]
/// naming `x` when `k` is 0 or not a multiple of 8; [`Error::Shape`] naming `x` (not 2-D),
/// `w` (not `[n, k]`), `bias` (not `[n]`) or `y` (not `[m, n]`).
///
/// ```no_run
/// use fl_kernels::{bf16, gemv_dense, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (m, n, k) = (4, 4096, 4096);
/// let w = DeviceTensor::from_host(s, &vec![bf16::from_f32(0.01); n * k], &[n, k])?;
/// let b = DeviceTensor::from_host(s, &vec![bf16::from_f32(1.0); n], &[n])?;
/// let x = DeviceTensor::from_host(s, &vec![bf16::from_f32(0.5); m * k], &[m, k])?;
/// let mut y = DeviceTensor::<bf16>::zeros(s, &[m, n])?;
/// gemv_dense::linear(s, &x, &w, Some(&b), &mut y)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn linear<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    w: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    y: &mut DeviceTensor<T>,
) -> Result<()> {
    let (m, k) = check_x(x)?;
    let n = check_w("w", w, k, 1)?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[n])?;
    }
    expect_shape("y", y, &[m, n])?;
    launch(
        stream,
        "gemv_dense::linear",
        Epi::FL_GEMV_DENSE_LINEAR,
        x,
        None,
        w,
        bias,
        y,
        (m, n, k),
    )
}

/// `out[t, r] = silu(Σ_j x[t, j] · w[r, j]) · Σ_j x[t, j] · w[I + r, j]`: the gate and up
/// projections of a LLaMA MLP and its SiLU-gated product, in one pass over the weight.
///
/// `w_gate_up [2I, k]` stacks the gate weight (rows `0..I`) over the up weight (rows
/// `I..2I`), as the engine stores them; gate row `r` and up row `r` are reduced together, so
/// the `[m, 2I]` product is never written. `silu(g) = g / (1 + e^(−g))`, all in f32, `out`
/// rounded once.
///
/// Shapes: `x [m, k]` (`m` in 0..=[`MAX_M`], `k` a positive multiple of [`K_MULTIPLE`]),
/// `w_gate_up [2I, k]`, `out [m, I]`. Dtypes: all f16 or all bf16.
///
/// Errors: as [`linear`] for `x`; [`Error::Shape`] naming `w_gate_up` (not 2-D, an odd
/// number of rows, or `k` differs) or `out` (not `[m, I]`).
///
/// ```no_run
/// use fl_kernels::{f16, gemv_dense, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (i, k) = (11008, 4096);
/// let w = DeviceTensor::from_host(s, &vec![f16::from_f32(0.01); 2 * i * k], &[2 * i, k])?;
/// let x = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
/// let mut act = DeviceTensor::<f16>::zeros(s, &[1, i])?;
/// gemv_dense::linear_swiglu(s, &x, &w, &mut act)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn linear_swiglu<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    w_gate_up: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (m, k) = check_x(x)?;
    let i = check_w("w_gate_up", w_gate_up, k, 2)? / 2;
    expect_shape("out", out, &[m, i])?;
    launch(
        stream,
        "gemv_dense::linear_swiglu",
        Epi::FL_GEMV_DENSE_SWIGLU,
        x,
        None,
        w_gate_up,
        None,
        out,
        (m, i, k),
    )
}

/// `residual[t, r] += Σ_j x[t, j] · w[r, j]` in place: an output projection fused with the
/// residual add. Each element is read once, `f32(residual) + acc` computed in f32 and
/// rounded once to `T`.
///
/// Shapes: `x [m, k]` (`m` in 0..=[`MAX_M`], `k` a positive multiple of [`K_MULTIPLE`]),
/// `w [n, k]`, `residual [m, n]`. Dtypes: all f16 or all bf16.
///
/// Errors: as [`linear`] for `x` and `w`; [`Error::Shape`] naming `residual` (not `[m, n]`).
///
/// ```no_run
/// use fl_kernels::{f16, gemv_dense, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (n, k) = (4096, 11008);
/// let w = DeviceTensor::from_host(s, &vec![f16::from_f32(0.01); n * k], &[n, k])?;
/// let act = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
/// let mut hidden = DeviceTensor::from_host(s, &vec![f16::ONE; n], &[1, n])?;
/// gemv_dense::linear_add(s, &act, &w, &mut hidden)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn linear_add<T: HalfDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    w: &DeviceTensor<T>,
    residual: &mut DeviceTensor<T>,
) -> Result<()> {
    let (m, k) = check_x(x)?;
    let n = check_w("w", w, k, 1)?;
    expect_shape("residual", residual, &[m, n])?;
    launch(
        stream,
        "gemv_dense::linear_add",
        Epi::FL_GEMV_DENSE_ADD,
        x,
        None,
        w,
        None,
        residual,
        (m, n, k),
    )
}

/// `y = rms_norm(h) · wᵀ (+ bias)` with the RMSNorm fused in front: [`linear`] of
/// `x[t, j] = h[t, j] · rstd[t] · norm.weight[j]`, `rstd[t] = 1 / sqrt(mean_j h[t, j]² + eps)`,
/// where `x` is formed (and rounded to `T` exactly as [`crate::norm::rms_norm`] rounds it)
/// while `h` is loaded, and never written to memory. Each CTA recomputes `rstd` of the `m`
/// rows (`m · k` values from L2) before its main loop.
///
/// Shapes: `h [m, k]` (`m` in 0..=[`MAX_M`], `k` a positive multiple of [`K_MULTIPLE`]),
/// `norm.weight [k]`, `w [n, k]`, `bias [n]`, `y [m, n]`. Dtypes: all f16 or all bf16.
///
/// Errors: as [`linear`] (`h` is named `x`); [`Error::Shape`] naming `norm.weight` (not
/// `[k]`); [`Error::InvalidArgument`] naming `eps` (not positive and finite).
///
/// ```no_run
/// use fl_kernels::{f16, gemv_dense, DeviceTensor, Gpu};
/// use fl_kernels::gemv_dense::RmsNorm;
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (n, k) = (12288, 4096);
/// let w = DeviceTensor::from_host(s, &vec![f16::from_f32(0.01); n * k], &[n, k])?;
/// let gamma = DeviceTensor::from_host(s, &vec![f16::ONE; k], &[k])?;
/// let h = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
/// let mut qkv = DeviceTensor::<f16>::zeros(s, &[1, n])?;
/// let norm = RmsNorm { weight: &gamma, eps: 1e-5 };
/// gemv_dense::rms_norm_linear(s, &h, norm, &w, None, &mut qkv)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rms_norm_linear<T: HalfDType>(
    stream: &CudaStream,
    h: &DeviceTensor<T>,
    norm: RmsNorm<'_, T>,
    w: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    y: &mut DeviceTensor<T>,
) -> Result<()> {
    let (m, k) = check_x(h)?;
    let n = check_w("w", w, k, 1)?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[n])?;
    }
    expect_shape("y", y, &[m, n])?;
    launch(
        stream,
        "gemv_dense::rms_norm_linear",
        Epi::FL_GEMV_DENSE_LINEAR,
        h,
        Some(norm),
        w,
        bias,
        y,
        (m, n, k),
    )
}

/// `out = silu(rms_norm(h) · W_gateᵀ) ⊙ (rms_norm(h) · W_upᵀ)`: [`linear_swiglu`] with the
/// RMSNorm of its input fused in front, as in [`rms_norm_linear`].
///
/// Shapes: `h [m, k]` (`m` in 0..=[`MAX_M`], `k` a positive multiple of [`K_MULTIPLE`]),
/// `norm.weight [k]`, `w_gate_up [2I, k]`, `out [m, I]`. Dtypes: all f16 or all bf16.
///
/// Errors: as [`linear_swiglu`] (`h` is named `x`); [`Error::Shape`] naming `norm.weight`;
/// [`Error::InvalidArgument`] naming `eps`.
///
/// ```no_run
/// use fl_kernels::{f16, gemv_dense, DeviceTensor, Gpu};
/// use fl_kernels::gemv_dense::RmsNorm;
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (i, k) = (11008, 4096);
/// let w = DeviceTensor::from_host(s, &vec![f16::from_f32(0.01); 2 * i * k], &[2 * i, k])?;
/// let gamma = DeviceTensor::from_host(s, &vec![f16::ONE; k], &[k])?;
/// let h = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
/// let mut act = DeviceTensor::<f16>::zeros(s, &[1, i])?;
/// let norm = RmsNorm { weight: &gamma, eps: 1e-5 };
/// gemv_dense::rms_norm_linear_swiglu(s, &h, norm, &w, &mut act)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rms_norm_linear_swiglu<T: HalfDType>(
    stream: &CudaStream,
    h: &DeviceTensor<T>,
    norm: RmsNorm<'_, T>,
    w_gate_up: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (m, k) = check_x(h)?;
    let i = check_w("w_gate_up", w_gate_up, k, 2)? / 2;
    expect_shape("out", out, &[m, i])?;
    launch(
        stream,
        "gemv_dense::rms_norm_linear_swiglu",
        Epi::FL_GEMV_DENSE_SWIGLU,
        h,
        Some(norm),
        w_gate_up,
        None,
        out,
        (m, i, k),
    )
}

/// What [`linear_rope_append`] does with the QKV projection: how its rows split into heads,
/// the rotary embedding (interleaved pairing) and where each token's K and V go.
#[derive(Clone, Copy, Debug)]
pub struct QkvRopeAppend<'a> {
    /// Head counts: the rows of `w` are `q_heads` q heads, then `kv_heads` k heads, then
    /// `kv_heads` v heads, `rope.head_dim` rows each.
    pub heads: QkvSplit,
    /// The rotation; its style must be [`RopeStyle::Interleaved`] (see
    /// [`crate::rope::rotate_half_to_interleaved_rows`] for rotate-half checkpoints).
    pub rope: &'a RopeParams,
    /// Sequence and position of each token (the positions also give the rotary angles).
    pub slots: TokenSlots<'a>,
    /// Cache layout (and block table): contiguous, or paged as
    /// [`crate::kv_cache::append_paged`].
    pub layout: CacheLayout<'a>,
}

/// The QKV projection of a decode step with RoPE and the KV-cache append fused into its
/// epilogue: one launch in place of [`linear`] / [`rms_norm_linear`] followed by
/// [`crate::kv_cache::rope_append`].
///
/// With `acc[t, r] = x[t, :] · w[r, :] (+ bias[r])` in f32 (`x = rms_norm(h)` as in
/// [`rms_norm_linear`] when `norm` is given, else `x = h`), `s = seq_ids[t]`, `p =
/// positions[t]`, and `R` the rotation of [`crate::rope::apply`] with the interleaved pairing (pair
/// `i` = elements `(2i, 2i + 1)` of a head, angle `p · inv_freq[i]` in f32, accurate sincos)
/// applied to the f32 values:
///
/// ```text
/// q_out[t, h, :]             = T(R(acc[t, q head h]))     h < q_heads
/// cache.k[slot(s, p), h, :]  = T(R(acc[t, k head h]))     h < kv_heads
/// cache.v[slot(s, p), h, :]  = T(acc[t, v head h])
/// ```
///
/// where `slot` is `[s, h, p]` ([`CacheLayout::Contiguous`]) or `[block_table[s, p /
/// block_size], h, p % block_size]` ([`CacheLayout::Paged`], the layout of
/// [`crate::kv_cache::append_paged`]). Each value is rounded once (the unfused pair rounds
/// `qkv` before rotating, so the two agree to one rounding of `T`). Elements past
/// `rope.rotary_dim` are not rotated.
///
/// Shapes: `h [m, k]` (`m` in 0..=[`MAX_M`], `k` a positive multiple of [`K_MULTIPLE`]),
/// `norm.weight [k]`, `w [(q_heads + 2 kv_heads) * d, k]` with `d = rope.head_dim` a
/// multiple of 8, `bias` as `w`'s rows, `seq_ids` and `positions` `[m]`, `q_out [m, q_heads,
/// d]`, `cache` `[batch, kv_heads, max_seq, d]` (contiguous) or `[num_blocks, kv_heads,
/// block_size, d]` with `block_table [batch, max_blocks_per_seq]` (i32; paged), `err_flag
/// [1]`. Dtypes: all f16 or all bf16 (the cache too).
///
/// Errors: those of [`rms_norm_linear`] (`h` is named `x`); those of
/// [`RopeParams::validate`]; [`Error::InvalidArgument`] naming `rope` (not interleaved, or
/// `head_dim` not a multiple of 8), `heads` (no kv head) or `cache` (holds no slot);
/// [`Error::Shape`] naming `w`, `bias`, `seq_ids`, `positions`, `q_out`, `cache`,
/// `block_table` (not 2-D, no column, or no row while there are tokens) or `err_flag`;
/// [`Error::TooLarge`] for a batch, table width or block size past `i32`. On the device a
/// token whose slot does not exist (sequence outside `0..batch`, a negative position, one past
/// `max_seq` or the block table, a block id outside `0..num_blocks`) writes nothing (neither
/// `q_out` nor the cache) and sets [`crate::kv_cache::ERR_SEQUENCE`],
/// [`crate::kv_cache::ERR_POSITION`] or [`crate::kv_cache::ERR_BLOCK`] in `err_flag` when
/// given (see [`crate::kv_cache::check_error_flag`]).
///
/// ```no_run
/// use fl_kernels::gemv_dense::{self, QkvRopeAppend, RmsNorm};
/// use fl_kernels::kv_cache::{CacheLayout, KvCache, QkvSplit, TokenSlots};
/// use fl_kernels::rope::{RopeParams, RopeStyle};
/// use fl_kernels::{f16, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// // one decode token of a Llama-2-7B layer (32 heads of 128), sequence 0, position 17
/// let (heads, d, k) = (QkvSplit { q_heads: 32, kv_heads: 32 }, 128, 4096);
/// let rows = (32 + 2 * 32) * d;
/// let w = DeviceTensor::from_host(s, &vec![f16::from_f32(0.01); rows * k], &[rows, k])?;
/// let gamma = DeviceTensor::from_host(s, &vec![f16::ONE; k], &[k])?;
/// let h = DeviceTensor::from_host(s, &vec![f16::from_f32(0.5); k], &[1, k])?;
/// let seq_ids = DeviceTensor::from_host(s, &[0i32], &[1])?;
/// let positions = DeviceTensor::from_host(s, &[17i32], &[1])?;
/// let rope = RopeParams::new(d, 10_000.0).with_style(RopeStyle::Interleaved);
/// let mut q = DeviceTensor::<f16>::zeros(s, &[1, 32, d])?;
/// let mut cache = KvCache::<f16>::zeros(s, [1, 32, 4096, d])?;
/// let args = QkvRopeAppend {
///     heads,
///     rope: &rope,
///     slots: TokenSlots { seq_ids: &seq_ids, positions: &positions },
///     layout: CacheLayout::Contiguous,
/// };
/// let norm = RmsNorm { weight: &gamma, eps: 1e-5 };
/// gemv_dense::linear_rope_append(s, &h, Some(norm), &w, None, &args, &mut q, &mut cache, None)?;
///
/// // The same into a paged cache of 64 blocks of 16 slots: sequence 0 owns blocks 7 and 3, so
/// // position 17 lands in block 3, slot 1.
/// let table = DeviceTensor::from_host(s, &[7i32, 3], &[1, 2])?;
/// let mut paged = KvCache::<f16>::zeros(s, [64, 32, 16, d])?;
/// let args = QkvRopeAppend { layout: CacheLayout::Paged { block_table: &table }, ..args };
/// gemv_dense::linear_rope_append(s, &h, Some(norm), &w, None, &args, &mut q, &mut paged, None)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn linear_rope_append<T: HalfDType>(
    stream: &CudaStream,
    h: &DeviceTensor<T>,
    norm: Option<RmsNorm<'_, T>>,
    w: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    args: &QkvRopeAppend<'_>,
    q_out: &mut DeviceTensor<T>,
    cache: &mut KvCache<T>,
    err_flag: Option<&mut DeviceTensor<i32>>,
) -> Result<()> {
    let (m, k) = check_x(h)?;
    let rope = args.rope;
    let p = rope.to_ffi()?;
    if rope.style != RopeStyle::Interleaved {
        return Err(Error::invalid(
            "rope",
            "the fused epilogue rotates interleaved pairs only (permute rotate-half q/k rows \
             with rope::rotate_half_to_interleaved_rows)",
        ));
    }
    let d = rope.head_dim;
    if d % 8 != 0 {
        return Err(Error::invalid(
            "rope",
            format!("head_dim = {d} must be a multiple of 8"),
        ));
    }
    let QkvSplit { q_heads, kv_heads } = args.heads;
    let n = crate::kv_cache::qkv_row_heads(args.heads, d)? * d;
    let rows = check_w("w", w, k, 1)?;
    if rows != n {
        return Err(Error::Shape {
            arg: "w",
            expected: format!("[{n}, {k}] ((q_heads + 2 kv_heads) * head_dim rows)"),
            got: w.shape().to_vec(),
        });
    }
    if let Some(b) = bias {
        expect_shape("bias", b, &[n])?;
    }
    if let Some(nm) = &norm {
        expect_shape("norm.weight", nm.weight, &[k])?;
        crate::tensor::check_eps(nm.eps)?;
    }
    expect_shape("seq_ids", args.slots.seq_ids, &[m])?;
    expect_shape("positions", args.slots.positions, &[m])?;
    expect_shape("q_out", q_out, &[m, q_heads, d])?;
    let [c0, c_heads, c_slots, c_dim] = cache.shape();
    if c_heads != kv_heads || c_dim != d {
        let expected = match args.layout {
            CacheLayout::Contiguous => format!("[batch, {kv_heads}, max_seq, {d}]"),
            CacheLayout::Paged { .. } => format!("[num_blocks, {kv_heads}, block_size, {d}]"),
        };
        return Err(Error::Shape {
            arg: "cache",
            expected: format!("{expected} (kv_heads of heads, head_dim of rope)"),
            got: cache.shape().to_vec(),
        });
    }
    // (block_table, batch, max_blocks_per_seq) when paged
    let paged = match args.layout {
        CacheLayout::Contiguous => None,
        CacheLayout::Paged { block_table } => {
            let (b, mb) = crate::kv_cache::block_table_dims(block_table)?;
            Some((block_table, b, mb))
        }
    };
    let batch = paged.map_or(c0, |(_, b, _)| b);
    let (pf, _gf) = crate::kv_cache::flag_ptr(stream, err_flag)?;
    if m == 0 {
        return Ok(());
    }
    if cache.k().is_empty() {
        return Err(Error::invalid(
            "cache",
            format!("shape {:?} holds no slot", cache.shape()),
        ));
    }
    if let (Some((table, _, _)), 0) = (paged, batch) {
        return Err(Error::Shape {
            arg: "block_table",
            expected: "[batch, max_blocks_per_seq] with batch >= 1 (there are tokens)".into(),
            got: table.shape().to_vec(),
        });
    }
    let batch_arg = if paged.is_some() {
        "block_table"
    } else {
        "cache"
    };
    let batch_i = as_i32(batch_arg, batch)?;
    let (mi, ki) = (as_i64("x", m)?, as_i64("x", k)?);
    let (ph, _gh) = h.ptr(stream);
    let (pw, _gw) = w.ptr(stream);
    let (pb, _gb) = crate::tensor::opt_ptr(bias, stream);
    let (pg, _gg) = crate::tensor::opt_ptr(norm.map(|nm| nm.weight), stream);
    let eps = norm.map_or(0.0, |nm| nm.eps);
    let (ps, _gs) = args.slots.seq_ids.ptr(stream);
    let (pp, _gp) = args.slots.positions.ptr(stream);
    let (pq, _gq) = q_out.ptr_mut(stream);
    let (kc, vc) = cache.parts_mut();
    let (pkc, _gk) = kc.ptr_mut(stream);
    let (pvc, _gv) = vc.ptr_mut(stream);
    let status = match paged {
        None => {
            // SAFETY: h holds m·k elements of T, w n·k, bias n, gamma k, seq_ids and positions
            // m i32, q_out m·q_heads·d, each cache batch·kv_heads·max_seq·d (all checked above);
            // the kernel writes cache slots only for 0 <= s < batch and 0 <= p < max_seq. q_out
            // and the caches are borrowed mutably, so they are distinct allocations from every
            // input. `p` lives across the call (the launcher copies the frequencies). The guards
            // keep every buffer alive until the launch is queued on `stream`.
            unsafe {
                fl_kernels_sys::fl_gemv_dense_rope_append(
                    T::ID,
                    ph as _,
                    pg as _,
                    eps,
                    pw as _,
                    pb as _,
                    mi,
                    ki,
                    q_heads as i32,
                    kv_heads as i32,
                    &p,
                    ps as _,
                    pp as _,
                    pq as _,
                    pkc as _,
                    pvc as _,
                    batch_i,
                    c_slots as i64,
                    pf as _,
                    raw_stream(stream),
                )
            }
        }
        Some((table, _, max_blocks)) => {
            let max_blocks_i = as_i32("block_table", max_blocks)?;
            let block_size_i = as_i32("block_size", c_slots)?;
            let (pt, _gt) = table.ptr(stream);
            // SAFETY: as above, with each cache num_blocks·kv_heads·block_size·d elements; the
            // block table holds batch·max_blocks i32 and the kernel reads entry (s, p /
            // block_size) only for s < batch and p / block_size < max_blocks, and writes only
            // blocks in 0..num_blocks.
            unsafe {
                fl_kernels_sys::fl_gemv_dense_rope_append_paged(
                    T::ID,
                    ph as _,
                    pg as _,
                    eps,
                    pw as _,
                    pb as _,
                    mi,
                    ki,
                    q_heads as i32,
                    kv_heads as i32,
                    &p,
                    ps as _,
                    pp as _,
                    pq as _,
                    pkc as _,
                    pvc as _,
                    pt as _,
                    batch_i,
                    max_blocks_i,
                    c0 as i64,
                    block_size_i,
                    pf as _,
                    raw_stream(stream),
                )
            }
        }
    };
    check("gemv_dense::linear_rope_append", status)
}
