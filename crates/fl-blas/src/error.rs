//! The crate's one error type.

use cudarc::cublaslt::sys::cublasStatus_t;
use cudarc::driver::DriverError;

/// Result alias used by every fallible function of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `fl-blas`.
///
/// Argument errors are detected on the host before anything is queued and name the
/// argument at fault; cuBLASLt failures carry the status name (`CUBLAS_STATUS_...`).
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
    /// A size does not fit cuBLASLt's index types.
    #[error("argument `{arg}`: size {value} exceeds the limit {limit}")]
    TooLarge {
        /// Name of the argument at fault.
        arg: &'static str,
        /// The size passed.
        value: usize,
        /// The largest size accepted.
        limit: usize,
    },
    /// A cuBLASLt call returned a status other than `CUBLAS_STATUS_SUCCESS`.
    #[error("{op}: cuBLASLt returned {status}")]
    Cublas {
        /// The cuBLASLt function (or step) that failed.
        op: &'static str,
        /// The status name, e.g. `CUBLAS_STATUS_NOT_SUPPORTED`.
        status: String,
    },
    /// cuBLASLt has no algorithm for this problem (heuristic returned none).
    #[error("no cuBLASLt algorithm for {0}")]
    NoAlgorithm(String),
    /// The cuBLASLt library could not be loaded.
    #[error("cuBLASLt library (libcublasLt.so) not found")]
    NoCublasLt,
    /// Reading or writing an algorithm-cache file failed.
    #[error("algorithm cache `{path}`: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An error from `fl-kernels` (tensor allocation, copies, GPU discovery).
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

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        Error::Kernels(fl_kernels::Error::Driver(e))
    }
}

/// The name of a cuBLAS status (`CUBLAS_STATUS_...`), without calling into the library.
pub(crate) fn status_name(status: cublasStatus_t) -> String {
    format!("{status:?}")
}

/// Turns a cuBLASLt status into a `Result`, naming the call.
pub(crate) fn check(op: &'static str, status: cublasStatus_t) -> Result<()> {
    if status == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cublas {
            op,
            status: status_name(status),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cublas_errors_carry_the_status_name() {
        assert!(check("op", cublasStatus_t::CUBLAS_STATUS_SUCCESS).is_ok());
        let e = check(
            "cublasLtMatmul",
            cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cublasLtMatmul: cuBLASLt returned CUBLAS_STATUS_NOT_SUPPORTED"
        );
    }

    #[test]
    fn argument_errors_name_the_argument() {
        let e = Error::invalid("max_candidates", "must be at least 1");
        assert_eq!(
            e.to_string(),
            "argument `max_candidates`: must be at least 1"
        );
    }
}
