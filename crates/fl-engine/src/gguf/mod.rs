//! GGUF model files, as llama.cpp writes them: the reader, a writer (for tests and tools), the
//! model configuration from metadata and the tensor names of the engine.
//!
//! # The format (v2 and v3; little-endian)
//! ```text
//! "GGUF" | version u32 | tensor_count u64 | metadata_kv_count u64
//! metadata_kv_count x (key: string, value_type u32, value)
//! tensor_count x (name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64)
//! padding to `general.alignment` (default 32) | tensor data
//! ```
//! A string is a u64 byte length and UTF-8 bytes; an array is an element type u32, a u64 count
//! and the elements (arrays may nest). `ne[0]` is the innermost (fastest) dimension: a
//! row-major `[rows, cols]` matrix has `ne = [cols, rows]`, so [`TensorInfo::shape`] reverses
//! it. Offsets are relative to the data section and multiples of the alignment. Tensor bytes
//! are whole blocks of the ggml type ([`GgmlType::block_size`] elements in
//! [`GgmlType::type_size`] bytes) along `ne[0]`; rows of a quantised matrix are therefore
//! whole blocks.
//!
//! # Layout
//! - [`reader`]: [`GgufFile`] (memory-mapped, split files merged) over [`GgufHeader`] (the
//!   parse of one file's bytes, every count and offset checked against the file size before
//!   anything is allocated from it);
//! - [`write`](mod@write): [`write::GgufWriter`], files built in memory (tests, tools);
//! - [`model`]: [`ModelConfig`](crate::config::ModelConfig) from `general.architecture` and its
//!   keys, GGUF -> Hugging Face tensor names, and the Q/K row permutation of llama.cpp's
//!   converter;
//! - [`native`]: how the decoder's projections run on the file's own formats (which tensor
//!   becomes which [`Linear`](crate::linear::Linear), the stacked weights' rule, notices);
//! - [`tokenizer`]: the `tokenizers` Tokenizer from `tokenizer.*` metadata
//!   ([`GgufFile::tokenizer_spec`] fills its [`tokenizer::TokenizerSpec`]).
//!
//! ```no_run
//! use fl_engine::gguf::GgufFile;
//! let f = GgufFile::open("model-Q4_K_M.gguf")?;
//! let cfg = f.model_config()?;
//! let t = f.tensor("blk.0.attn_q.weight")?;
//! println!("{} {:?} {:?}: {} bytes", t.name, t.shape(), t.ggml_type, f.tensor_data(t)?.len());
//! # let _ = cfg;
//! # Ok::<(), fl_engine::gguf::GgufError>(())
//! ```

mod error;
pub mod model;
pub mod native;
pub mod reader;
pub mod tokenizer;
mod types;
mod value;
pub mod write;

#[cfg(test)]
mod tests;

pub use error::{GgufError, Result};
pub use reader::{GgufFile, GgufHeader, TensorInfo, TypeStats};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Deepest nesting of arrays the reader accepts (llama.cpp writes none; the bound keeps a
/// hostile file from exhausting the stack).
pub const MAX_ARRAY_DEPTH: usize = 8;
