//! Elementwise ops: [`add`], [`add_assign`], [`cast`]; and [`prefetch_l2`], a hint that warms
//! the L2 cache with (the start of) a buffer.
//!
//! Memory-bound: 16-byte vector accesses when the buffers allow it, f32 arithmetic.
//! CPU references: [`crate::reference::elementwise`](mod@crate::reference::elementwise).

use cudarc::driver::CudaStream;

use crate::dtype::{DType, FloatDType};
use crate::error::check;
use crate::tensor::{as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// `out[i] = a[i] + b[i]`, computed in f32 and rounded to `T`.
///
/// Shapes: `a`, `b` and `out` all have the same shape (any rank).
/// Dtypes: `f32`, `f16`, `bf16`.
///
/// Errors: [`Error::Shape`] naming `b` or `out` when a shape differs from `a`'s.
///
/// ```no_run
/// use fl_kernels::{elementwise, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let a = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0], &[3])?;
/// let b = DeviceTensor::from_host(s, &[0.5f32, 0.5, 0.5], &[3])?;
/// let mut out = DeviceTensor::zeros(s, &[3])?;
/// elementwise::add(s, &a, &b, &mut out)?;
/// assert_eq!(out.to_host(s)?, vec![1.5, 2.5, 3.5]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn add<T: FloatDType>(
    stream: &CudaStream,
    a: &DeviceTensor<T>,
    b: &DeviceTensor<T>,
    out: &mut DeviceTensor<T>,
) -> Result<()> {
    expect_shape("b", b, a.shape())?;
    expect_shape("out", out, a.shape())?;
    let n = as_i64("a", a.len())?;
    let (pa, _ga) = a.ptr(stream);
    let (pb, _gb) = b.ptr(stream);
    let (po, _go) = out.ptr_mut(stream);
    // SAFETY: the three buffers hold n elements of T (shapes checked above) and live until
    // the guards drop, after the launch is queued on `stream`.
    let status =
        unsafe { fl_kernels_sys::fl_add(T::ID, pa as _, pb as _, po as _, n, raw_stream(stream)) };
    check("add", status)
}

/// `acc[i] += b[i]` in place (the residual add), computed in f32.
///
/// Shapes: `acc` and `b` have the same shape. Errors: [`Error::Shape`] naming `b`.
pub fn add_assign<T: FloatDType>(
    stream: &CudaStream,
    acc: &mut DeviceTensor<T>,
    b: &DeviceTensor<T>,
) -> Result<()> {
    expect_shape("b", b, acc.shape())?;
    let n = as_i64("acc", acc.len())?;
    let (pb, _gb) = b.ptr(stream);
    let (pa, _ga) = acc.ptr_mut(stream);
    // SAFETY: both buffers hold n elements of T; the kernel allows out == a.
    let status =
        unsafe { fl_kernels_sys::fl_add(T::ID, pa as _, pb as _, pa as _, n, raw_stream(stream)) };
    check("add_assign", status)
}

/// `dst[i] = src[i]` converted from `S` to `D` (round to nearest even).
///
/// Shapes: `src` and `dst` have the same shape. Dtypes: any pair of `f32`, `f16`, `bf16`.
///
/// Errors: [`Error::Shape`] naming `dst`.
///
/// ```no_run
/// use fl_kernels::{elementwise, DeviceTensor, Gpu};
/// use half::f16;
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[1.0f32, -2.5, 1e-3], &[3])?;
/// let mut y = DeviceTensor::<f16>::zeros(s, &[3])?;
/// elementwise::cast(s, &x, &mut y)?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn cast<S: FloatDType, D: FloatDType>(
    stream: &CudaStream,
    src: &DeviceTensor<S>,
    dst: &mut DeviceTensor<D>,
) -> Result<()> {
    if dst.shape() != src.shape() {
        return Err(Error::Shape {
            arg: "dst",
            expected: format!("{:?}", src.shape()),
            got: dst.shape().to_vec(),
        });
    }
    let n = as_i64("src", src.len())?;
    let (ps, _gs) = src.ptr(stream);
    let (pd, _gd) = dst.ptr_mut(stream);
    // SAFETY: both buffers hold n elements of their types (shapes checked above).
    let status =
        unsafe { fl_kernels_sys::fl_cast(S::ID, ps as _, D::ID, pd as _, n, raw_stream(stream)) };
    check("cast", status)
}

/// Asks the L2 cache to fetch the first `bytes` bytes of `x`, so that a later kernel on
/// `stream` finds them there: e.g. the next projection's weights, requested just before a
/// short kernel (RoPE, decode attention) that leaves DRAM idle. A hint only: the kernel
/// issues the requests (`cp.async.bulk.prefetch.L2` on sm_90+, `prefetch.global.L2`
/// before) and ends without waiting for them, nothing is written, and lines can be evicted
/// before they are used. Bytes past the last whole 16-byte unit are not requested. H100's
/// L2 holds 50 MB; asking for more than the kernels in between leave room for only evicts
/// earlier lines.
///
/// Any dtype (weights of a quantised layout too). `bytes == 0` launches nothing.
///
/// Errors: [`Error::InvalidArgument`] naming `bytes` when it exceeds `x`'s size.
///
/// ```no_run
/// use fl_kernels::{elementwise, DeviceTensor, Gpu};
/// use half::f16;
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let w = DeviceTensor::<f16>::zeros(s, &[4096, 4096])?;
/// elementwise::prefetch_l2(s, &w, 16 << 20)?; // the first 16 MB of w
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn prefetch_l2<T: DType>(stream: &CudaStream, x: &DeviceTensor<T>, bytes: usize) -> Result<()> {
    if bytes > x.num_bytes() {
        return Err(Error::invalid(
            "bytes",
            format!("{bytes} exceeds the tensor's {} bytes", x.num_bytes()),
        ));
    }
    if bytes == 0 {
        return Ok(());
    }
    let b = as_i64("bytes", bytes)?;
    let (p, _g) = x.ptr(stream);
    // SAFETY: [p, p + bytes) lies inside x's allocation (checked above) and the kernel only
    // issues prefetch requests for it (no access is architecturally visible). Device
    // allocations are 256-byte aligned, as the launcher requires (>= 16).
    let status = unsafe { fl_kernels_sys::fl_prefetch_l2(p as _, b, raw_stream(stream)) };
    check("prefetch_l2", status)
}
