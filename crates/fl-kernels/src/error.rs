//! The crate's one error type.

use cudarc::driver::DriverError;

/// Result alias used by every fallible function of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `fl-kernels`.
///
/// Argument errors are detected on the host before anything is launched and name the
/// argument at fault; CUDA errors carry CUDA's own message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor argument has the wrong shape.
    #[error("argument `{arg}`: expected shape {expected}, got {got:?}")]
    Shape {
        /// Name of the argument at fault.
        arg: &'static str,
        /// What was expected, in words or as a shape.
        expected: String,
        /// The shape that was passed.
        got: Vec<usize>,
    },
    /// A scalar or structural argument is out of range or inconsistent.
    #[error("argument `{arg}`: {reason}")]
    InvalidArgument {
        /// Name of the argument at fault.
        arg: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// A size does not fit the kernel's index type.
    #[error("argument `{arg}`: size {value} exceeds the limit {limit}")]
    TooLarge {
        /// Name of the argument at fault.
        arg: &'static str,
        /// The size passed.
        value: usize,
        /// The largest size accepted.
        limit: usize,
    },
    /// A kernel launch (or the launcher's own argument check) failed.
    #[error("{op}: CUDA error {code}: {message}")]
    Cuda {
        /// The operation whose launch failed.
        op: &'static str,
        /// The `fl_status` / `cudaError_t` value.
        code: i32,
        /// CUDA's message for it.
        message: String,
    },
    /// A check done on the device (e.g. a token id outside the vocabulary) failed.
    #[error("{op}: {reason}")]
    DeviceCheck {
        /// The operation whose check failed.
        op: &'static str,
        /// What the device found.
        reason: String,
    },
    /// An error from the CUDA driver API (allocation, copy, context).
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// No usable CUDA GPU (no driver library, no device, or compute capability < 8.0).
    #[error("no usable CUDA GPU: {0}")]
    NoGpu(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(arg: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            arg,
            reason: reason.into(),
        }
    }
}

/// Turns a launcher's `fl_status` into a `Result`.
pub(crate) fn check(op: &'static str, status: fl_kernels_sys::fl_status) -> Result<()> {
    if status == fl_kernels_sys::FL_OK as i32 {
        return Ok(());
    }
    // SAFETY: fl_cuda_error_string accepts any value and returns a static C string.
    let message = unsafe {
        let p = fl_kernels_sys::fl_cuda_error_string(status);
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    Err(Error::Cuda {
        op,
        code: status,
        message,
    })
}
