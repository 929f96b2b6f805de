//! Activations of the MLP block: [`swiglu_fused`], [`swiglu`], [`gelu`], [`gelu_inplace`],
//! [`bias_add`], [`bias_add_inplace`].
//!
//! Memory-bound: 16-byte vector accesses when the row length and the buffers allow it (any
//! size works), f32 arithmetic, one rounding to `T` at the output. The residual add is
//! [`elementwise::add_assign`](crate::elementwise::add_assign).
//! CPU references: [`crate::reference::activation`](mod@crate::reference::activation).

use cudarc::driver::CudaStream;

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Which GELU: the tanh approximation or the exact erf form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GeluKind {
    /// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))` (PyTorch `approximate="tanh"`,
    /// GPT-2's `gelu_new`). The kernel computes the equal `x / (1 + exp(-2 sqrt(2/π) (x +
    /// 0.044715 x³)))`, which neither cancels for `x < 0` nor overflows to NaN.
    Tanh,
    /// `0.5 x (1 + erf(x / √2)) = x Φ(x)` (PyTorch `approximate="none"`). The kernel
    /// computes Φ from erfc of `|x| / √2` (f32 relative error under 5e-7 for `|x| < 2`,
    /// 3e-6 for `|x| < 5`), so it stays accurate in both tails.
    Erf,
}

impl GeluKind {
    /// Short name, as in bench keys (`"tanh"`, `"erf"`).
    pub fn name(self) -> &'static str {
        match self {
            GeluKind::Tanh => "tanh",
            GeluKind::Erf => "erf",
        }
    }

    fn ffi(self) -> fl_kernels_sys::fl_gelu_kind {
        match self {
            GeluKind::Tanh => fl_kernels_sys::fl_gelu_kind::FL_GELU_TANH,
            GeluKind::Erf => fl_kernels_sys::fl_gelu_kind::FL_GELU_ERF,
        }
    }
}

/// `(rows, last)` of a shape `[..., last]` (rows = product of the leading dimensions).
fn rows_last(arg: &'static str, shape: &[usize]) -> Result<(usize, usize)> {
    match shape.split_last() {
        Some((&last, lead)) => Ok((lead.iter().product(), last)),
        None => Err(Error::Shape {
            arg,
            expected: "rank >= 1 ([..., n])".into(),
            got: shape.to_vec(),
        }),
    }
}

/// SwiGLU on the fused `[gate | up]` GEMM output:
/// `out[r, j] = silu(x[r, j]) * x[r, inter + j]`, `silu(v) = v / (1 + exp(-v))`.
///
/// Shapes: `x` `[..., 2 * inter]` (each row holds the gate half, then the up half), `out`
/// `[..., inter]` with the same leading dimensions. Any `inter`; rank >= 1.
/// Dtypes: `f32`, `f16`, `bf16`, computed in f32 (silu overflow-safe: `silu(-100) = -0`,
/// never NaN for finite inputs; f32 results within about 1e-6 relative).
/// The same results, bit for bit, as [`swiglu`] on the two halves.
///
/// Errors: [`Error::Shape`] naming `x` (rank 0 or an odd last dimension) or `out`.
///
/// ```no_run
/// use fl_kernels::{activation, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// // two tokens, inter = 3: rows are [g0 g1 g2 | u0 u1 u2]
/// let x = DeviceTensor::from_host(
///     s,
///     &[1.0f32, 0.0, -1.0, 2.0, 2.0, 2.0, 3.0, -3.0, 0.5, 1.0, 1.0, 1.0],
///     &[2, 6],
/// )?;
/// let mut out = DeviceTensor::zeros(s, &[2, 3])?;
/// activation::swiglu_fused(s, &x, &mut out)?;
/// let y = out.to_host(s)?;
/// assert!((y[0] - 2.0 * 0.731_058_6).abs() < 1e-5); // silu(1) * 2
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn swiglu_fused<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (rows, two_inter) = rows_last("x", x.shape())?;
    if two_inter % 2 != 0 {
        return Err(Error::Shape {
            arg: "x",
            expected: "[..., 2 * inter] (an even last dimension: gate half, then up half)".into(),
            got: x.shape().to_vec(),
        });
    }
    let inter = two_inter / 2;
    let mut want = x.shape().to_vec();
    if let Some(last) = want.last_mut() {
        *last = inter;
    }
    expect_shape("out", out, &want)?;
    let (rows, inter) = (as_i64("x", rows)?, as_i64("x", inter)?);
    let (px, _gx) = x.ptr(stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: x holds rows * 2 * inter elements of T and out rows * inter (shapes checked
    // above); they are distinct buffers (out is borrowed mutably); both live until the
    // guards drop, after the launch is queued on `stream`.
    let status = unsafe {
        fl_kernels_sys::fl_swiglu_fused(T::ID, px as _, po as _, rows, inter, raw_stream(stream))
    };
    check("swiglu_fused", status)
}

/// SwiGLU on two inputs: `out[i] = silu(gate[i]) * up[i]`, `silu(v) = v / (1 + exp(-v))`.
///
/// Shapes: `gate`, `up` and `out` all have the same shape (any rank, typically
/// `[tokens, inter]`). Dtypes: `f32`, `f16`, `bf16`, computed in f32 (overflow-safe silu,
/// as in [`swiglu_fused`]).
///
/// Errors: [`Error::Shape`] naming `up` or `out` when a shape differs from `gate`'s.
///
/// ```no_run
/// use fl_kernels::{activation, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let gate = DeviceTensor::from_host(s, &[1.0f32, -100.0, 100.0], &[1, 3])?;
/// let up = DeviceTensor::from_host(s, &[2.0f32, 5.0, 0.5], &[1, 3])?;
/// let mut out = DeviceTensor::zeros(s, &[1, 3])?;
/// activation::swiglu(s, &gate, &up, &mut out)?;
/// let y = out.to_host(s)?;
/// assert_eq!(y[1], 0.0); // silu(-100) * 5, no NaN
/// assert_eq!(y[2], 50.0);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn swiglu<T: FloatDType>(
    stream: &CudaStream,
    gate: &DeviceTensor<T>,
    up: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    expect_shape("up", up, gate.shape())?;
    expect_shape("out", out, gate.shape())?;
    // Same-shape contiguous tensors: one row of all the elements (any rank).
    let (rows, inter) = (1, as_i64("gate", gate.len())?);
    let (pg, _gg) = gate.ptr(stream);
    let (pu, _gu) = up.ptr(stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: the three buffers hold rows * inter elements of T (shapes checked above); out
    // is borrowed mutably, so it overlaps neither input; all live until the guards drop.
    let status = unsafe {
        fl_kernels_sys::fl_swiglu(
            T::ID,
            pg as _,
            pu as _,
            po as _,
            rows,
            inter,
            raw_stream(stream),
        )
    };
    check("swiglu", status)
}

/// Checks `bias` against `x`'s last dimension; returns `(rows, cols)` to launch with.
fn bias_rows_cols<T: FloatDType>(
    x: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
) -> Result<(i64, i64)> {
    let (rows, cols) = match bias {
        Some(b) => {
            let (rows, cols) = rows_last("x", x.shape())?;
            expect_shape("bias", b, &[cols])?;
            (rows, cols)
        }
        // No bias: the launcher treats the tensor as flat anyway.
        None => (1, x.len()),
    };
    Ok((as_i64("x", rows)?, as_i64("x", cols)?))
}

/// GELU with an optional bias added first: `out[r, c] = gelu(x[r, c] + bias[c])`, or
/// `gelu(x[r, c])` without a bias; `kind` picks the tanh or erf form ([`GeluKind`]).
///
/// Shapes: `out` has `x`'s shape; with a bias, `x` is `[..., cols]` (rank >= 1) and `bias`
/// `[cols]`. Dtypes: `f32`, `f16`, `bf16`; the sum and the GELU are computed in f32 and
/// rounded once. In place: [`gelu_inplace`].
///
/// Errors: [`Error::Shape`] naming `out` or `bias`, or `x` when it has rank 0 and a bias is
/// given.
///
/// ```no_run
/// use fl_kernels::activation::{self, GeluKind};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[0.5f32, -1.0, 2.0, 0.0], &[2, 2])?;
/// let b = DeviceTensor::from_host(s, &[0.5f32, 1.0], &[2])?;
/// let mut out = DeviceTensor::zeros(s, &[2, 2])?;
/// activation::gelu(s, &x, Some(&b), &mut out, GeluKind::Erf)?;
/// let y = out.to_host(s)?;
/// assert!((y[0] - 0.841_344_7).abs() < 1e-5); // gelu(1) = Φ(1)
/// assert_eq!(y[1], 0.0); // gelu(0)
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn gelu<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    out: &mut DeviceTensor<T>,
    kind: GeluKind,
) -> Result<()> {
    expect_shape("out", out, x.shape())?;
    let (rows, cols) = bias_rows_cols(x, bias)?;
    let (px, _gx) = x.ptr(stream);
    let guard_b = bias.map(|b| b.ptr(stream));
    let pb = guard_b.as_ref().map_or(0, |g| g.0);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: x and out hold rows * cols elements of T and bias (when given) cols (shapes
    // checked above); a null bias means none; out is borrowed mutably, so it overlaps
    // neither x nor bias; all live until the guards drop, after the launch is queued.
    let status = unsafe {
        fl_kernels_sys::fl_gelu(
            T::ID,
            kind.ffi(),
            px as _,
            pb as _,
            po as _,
            rows,
            cols,
            raw_stream(stream),
        )
    };
    check("gelu", status)
}

/// [`gelu`] in place: `x[r, c] = gelu(x[r, c] + bias[c])` (or `gelu(x[r, c])`).
///
/// Shapes: with a bias, `x` is `[..., cols]` and `bias` `[cols]`; any shape without.
/// Errors: [`Error::Shape`] naming `bias`, or `x` when it has rank 0 and a bias is given.
///
/// ```no_run
/// use fl_kernels::activation::{self, GeluKind};
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let mut x = DeviceTensor::from_host(s, &[1.0f32, -1.0, 3.0], &[3])?;
/// activation::gelu_inplace(s, &mut x, None, GeluKind::Tanh)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn gelu_inplace<T: FloatDType>(
    stream: &CudaStream,
    x: &mut DeviceTensor<T>,
    bias: Option<&DeviceTensor<T>>,
    kind: GeluKind,
) -> Result<()> {
    let (rows, cols) = bias_rows_cols(x, bias)?;
    let guard_b = bias.map(|b| b.ptr(stream));
    let pb = guard_b.as_ref().map_or(0, |g| g.0);
    let (px, _gx) = x.ptr_mut(stream);
    // SAFETY: x holds rows * cols elements of T and bias (when given) cols; the kernel
    // allows out == x (each element read, then written, by one thread); bias is a distinct
    // buffer (x is borrowed mutably).
    let status = unsafe {
        fl_kernels_sys::fl_gelu(
            T::ID,
            kind.ffi(),
            px as _,
            pb as _,
            px as _,
            rows,
            cols,
            raw_stream(stream),
        )
    };
    check("gelu_inplace", status)
}

/// Bias add: `out[r, c] = x[r, c] + bias[c]`, computed in f32 and rounded to `T`.
///
/// Shapes: `x` `[..., cols]` (rank >= 1), `bias` `[cols]`, `out` `x`'s shape.
/// Dtypes: `f32`, `f16`, `bf16`. In place: [`bias_add_inplace`].
///
/// Errors: [`Error::Shape`] naming `x` (rank 0), `bias` or `out`.
///
/// ```no_run
/// use fl_kernels::{activation, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = DeviceTensor::from_host(s, &[10.0f32, 20.0], &[2])?;
/// let mut out = DeviceTensor::zeros(s, &[2, 2])?;
/// activation::bias_add(s, &x, &b, &mut out)?;
/// assert_eq!(out.to_host(s)?, vec![11.0, 22.0, 13.0, 24.0]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn bias_add<T: FloatDType>(
    stream: &CudaStream,
    x: &DeviceTensor<T>,
    bias: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    let (rows, cols) = bias_rows_cols(x, Some(bias))?;
    expect_shape("out", out, x.shape())?;
    let (px, _gx) = x.ptr(stream);
    let (pb, _gb) = bias.ptr(stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: x and out hold rows * cols elements of T, bias cols (shapes checked above);
    // out is borrowed mutably, so it overlaps neither input; all live until the guards drop.
    let status = unsafe {
        fl_kernels_sys::fl_bias_add(
            T::ID,
            px as _,
            pb as _,
            po as _,
            rows,
            cols,
            raw_stream(stream),
        )
    };
    check("bias_add", status)
}

/// [`bias_add`] in place: `x[r, c] += bias[c]`.
///
/// Shapes: `x` `[..., cols]` (rank >= 1), `bias` `[cols]`.
/// Errors: [`Error::Shape`] naming `x` (rank 0) or `bias`.
///
/// ```no_run
/// use fl_kernels::{activation, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let mut x = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = DeviceTensor::from_host(s, &[0.5f32, -0.5], &[2])?;
/// activation::bias_add_inplace(s, &mut x, &b)?;
/// assert_eq!(x.to_host(s)?, vec![1.5, 1.5, 3.5, 3.5]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn bias_add_inplace<T: FloatDType>(
    stream: &CudaStream,
    x: &mut DeviceTensor<T>,
    bias: &DeviceTensor<T>,
) -> Result<()> {
    let (rows, cols) = bias_rows_cols(x, Some(bias))?;
    let (pb, _gb) = bias.ptr(stream);
    let (px, _gx) = x.ptr_mut(stream);
    // SAFETY: x holds rows * cols elements of T and bias cols; the kernel allows out == x;
    // bias is a distinct buffer (x is borrowed mutably).
    let status = unsafe {
        fl_kernels_sys::fl_bias_add(
            T::ID,
            px as _,
            pb as _,
            px as _,
            rows,
            cols,
            raw_stream(stream),
        )
    };
    check("bias_add_inplace", status)
}
