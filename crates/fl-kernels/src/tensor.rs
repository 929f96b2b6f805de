//! `DeviceTensor<T>`: a device buffer with a row-major shape.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::dtype::DType;
use crate::{Error, Result};

/// A contiguous, row-major tensor in device memory; the element type is in the type.
///
/// Ops check shapes before they launch anything; a wrong shape is an [`Error::Shape`]
/// naming the argument. Creating a tensor allocates on the given stream (stream-ordered);
/// [`to_host`](Self::to_host) is the one call here that waits for the device.
///
/// ```no_run
/// use fl_kernels::{DeviceTensor, Gpu};
/// let gpu = Gpu::new(0)?;
/// let x = DeviceTensor::from_host(gpu.stream(), &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// assert_eq!(x.shape(), &[2, 3]);
/// assert_eq!(x.to_host(gpu.stream())?, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// # Ok::<(), fl_kernels::Error>(())
/// ```
pub struct DeviceTensor<T: DType> {
    buf: CudaSlice<T>,
    shape: Vec<usize>,
}

impl<T: DType> fmt::Debug for DeviceTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceTensor<{}>{:?}", T::NAME, self.shape)
    }
}

fn numel(arg: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::invalid(
                arg,
                format!("shape {shape:?} has more elements than usize holds"),
            )
        })
}

impl<T: DType> DeviceTensor<T> {
    /// Copies `data` to the device with the given shape; `data.len()` must equal the
    /// product of `shape`.
    pub fn from_host(stream: &Arc<CudaStream>, data: &[T], shape: &[usize]) -> Result<Self> {
        let n = numel("shape", shape)?;
        if n != data.len() {
            return Err(Error::invalid(
                "data",
                format!(
                    "{} elements given for shape {shape:?} ({n} elements)",
                    data.len()
                ),
            ));
        }
        let buf = if n == 0 {
            stream.alloc_zeros::<T>(0)?
        } else {
            stream.clone_htod(data)?
        };
        Ok(DeviceTensor {
            buf,
            shape: shape.to_vec(),
        })
    }

    /// A tensor of zero bits (0 for every dtype).
    pub fn zeros(stream: &Arc<CudaStream>, shape: &[usize]) -> Result<Self> {
        let n = numel("shape", shape)?;
        Ok(DeviceTensor {
            buf: stream.alloc_zeros::<T>(n)?,
            shape: shape.to_vec(),
        })
    }

    /// A tensor with every element equal to `value` (e.g. NaN, to poison an output).
    pub fn filled(stream: &Arc<CudaStream>, shape: &[usize], value: T) -> Result<Self> {
        let n = numel("shape", shape)?;
        Self::from_host(stream, &vec![value; n], shape)
    }

    /// Wraps an existing cudarc buffer; its length must equal the product of `shape`.
    pub fn from_slice(buf: CudaSlice<T>, shape: &[usize]) -> Result<Self> {
        let n = numel("shape", shape)?;
        if n != buf.len() {
            return Err(Error::invalid(
                "buf",
                format!(
                    "buffer of {} elements for shape {shape:?} ({n} elements)",
                    buf.len()
                ),
            ));
        }
        Ok(DeviceTensor {
            buf,
            shape: shape.to_vec(),
        })
    }

    /// Copies the tensor to the host. Waits for the stream (this is the sync point).
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Vec<T>> {
        if self.buf.is_empty() {
            return Ok(Vec::new());
        }
        Ok(stream.clone_dtoh(&self.buf)?)
    }

    /// Overwrites the tensor from the host; `data.len()` must equal [`len`](Self::len).
    pub fn copy_from_host(&mut self, stream: &Arc<CudaStream>, data: &[T]) -> Result<()> {
        if data.len() != self.len() {
            return Err(Error::invalid(
                "data",
                format!(
                    "{} elements given for a tensor of {}",
                    data.len(),
                    self.len()
                ),
            ));
        }
        if !data.is_empty() {
            stream.memcpy_htod(data, &mut self.buf)?;
        }
        Ok(())
    }

    /// The same data under another shape with the same number of elements.
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        let n = numel("shape", shape)?;
        if n != self.len() {
            return Err(Error::Shape {
                arg: "shape",
                expected: format!("{} elements", self.len()),
                got: shape.to_vec(),
            });
        }
        Ok(DeviceTensor {
            buf: self.buf,
            shape: shape.to_vec(),
        })
    }

    /// Changes the shape in place to another with the same number of elements (no copy):
    /// the `&mut` form of [`reshape`](Self::reshape), for buffers owned by a struct, e.g. a
    /// GEMM output `[tokens, heads * head_dim]` viewed as `[tokens, heads, head_dim]`.
    ///
    /// Errors: [`Error::Shape`] naming `shape` when the element counts differ (the tensor
    /// is left unchanged).
    pub fn set_shape(&mut self, shape: &[usize]) -> Result<()> {
        let n = numel("shape", shape)?;
        if n != self.len() {
            return Err(Error::Shape {
                arg: "shape",
                expected: format!("{} elements", self.len()),
                got: shape.to_vec(),
            });
        }
        self.shape = shape.to_vec();
        Ok(())
    }

    /// Row-major shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }

    /// The underlying cudarc buffer.
    pub fn as_slice(&self) -> &CudaSlice<T> {
        &self.buf
    }

    /// The underlying cudarc buffer, mutably.
    pub fn as_slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.buf
    }

    /// Gives the buffer back.
    pub fn into_slice(self) -> CudaSlice<T> {
        self.buf
    }

    /// Raw device pointer for reading on `stream`; keep the guard alive until the launch
    /// has been queued.
    pub(crate) fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.buf.device_ptr(stream)
    }

    /// Raw device pointer for writing on `stream`.
    pub(crate) fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.buf.device_ptr_mut(stream)
    }
}

/// [`DeviceTensor::ptr`] of an optional tensor: `(0, None)` (a NULL for the launcher) when
/// absent.
pub(crate) fn opt_ptr<'a, T: DType>(
    t: Option<&'a DeviceTensor<T>>,
    stream: &'a CudaStream,
) -> (u64, Option<SyncOnDrop<'a>>) {
    match t {
        Some(t) => {
            let (p, g) = t.ptr(stream);
            (p, Some(g))
        }
        None => (0, None),
    }
}

/// Checks that `t` has exactly `expected` as its shape.
pub(crate) fn expect_shape<T: DType>(
    arg: &'static str,
    t: &DeviceTensor<T>,
    expected: &[usize],
) -> Result<()> {
    if t.shape() != expected {
        return Err(Error::Shape {
            arg,
            expected: format!("{expected:?}"),
            got: t.shape().to_vec(),
        });
    }
    Ok(())
}

/// The raw stream handle a launcher takes.
pub(crate) fn raw_stream(stream: &CudaStream) -> fl_kernels_sys::fl_stream {
    stream.cu_stream() as fl_kernels_sys::fl_stream
}

/// A length as the kernels' `int64_t`.
pub(crate) fn as_i64(arg: &'static str, n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::TooLarge {
        arg,
        value: n,
        limit: i64::MAX as usize,
    })
}

/// `n` as the `i32` a launcher takes. Errors: [`Error::TooLarge`] naming `arg` past `i32::MAX`.
pub(crate) fn as_i32(arg: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::TooLarge {
        arg,
        value: n,
        limit: i32::MAX as usize,
    })
}

/// A normalisation epsilon: [`Error::InvalidArgument`] naming `eps` unless finite and `> 0`.
pub(crate) fn check_eps(eps: f32) -> Result<()> {
    if eps > 0.0 && eps.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(
            "eps",
            format!("must be finite and > 0, got {eps}"),
        ))
    }
}

/// Reads a one-`i32` device error flag of OR-ed bits (waits for `stream`): `Ok` when it is 0,
/// else [`Error::DeviceCheck`] for `op` whose reason lists the description of every set bit
/// in `bits`, joined by ", ", then `"; "` and `consequence` (or the raw value when no known
/// bit is set). Shared by the ops that report through such a flag (rope, kv_cache).
pub(crate) fn check_flag_bits(
    stream: &Arc<CudaStream>,
    err_flag: &DeviceTensor<i32>,
    op: &'static str,
    bits: &[(i32, &str)],
    consequence: &str,
) -> Result<()> {
    expect_shape("err_flag", err_flag, &[1])?;
    let v = err_flag.to_host(stream)?[0];
    if v == 0 {
        return Ok(());
    }
    let what: Vec<&str> = bits
        .iter()
        .filter(|(b, _)| v & b != 0)
        .map(|(_, d)| *d)
        .collect();
    let reason = if what.is_empty() {
        format!("error flag {v:#x}")
    } else {
        format!("{}; {consequence}", what.join(", "))
    };
    Err(Error::DeviceCheck { op, reason })
}
