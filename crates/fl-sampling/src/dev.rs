//! Small helpers around raw device pointers and shape checks (crate-internal).

use fl_kernels::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use fl_kernels::{DType, DeviceTensor};

use crate::{Error, Result};

/// The raw stream handle a launcher takes.
pub(crate) fn raw_stream(stream: &CudaStream) -> fl_kernels_sys::fl_stream {
    stream.cu_stream() as fl_kernels_sys::fl_stream
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

/// `[rows, cols]` of a 2-D tensor.
pub(crate) fn matrix<T: DType>(
    arg: &'static str,
    t: &DeviceTensor<T>,
    what: &str,
) -> Result<(usize, usize)> {
    match *t.shape() {
        [r, c] => Ok((r, c)),
        _ => Err(Error::Shape {
            arg,
            expected: what.to_string(),
            got: t.shape().to_vec(),
        }),
    }
}

/// A length as the kernels' `int64_t`.
pub(crate) fn as_i64(arg: &'static str, n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::invalid(arg, format!("size {n} exceeds i64")))
}

/// Device pointer for reading, with the guard to keep until the launch is queued.
pub(crate) fn ptr<'a, T: DType>(
    t: &'a DeviceTensor<T>,
    s: &'a CudaStream,
) -> (u64, SyncOnDrop<'a>) {
    t.as_slice().device_ptr(s)
}

/// Device pointer for writing.
pub(crate) fn ptr_mut<'a, T: DType>(
    t: &'a mut DeviceTensor<T>,
    s: &'a CudaStream,
) -> (u64, SyncOnDrop<'a>) {
    t.as_slice_mut().device_ptr_mut(s)
}

/// Device pointer of an optional tensor (0, i.e. NULL, when absent).
pub(crate) fn opt_ptr<'a, T: DType>(
    t: Option<&'a DeviceTensor<T>>,
    s: &'a CudaStream,
) -> (u64, Option<SyncOnDrop<'a>>) {
    match t {
        Some(t) => {
            let (p, g) = ptr(t, s);
            (p, Some(g))
        }
        None => (0, None),
    }
}
