//! Text in and out: a Hugging Face `tokenizer.json` through the `tokenizers` crate.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    /// The tokenizer of a model directory: `Ok(None)` when it has no `tokenizer.json`
    /// (then token ids go in and out instead of text).
    ///
    /// Errors: [`EngineError::Tokenizer`] when the file exists but cannot be parsed.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        let path = dir.as_ref().join("tokenizer.json");
        if !path.is_file() {
            return Ok(None);
        }
        Self::from_file(&path).map(Some)
    }

    /// Loads `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| EngineError::Tokenizer {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// Wraps a tokenizer built elsewhere (e.g. from a GGUF file's metadata, named by `origin`
    /// in errors).
    pub fn from_tokenizers(inner: tokenizers::Tokenizer, origin: PathBuf) -> Self {
        Tokenizer {
            inner,
            path: origin,
        }
    }

    /// The `tokenizers` tokenizer inside (e.g. to clone it with other truncation settings).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The file it was loaded from (or the origin given to [`Tokenizer::from_tokenizers`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> EngineError {
        EngineError::Tokenizer {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// Token ids of `text`, with the tokenizer's special tokens (e.g. BOS) when
    /// `add_special` (what transformers does by default).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| self.err(e))
    }
}
