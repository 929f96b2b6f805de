//! Softmax over the last dimension with temperature: [`softmax`] (output in the input's
//! dtype) and [`softmax_f32`] (f32 output, e.g. bf16 logits -> f32 probabilities for a
//! sampler), with an optional reusable [`SoftmaxWorkspace`].
//!
//! `y[r, i] = exp((x[r, i] - m_r) / t) / sum_j exp((x[r, j] - m_r) / t)`, `m_r = max_j x[r, j]`,
//! computed in f32 (max-subtracted, so no overflow) and rounded once to the output type.
//!
//! Special values, per row: a row of only `-inf` (fully masked) gives all zeros (not NaN);
//! `-inf` elements among finite ones give 0; any NaN or `+inf` in a row makes the whole row
//! NaN.
//!
//! How it runs: rows of up to 32768 (f16/bf16) or 16384 (f32) elements whose length is a
//! multiple of the 16-byte vector width are read once into registers, one block per row,
//! and written once. On Hopper (sm_90+), longer such rows of up to 262144 (f16/bf16) or
//! 131072 (f32) elements (e.g. 2048 x 128256 bf16 logits) are spread over a thread-block
//! cluster of 8 blocks per row, each holding its eighth of the row in registers; the blocks
//! exchange their (max, sum) through distributed shared memory, so the row is read once and
//! written once whatever the number of rows. Otherwise, long rows, when there are fewer than
//! 128 of them, are split over several blocks (chunks sized to give ~4 blocks per SM): a
//! first kernel writes each chunk's (max, sum) to the workspace, a second merges them and
//! writes the chunk, re-reading `x` from L2. Everything else takes one block per row with an
//! online (max, sum) pass then a write pass.
//!
//! Exponentials use the GPU's `ex2.approx.ftz` (relative error <= 2^-22, as `exp2f`):
//! probabilities below 2^-126 (1.2e-38) come out as 0 rather than as f32/bf16 denormals.
//!
//! CPU reference: [`crate::reference::softmax`](mod@crate::reference::softmax).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use crate::dtype::FloatDType;
use crate::error::check;
use crate::tensor::{as_i64, expect_shape, raw_stream};
use crate::{DeviceTensor, Error, Result};

/// Device scratch for splitting long rows over several blocks; keep one and reuse it so that
/// calls allocate nothing (it grows only when a call needs more than it holds).
///
/// ```no_run
/// use fl_kernels::softmax::SoftmaxWorkspace;
/// let gpu = fl_kernels::Gpu::new(0)?;
/// let mut ws = SoftmaxWorkspace::new();
/// ws.reserve(gpu.stream(), 8, 128_256)?; // allocate up front (e.g. before graph capture)
/// # Ok::<(), fl_kernels::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct SoftmaxWorkspace {
    buf: Option<CudaSlice<u8>>,
}

impl SoftmaxWorkspace {
    /// An empty workspace (allocates nothing until it is needed).
    pub fn new() -> Self {
        Self { buf: None }
    }

    /// Bytes a softmax over `[rows, n]` can use: nonzero only when `rows < 128` and
    /// `n > 4096`, then `rows * ceil(n / 2048) * 8` (the same on every device; the cluster
    /// path of sm_90+ GPUs uses none of it).
    pub fn bytes_needed(rows: usize, n: usize) -> usize {
        let (Ok(r), Ok(c)) = (i64::try_from(rows), i64::try_from(n)) else {
            return 0; // too large for the kernels anyway; the op reports it
        };
        // SAFETY: a pure function of two integers.
        let b = unsafe { fl_kernels_sys::fl_softmax_workspace_size(r, c) };
        usize::try_from(b).unwrap_or(0)
    }

    /// Bytes currently held.
    pub fn capacity_bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// Makes sure the workspace holds [`bytes_needed`](Self::bytes_needed)`(rows, n)` bytes,
    /// allocating on `stream` if it does not.
    pub fn reserve(&mut self, stream: &Arc<CudaStream>, rows: usize, n: usize) -> Result<()> {
        let need = Self::bytes_needed(rows, n);
        if need > self.capacity_bytes() {
            self.buf = None; // freed (stream-ordered) before the new allocation
            self.buf = Some(stream.alloc_zeros::<u8>(need)?);
        }
        Ok(())
    }
}

/// `(rows, n)` of `x` viewed as `[rows, n]`, `n` the last dimension (>= 1).
fn rows_n<T: FloatDType>(x: &DeviceTensor<T>) -> Result<(usize, usize)> {
    match x.shape().split_last() {
        Some((&n, rest)) if n >= 1 => Ok((rest.iter().product(), n)),
        _ => Err(Error::Shape {
            arg: "x",
            expected: "[..., n] with rank >= 1 and n >= 1".into(),
            got: x.shape().to_vec(),
        }),
    }
}

/// Which kernels run rows too long for the register path (for tests: both give the same
/// result up to f32 summation order). [`LongPath::Auto`] is what [`softmax`] and
/// [`softmax_f32`] do: the cluster path on sm_90+ where it applies, else split or generic.
/// [`LongPath::Portable`] skips the cluster path, which is what runs before sm_90, so tests
/// reach both on one Hopper GPU.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongPath {
    /// The automatic choice: cluster (sm_90+), split or generic.
    Auto,
    /// Split (few rows, with a workspace) or generic: what runs before sm_90.
    Portable,
}

impl LongPath {
    /// Both paths, for tests that cover each.
    pub const ALL: [LongPath; 2] = [LongPath::Auto, LongPath::Portable];

    fn to_ffi(self) -> i32 {
        (match self {
            LongPath::Auto => fl_kernels_sys::FL_SOFTMAX_AUTO,
            LongPath::Portable => fl_kernels_sys::FL_SOFTMAX_PORTABLE,
        }) as i32
    }
}

/// [`softmax`] / [`softmax_f32`] with the long-row path forced (`O` is `T` or `f32`; any
/// other output dtype is [`Error`] from the launcher). For tests and benchmarks.
#[doc(hidden)]
pub fn softmax_with_path<T: FloatDType, O: FloatDType>(
    stream: &Arc<CudaStream>,
    x: &DeviceTensor<T>,
    temperature: f32,
    out: &mut DeviceTensor<O>,
    workspace: Option<&mut SoftmaxWorkspace>,
    path: LongPath,
) -> Result<()> {
    launch("softmax", stream, x, temperature, out, workspace, path)
}

fn launch<T: FloatDType, O: FloatDType>(
    op: &'static str,
    stream: &Arc<CudaStream>,
    x: &DeviceTensor<T>,
    temperature: f32,
    out: &mut DeviceTensor<O>,
    workspace: Option<&mut SoftmaxWorkspace>,
    path: LongPath,
) -> Result<()> {
    let (rows, n) = rows_n(x)?;
    expect_shape("out", out, x.shape())?;
    if !(temperature.is_finite() && temperature >= f32::MIN_POSITIVE) {
        return Err(Error::invalid(
            "temperature",
            format!(
                "must be finite and >= {:e} (a normal positive f32), got {temperature:e}",
                f32::MIN_POSITIVE
            ),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let (rows_i, n_i) = (as_i64("x", rows)?, as_i64("x", n)?);
    let mut scratch;
    let ws = match workspace {
        Some(w) => {
            w.reserve(stream, rows, n)?;
            w
        }
        None => {
            // A temporary (freed stream-ordered after the launch); pass a workspace to reuse one.
            scratch = SoftmaxWorkspace::new();
            scratch.reserve(stream, rows, n)?;
            &mut scratch
        }
    };
    let ws_bytes = as_i64("workspace", ws.capacity_bytes())?;
    let ws_guard = ws.buf.as_mut().map(|b| b.device_ptr_mut(stream));
    let pws = ws_guard.as_ref().map_or(0, |(p, _)| *p);
    let (px, _gx) = x.ptr(stream);
    let (py, _gy) = out.ptr_mut(stream);
    // SAFETY: x and out hold rows * n elements of T and O (shapes checked above); the
    // workspace holds ws_bytes bytes (0 and null when none is needed) and is borrowed
    // mutably, so nothing else uses it while the launch is queued; every guard outlives it.
    let status = unsafe {
        fl_kernels_sys::fl_softmax_path(
            T::ID,
            px as _,
            O::ID,
            py as _,
            rows_i,
            n_i,
            temperature,
            pws as _,
            ws_bytes,
            path.to_ffi(),
            raw_stream(stream),
        )
    };
    check(op, status)
}

/// Softmax over the last dimension with temperature, output in the input's dtype:
/// `out = softmax(x / temperature)` along the last axis.
///
/// Shapes: `x` and `out` `[..., n]` (the same shape), `n >= 1`.
/// Dtypes: `f32`, `f16`, `bf16` (computed in f32). `temperature = 1.0` is plain softmax.
///
/// `workspace`: scratch for few long rows (see [`SoftmaxWorkspace`]); `None` allocates a
/// temporary one when the shape needs it (rows < 128 and n > 4096; a few KB).
///
/// Errors: [`Error::Shape`] naming `x` (rank 0 or `n == 0`) or `out`;
/// [`Error::InvalidArgument`] naming `temperature` unless it is finite and
/// `>= f32::MIN_POSITIVE`.
///
/// ```no_run
/// use fl_kernels::{softmax, DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let x = DeviceTensor::from_host(s, &[1.0f32, 2.0, 3.0, f32::NEG_INFINITY], &[1, 4])?;
/// let mut y = DeviceTensor::zeros(s, &[1, 4])?;
/// softmax::softmax(s, &x, 1.0, &mut y, None)?;
/// let p = y.to_host(s)?;
/// assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6 && p[3] == 0.0);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn softmax<T: FloatDType>(
    stream: &Arc<CudaStream>,
    x: &DeviceTensor<T>,
    temperature: f32,
    out: &mut DeviceTensor<T>,
    workspace: Option<&mut SoftmaxWorkspace>,
) -> Result<()> {
    launch(
        "softmax",
        stream,
        x,
        temperature,
        out,
        workspace,
        LongPath::Auto,
    )
}

/// Softmax as [`softmax`], with f32 output whatever the input dtype (bf16 or f16 logits ->
/// f32 probabilities, as samplers want them).
///
/// Shapes: `x` and `out` `[..., n]` (the same shape). Dtypes: `x` `f32`, `f16` or `bf16`.
///
/// Errors: as [`softmax`].
///
/// ```no_run
/// use fl_kernels::{softmax, DeviceTensor, Gpu};
/// use fl_kernels::softmax::SoftmaxWorkspace;
/// use half::bf16;
/// let gpu = Gpu::new(0)?;
/// let s = gpu.stream();
/// let vocab = 128_256;
/// let logits = DeviceTensor::from_host(s, &vec![bf16::from_f32(0.1); vocab], &[1, vocab])?;
/// let mut probs = DeviceTensor::<f32>::zeros(s, &[1, vocab])?;
/// let mut ws = SoftmaxWorkspace::new();
/// softmax::softmax_f32(s, &logits, 0.7, &mut probs, Some(&mut ws))?;
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub fn softmax_f32<T: FloatDType>(
    stream: &Arc<CudaStream>,
    x: &DeviceTensor<T>,
    temperature: f32,
    out: &mut DeviceTensor<f32>,
    workspace: Option<&mut SoftmaxWorkspace>,
) -> Result<()> {
    launch(
        "softmax_f32",
        stream,
        x,
        temperature,
        out,
        workspace,
        LongPath::Auto,
    )
}
