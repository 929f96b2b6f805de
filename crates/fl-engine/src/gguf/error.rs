//! The error of the GGUF module.

use std::path::PathBuf;

/// Why a GGUF file could not be read, or its metadata turned into a model. Every variant
/// names the key, tensor or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An error inside one file (of a split model, say), with its path.
    #[error("{path}: {source}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<GgufError>,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found.
        found: Vec<u8>,
    },
    /// A version other than 2 or 3 (v1 used 32-bit counts and is not read).
    #[error("unsupported GGUF version {found} (supported: 2, 3)")]
    BadVersion {
        /// The version found.
        found: u32,
    },
    /// The file ends inside a header field.
    #[error("truncated file: {what} needs {need} bytes at offset {offset}, the file has {len}")]
    Truncated {
        /// The field being read (names the key or tensor).
        what: String,
        /// Where it starts.
        offset: u64,
        /// Bytes it needs.
        need: u64,
        /// Length of the file.
        len: u64,
    },
    /// A count that the rest of the file cannot hold (checked before allocating).
    #[error("{what}: count {count} cannot fit in the {remaining} bytes left in the file")]
    TooMany {
        /// What is counted (names the key or section).
        what: String,
        /// The count read.
        count: u64,
        /// Bytes left after the count.
        remaining: u64,
    },
    /// A metadata value type id outside the GGUF table.
    #[error("metadata `{key}`: unknown value type {id}")]
    BadValueType {
        /// The key.
        key: String,
        /// The type id.
        id: u32,
    },
    /// Arrays nested deeper than [`super::MAX_ARRAY_DEPTH`].
    #[error("metadata `{key}`: arrays nested deeper than {max}")]
    TooDeep {
        /// The key.
        key: String,
        /// The limit.
        max: usize,
    },
    /// A string that is not UTF-8.
    #[error("{what}: string is not valid UTF-8")]
    Utf8 {
        /// The key or tensor whose string it is.
        what: String,
    },
    /// The same metadata key twice.
    #[error("metadata key `{key}` appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// The same tensor name twice (in one file or across the parts of a split model).
    #[error("tensor `{tensor}` appears twice")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
    },
    /// A metadata value of the wrong type.
    #[error("metadata `{key}` must be {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// What was expected.
        expected: &'static str,
        /// The type (or value) found.
        found: String,
    },
    /// A required metadata key is absent.
    #[error("missing required metadata key `{key}`")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value that is well-typed but impossible.
    #[error("metadata `{key}` = {value}: {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A ggml type id this reader does not know.
    #[error("tensor `{tensor}`: unknown ggml type {id}")]
    UnknownType {
        /// The tensor.
        tensor: String,
        /// The type id.
        id: u32,
    },
    /// A tensor shape that cannot be stored (too many dims, overflow, partial blocks).
    #[error("tensor `{tensor}`: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor whose bytes reach past the end of the data section.
    #[error(
        "tensor `{tensor}`: bytes {offset}..{offset}+{size} are outside the data section ({data_len} bytes)"
    )]
    OutOfFile {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// Its size in bytes.
        size: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor `{tensor}`: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The tensor.
        tensor: String,
        /// Its offset.
        offset: u64,
        /// `general.alignment`.
        alignment: u64,
    },
    /// Two tensors share bytes.
    #[error("tensor `{tensor}` overlaps tensor `{other}`")]
    Overlap {
        /// The later tensor.
        tensor: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// A split model whose parts do not agree.
    #[error("split model {path}: {reason}")]
    Split {
        /// The file named by the caller.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor that the model needs is absent.
    #[error("missing tensor `{tensor}`")]
    MissingTensor {
        /// The tensor.
        tensor: String,
    },
    /// A tensor whose shape or type does not match the configuration.
    #[error("tensor `{tensor}`: {reason}")]
    TensorMismatch {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A feature of the file that the engine does not implement.
    #[error("unsupported: {what}: {reason}")]
    Unsupported {
        /// The key or tensor.
        what: String,
        /// Why.
        reason: String,
    },
    /// The configuration built from the metadata failed [`crate::config::ModelConfig::validate`].
    #[error("GGUF metadata gives an invalid model config: {0}")]
    Config(#[from] crate::config::ConfigError),
}

/// Shorthand for results of this module.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
