//! The crate's one error type.

/// Result alias used by every fallible function of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `fl-sampling`.
///
/// Argument errors are found on the host before anything is launched and name the argument
/// (or the row and the parameter) at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A sampling parameter of one row is out of range.
    #[error("row {row}: sampling parameter `{param}` = {value}: {reason}")]
    Param {
        /// Row (request) index in the batch.
        row: usize,
        /// Name of the parameter (`temperature`, `top_p`, ...).
        param: &'static str,
        /// The value given, as text.
        value: String,
        /// The accepted range.
        reason: &'static str,
    },
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
    /// A kernel launch (or the launcher's own argument check) failed.
    #[error("{op}: CUDA error {code}: {message}")]
    Cuda {
        /// The operation whose launch failed.
        op: &'static str,
        /// The `fl_status` / `cudaError_t` value.
        code: i32,
        /// The launcher's message for it.
        message: String,
    },
    /// An error from `fl-kernels` (allocation, copy, device).
    #[error(transparent)]
    Kernels(#[from] fl_kernels::Error),
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

impl From<fl_kernels::cudarc::driver::DriverError> for Error {
    fn from(e: fl_kernels::cudarc::driver::DriverError) -> Self {
        Error::Kernels(fl_kernels::Error::Driver(e))
    }
}
