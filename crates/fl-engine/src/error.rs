//! The engine's error type: every layer's error, plus the engine's own checks.

use std::path::PathBuf;

/// Anything that can go wrong running a model. Each variant says what was at fault.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A kernel rejected its arguments or CUDA failed.
    #[error(transparent)]
    Kernels(#[from] fl_kernels::Error),
    /// cuBLASLt or a GEMM argument.
    #[error(transparent)]
    Blas(#[from] fl_blas::Error),
    /// Sampling.
    #[error(transparent)]
    Sampling(#[from] fl_sampling::Error),
    /// The scheduler refused a step or an update.
    #[error(transparent)]
    Scheduler(#[from] crate::scheduler::SchedulerError),
    /// A request the scheduler refuses (the message names the field).
    #[error(transparent)]
    Request(#[from] crate::scheduler::RequestError),
    /// `config.json`.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A GGUF file's error (header, metadata, tensor), naming the key or tensor.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// A request the engine refuses before doing any work (prompt longer than the context,
    /// batch that does not fit in memory, empty prompt...), naming the argument.
    #[error("{arg}: {reason}")]
    Invalid {
        /// The argument or option at fault (e.g. `--prompt-len`).
        arg: &'static str,
        /// Why.
        reason: String,
    },
    /// The tokenizer file could not be loaded or used.
    #[error("tokenizer {path}: {detail}")]
    Tokenizer {
        /// `tokenizer.json`.
        path: PathBuf,
        /// What the tokenizers crate said.
        detail: String,
    },
    /// An NCCL call of a tensor-parallel group failed (or its communicator was aborted
    /// because another rank failed).
    #[error("NCCL {op}: {detail}")]
    Nccl {
        /// The call (`init`, `all_reduce`, `all_gather`).
        op: &'static str,
        /// What NCCL said.
        detail: String,
    },
    /// One rank of a tensor-parallel group failed; the whole group was stopped.
    #[error("tensor-parallel rank {rank} (GPU {device}): {source}")]
    Rank {
        /// The rank that failed first.
        rank: usize,
        /// Its device ordinal.
        device: usize,
        /// Its error.
        source: Box<EngineError>,
    },
    /// A file the engine reads or writes (other than the checkpoint).
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

impl EngineError {
    /// An [`EngineError::Invalid`] naming `arg`.
    pub fn invalid(arg: &'static str, reason: impl Into<String>) -> Self {
        EngineError::Invalid {
            arg,
            reason: reason.into(),
        }
    }
}

impl From<fl_kernels::cudarc::driver::DriverError> for EngineError {
    fn from(e: fl_kernels::cudarc::driver::DriverError) -> Self {
        EngineError::Kernels(e.into())
    }
}

/// `Result` with [`EngineError`].
pub type Result<T> = std::result::Result<T, EngineError>;
