//! Row norms over the last dimension: [`rms_norm`], [`add_rms_norm`] (residual add fused
//! with RMSNorm, as in FasterLLaMA), [`layer_norm`] and [`add_bias_layer_norm`] (a sublayer's
//! bias and the residual fused with LayerNorm, BERT's post-LN block end, as in
//! FasterTransformer).
//!
//! Every op treats its input as `[rows, hidden]` (`hidden` = the last dimension, `rows` = the
//! product of the others), computes the row statistics and the normalisation in f32 and
//! rounds each output element to `T` once. Memory-bound: with `hidden` a multiple of the
//! 16-byte vector width (8 for f16/bf16, 4 for f32) and `hidden <= 32768` (f16/bf16) or
//! `16384` (f32), a row is read once into registers and written once; other sizes take a
//! scalar path that gives the same results.
//!
//! CPU references: [`crate::reference::norm`](mod@crate::reference::norm).

use cudarc::driver::CudaStream;

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i64, check_eps, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// `(rows, hidden)` of `x` viewed as `[rows, hidden]`; `hidden` is the last dimension and
/// must be at least 1.
fn rows_hidden<T: FloatDType>(x: &DeviceTensor<T>) -> Result<(usize, usize)> {
    match x.shape().split_last() {
        Some((&hidden, rest)) if hidden >= 1 => Ok((rest.iter().product(), hidden)),
        _ => Err(Error::Shape {
            arg: "x",
            expected: "[..., hidden] with rank >= 1 and hidden >= 1".into(),
            got: x.shape().to_vec(),
        }),
    }
}

/// RMSNorm (LLaMA): `y[r, i] = x[r, i] / sqrt(mean_j(x[r, j]^2) + eps) * weight[i]`.
///
/// Computed in f32 and rounded to `T` once: `y = T(f32(x) * rstd * f32(weight))`. (Hugging
/// Face's `LlamaRMSNorm` rounds `x * rstd` to `T` before multiplying by the weight in `T`;
/// the two agree to within one rounding of `T`.)
///
/// Shapes: `x` and `out` `[..., hidden]` (the same shape), `weight` `[hidden]`.
/// Dtypes: `f32`, `f16`, `bf16`, the same for all three.
///
/// Errors: [`Error::Shape`] naming `x` (rank 0 or `hidden == 0`), `weight` or `out`;
/// [`Error::InvalidArgument`] naming `eps` unless `eps` is finite and `> 0`.
///
/// ```no_run
/// use fl_kernels::{norm, DeviceTensor, Gpu};
/// use half::bf16;
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let (tokens, hidden) = (4, 4096);
/// let x = DeviceTensor::from_host(s, &vec![bf16::from_f32(0.5); tokens * hidden], &[tokens, hidden])?;
/// let w = DeviceTensor::from_host(s, &vec![bf16::from_f32(1.0); hidden], &[hidden])?;
/// let mut y = DeviceTensor::<bf16>::zeros(s, &[tokens, hidden])?;
/// norm::rms_norm(s, &x, &w, 1e-5, &mut y)?;
/// // every x is 0.5, so x / rms(x) = 1 (up to eps)
/// assert!(y.to_host(s)?.iter().all(|v| (v.to_f32() - 1.0).abs() < 1e-2));
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn rms_norm<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    eps: f32,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (rows, hidden) = rows_hidden(x)?;
    expect_shape("weight", weight, &[hidden])?;
    expect_shape("out", out, x.shape())?;
    check_eps(eps)?;
    let (rows, hidden) = (as_i64("x", rows)?, as_i64("x", hidden)?);
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = weight.ptr(stream);
    let (py, _gy) = out.ptr_mut(stream);
    // SAFETY: x and out hold rows * hidden elements of T and weight holds hidden (shapes
    // checked above); the guards keep the buffers alive until the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_rms_norm(
            T::ID,
            px as _,
            pw as _,
            py as _,
            rows,
            hidden,
            eps,
            raw_stream(stream),
        )
    };
    check("rms_norm", status)
}

/// Fused residual add + RMSNorm (FasterLLaMA), one pass over memory:
///
/// ```text
/// residual[r, i] = T(residual[r, i] + x[r, i])              (updated in place)
/// out[r, i]      = residual[r, i] / sqrt(mean_j(residual[r, j]^2) + eps) * weight[i]
/// ```
///
/// The norm is taken of the new residual as rounded to `T` (what an unfused
/// `add` then [`rms_norm`] computes), so the two give the same `out`; the
/// residual matches [`elementwise::add`](crate::elementwise::add) bit for bit.
///
/// Shapes: `x`, `residual` and `out` `[..., hidden]` (the same shape), `weight` `[hidden]`.
/// Dtypes: `f32`, `f16`, `bf16`, the same for all four.
///
/// Errors: [`Error::Shape`] naming `x`, `residual`, `weight` or `out`;
/// [`Error::InvalidArgument`] naming `eps` unless `eps` is finite and `> 0`.
///
/// ```no_run
/// use fl_kernels::{norm, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let hidden = 8;
/// let attn_out = DeviceTensor::from_host(s, &[1.0f32; 8], &[1, hidden])?;
/// let mut residual = DeviceTensor::from_host(s, &[2.0f32; 8], &[1, hidden])?;
/// let w = DeviceTensor::from_host(s, &[1.0f32; 8], &[hidden])?;
/// let mut normed = DeviceTensor::zeros(s, &[1, hidden])?;
/// norm::add_rms_norm(s, &attn_out, &mut residual, &w, 1e-6, &mut normed)?;
/// assert_eq!(residual.to_host(s)?, vec![3.0; 8]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn add_rms_norm<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    residual: &mut DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    eps: f32,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (rows, hidden) = rows_hidden(x)?;
    expect_shape("residual", residual, x.shape())?;
    expect_shape("weight", weight, &[hidden])?;
    expect_shape("out", out, x.shape())?;
    check_eps(eps)?;
    let (rows, hidden) = (as_i64("x", rows)?, as_i64("x", hidden)?);
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = weight.ptr(stream);
    let (pr, _gr) = residual.ptr_mut(stream);
    let (py, _gy) = out.ptr_mut(stream);
    // SAFETY: x, residual and out hold rows * hidden elements of T, weight holds hidden;
    // residual and out are distinct &mut borrows, so they alias neither each other nor x.
    let status = unsafe {
        fl_kernels_sys::fl_add_rms_norm(
            T::ID,
            px as _,
            pr as _,
            pw as _,
            py as _,
            rows,
            hidden,
            eps,
            raw_stream(stream),
        )
    };
    check("add_rms_norm", status)
}

/// LayerNorm with weight and optional bias:
/// `y[r, i] = (x[r, i] - mean_r) / sqrt(var_r + eps) * weight[i] + bias[i]`,
/// with `mean_r` and the biased variance `var_r = mean_j((x[r, j] - mean_r)^2)` of row `r`
/// (two passes over the row, in f32), rounded to `T` once (as `torch.nn.functional.layer_norm`).
///
/// Shapes: `x` and `out` `[..., hidden]` (the same shape), `weight` and `bias` `[hidden]`.
/// Dtypes: `f32`, `f16`, `bf16`, the same for all.
///
/// Errors: [`Error::Shape`] naming `x`, `weight`, `bias` or `out`;
/// [`Error::InvalidArgument`] naming `eps` unless `eps` is finite and `> 0`.
///
/// ```no_run
/// use fl_kernels::{norm, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, 4.0], &[1, 4])?;
/// let w = DeviceTensor::from_host(s, &[1.0f32; 4], &[4])?;
/// let b = DeviceTensor::from_host(s, &[0.5f32; 4], &[4])?;
/// let mut y = DeviceTensor::zeros(s, &[1, 4])?;
/// norm::layer_norm(s, &x, &w, Some(&b), 1e-5, &mut y)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn layer_norm<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    eps: f32,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (rows, hidden) = rows_hidden(x)?;
    expect_shape("weight", weight, &[hidden])?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[hidden])?;
    }
    expect_shape("out", out, x.shape())?;
    check_eps(eps)?;
    let (rows, hidden) = (as_i64("x", rows)?, as_i64("x", hidden)?);
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = weight.ptr(stream);
    let bias_ptr = bias.map(|b| b.ptr(stream));
    let pb = bias_ptr.as_ref().map_or(0, |(p, _)| *p);
    let (py, _gy) = out.ptr_mut(stream);
    // SAFETY: x and out hold rows * hidden elements of T, weight and bias (when given)
    // hidden; a null bias pointer means no bias. The guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_layer_norm(
            T::ID,
            px as _,
            pw as _,
            pb as _,
            py as _,
            rows,
            hidden,
            eps,
            raw_stream(stream),
        )
    };
    check("layer_norm", status)
}

/// Fused add-bias + residual + LayerNorm, the end of a post-LN (BERT) sublayer
/// (FasterTransformer's `addBiasInputLayernorm`): with `x` the sublayer's GEMM output before
/// its bias,
///
/// `h[r, i] = T((x[r, i] + x_bias[i]) + residual[r, i])` (f32 sums, one rounding, as torch's
/// residual add in `T`; no bias term for `None`), then `out = layer_norm(h, weight, bias)` as
/// [`layer_norm`] computes it. In place over the residual stream:
/// [`add_bias_layer_norm_inplace`].
///
/// Shapes: `x`, `residual`, `out` `[..., hidden]` (one shape); `x_bias`, `weight`, `bias`
/// `[hidden]`. Dtypes: `f32`, `f16`, `bf16`, the same for all.
///
/// Errors: [`Error::Shape`] naming `x`, `x_bias`, `residual`, `weight`, `bias` or `out`;
/// [`Error::InvalidArgument`] naming `eps` unless `eps` is finite and `> 0`.
///
/// ```no_run
/// use fl_kernels::{norm, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, 4.0], &[1, 4])?;
/// let xb = DeviceTensor::from_host(s, &[0.5f32; 4], &[4])?;
/// let res = DeviceTensor::from_host(s, &[1.0f32; 4], &[1, 4])?;
/// let w = DeviceTensor::from_host(s, &[1.0f32; 4], &[4])?;
/// let mut y = DeviceTensor::zeros(s, &[1, 4])?;
/// norm::add_bias_layer_norm(s, &x, Some(&xb), &res, &w, None, 1e-5, &mut y)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn add_bias_layer_norm<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    x_bias: Option<&DeviceTensor<T>>,
    residual: &DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    eps: f32,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let dims = add_bias_ln_check(x, x_bias, residual.shape(), weight, bias, eps)?;
    expect_shape("out", out, x.shape())?;
    let (pr, _gr) = residual.ptr(stream);
    let (py, _gy) = out.ptr_mut(stream);
    add_bias_ln_launch(stream, dims, x, x_bias, pr, weight, bias, eps, py)
}

/// [`add_bias_layer_norm`] writing the result over `residual` (the residual stream of a
/// post-LN block: `residual = LayerNorm(x + x_bias + residual)`).
///
/// Shapes, dtypes and errors as [`add_bias_layer_norm`] (no `out`).
///
/// ```no_run
/// use fl_kernels::{norm, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, 4.0], &[1, 4])?;
/// let mut hidden = DeviceTensor::from_host(s, &[1.0f32; 4], &[1, 4])?;
/// let w = DeviceTensor::from_host(s, &[1.0f32; 4], &[4])?;
/// norm::add_bias_layer_norm_inplace(s, &x, None, &mut hidden, &w, None, 1e-12)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn add_bias_layer_norm_inplace<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    x_bias: Option<&DeviceTensor<T>>,
    residual: &mut DeviceTensor<T>,
    weight: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    eps: f32,
) -> Result<()> {
    let dims = add_bias_ln_check(x, x_bias, residual.shape(), weight, bias, eps)?;
    let (pr, _gr) = residual.ptr_mut(stream);
    add_bias_ln_launch(stream, dims, x, x_bias, pr, weight, bias, eps, pr)
}

/// Checks the shapes and `eps` of [`add_bias_layer_norm`]; returns `(rows, hidden)`.
fn add_bias_ln_check<T: FloatDType>(
    x: &DeviceTensor<T>,
    x_bias: Option<&DeviceTensor<T>>,
    residual: &[usize],
    weight: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    eps: f32,
) -> Result<(i64, i64)> {
    let (rows, hidden) = rows_hidden(x)?;
    if residual != x.shape() {
        return Err(Error::Shape {
            arg: "residual",
            expected: format!("{:?} (x's shape)", x.shape()),
            got: residual.to_vec(),
        });
    }
    if let Some(b) = x_bias {
        expect_shape("x_bias", b, &[hidden])?;
    }
    expect_shape("weight", weight, &[hidden])?;
    if let Some(b) = bias {
        expect_shape("bias", b, &[hidden])?;
    }
    check_eps(eps)?;
    Ok((as_i64("x", rows)?, as_i64("x", hidden)?))
}

/// Launches [`add_bias_layer_norm`] on checked shapes; `py` may be `pr` (the kernel allows y
/// to alias the residual).
#[allow(clippy::too_many_arguments)]
fn add_bias_ln_launch<T: FloatDType>(
    stream: &CudaStream,
    (rows, hidden): (i64, i64),
    x: &DeviceTensor<T>,
    x_bias: Option<&DeviceTensor<T>>,
    pr: u64,
    weight: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    eps: f32,
    py: u64,
) -> Result<()> {
    let (px, _gx) = x.ptr(stream);
    let (pw, _gw) = weight.ptr(stream);
    let xb = x_bias.map(|b| b.ptr(stream));
    let pxb = xb.as_ref().map_or(0, |(p, _)| *p);
    let lb = bias.map(|b| b.ptr(stream));
    let pb = lb.as_ref().map_or(0, |(p, _)| *p);
    // SAFETY: x, residual and y hold rows * hidden elements of T (shapes checked by
    // add_bias_ln_check), x_bias, weight and bias (when given) hidden; null pointers mean no
    // bias. y is either the caller's mutably borrowed `out` (overlapping no input) or the
    // residual itself, which the kernel allows. The callers' guards outlive the launch call.
    let status = unsafe {
        fl_kernels_sys::fl_add_bias_layer_norm(
            T::ID,
            px as _,
            pxb as _,
            pr as _,
            pw as _,
            pb as _,
            py as _,
            rows,
            hidden,
            eps,
            raw_stream(stream),
        )
    };
    check("add_bias_layer_norm", status)
}
