//! Shape checks that name the argument in this crate's [`Error`] (crate-internal), and the
//! one place a launch result of the kernel layer (`fl_kernels::sampling`) comes back.

use fl_kernels::{DType, DeviceTensor};

use crate::{Error, Result};

/// A launch through `fl_kernels::sampling`: its CUDA error becomes this crate's
/// [`Error::Cuda`] for `op`; anything else (already ruled out by this crate's checks) is
/// passed on as [`Error::Kernels`].
pub(crate) fn launched(op: &'static str, r: fl_kernels::Result<()>) -> Result<()> {
    r.map_err(|e| match e {
        fl_kernels::Error::Cuda { code, message, .. } => Error::Cuda { op, code, message },
        e => Error::Kernels(e),
    })
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
